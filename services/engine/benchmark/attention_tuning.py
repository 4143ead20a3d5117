"""Tile / split sweeps of the paged MLA split kernel on a GPU (issue 12 tuning), one compact table.

Each variant is a ``MlaKernelConfig`` (key tile, warps, pipeline stages, heads-minor or heads-major
matrix shape); each point a (format, mode, batch, context, splits). Kernels are compiled first in
parallel worker processes on small inputs with the same specialisation (same strides and split
counts), so the timed process only loads them from Triton's cache. Timings: ``do_bench`` medians.

    python -m services.engine.benchmark.attention_tuning --out /tmp/tune.json

``--splits``: the default tile's dense bf16-row decode at batch 1 for each split count (to tune
``default_num_splits``); ``--compare MODULE``: a before / after table against another module's
``paged_mla_decode``. The per-op rows at default settings are ``baton bench kernels --ops mla``.
"""

import argparse
import importlib
import json
import multiprocessing as mp
import time

import torch

from kernels.mla.paged_triton import MlaKernelConfig, _launch_mla, paged_mla_decode
from services.engine.benchmark.attention_kernels import AttentionShapes, _Pool
from services.engine.benchmark.hardware import copy_bandwidth
from services.engine.benchmark.timing import device_us, graph_us

VARIANTS = {
    "hm_n64_w8_s2": MlaKernelConfig(64, 8, 2, True),
    "hm_n64_w4_s2": MlaKernelConfig(64, 4, 2, True),
    "hd_n64_w8_s2": MlaKernelConfig(64, 8, 2, False),
    "hd_n32_w8_s2": MlaKernelConfig(32, 8, 2, False),
    "hd_n32_w8_s3": MlaKernelConfig(32, 8, 3, False),
}
FP8_ONLY: set[str] = set()  # variants that differ from a twin only on FP8 rows
SPLITS = {  # (batch, context) -> split counts to try
    (1, 8192): (32, 64, 128),
    (1, 32768): (64, 132, 264),
    (1, 131072): (132, 264, 528),
    (32, 8192): (4, 8, 16),
    (32, 32768): (4, 8, 16),
    (32, 131072): (8, 16, 32),
}
SPARSE_SPLITS = {1: (8, 16, 32), 32: (1, 2, 4, 8)}


def _inputs(shapes, kv_format, context, batch, device, pool=None):
    blocks = -(-context // shapes.block_size)
    pool = pool or _Pool(shapes, batch * blocks, kv_format, device)
    tables = torch.randperm(batch * blocks, device=device).to(torch.int32).view(batch, blocks)
    seq = torch.arange(batch, dtype=torch.int32, device=device)
    pos = torch.full((batch,), context - 1, dtype=torch.int32, device=device)
    q_lat = torch.randn(batch, shapes.heads, shapes.kv_lora_rank, device=device).to(torch.bfloat16) * 0.05
    q_rope = torch.randn(batch, shapes.heads, shapes.rope_dim, device=device).to(torch.bfloat16) * 0.05
    topk = torch.rand(batch, context, device=device).argsort(dim=1)[:, : shapes.topk].to(torch.int32)
    return pool, (q_lat, q_rope, pool.latent, pool.rope, tables, seq, pos), topk


def _points(kv_formats):
    for fmt in kv_formats:
        for (batch, context), splits in SPLITS.items():
            for count in splits:
                yield fmt, "dense", batch, context, count
        for batch, splits in SPARSE_SPLITS.items():
            for count in splits:
                yield fmt, "sparse", batch, 32768, count


def _warm(job):
    """Compile one variant for every point's specialisation on small inputs (a worker process)."""
    name, kv_formats = job
    torch.cuda.set_device(0)
    shapes, device = AttentionShapes(), torch.device("cuda", 0)
    config = VARIANTS[name]
    errors = []
    for fmt in kv_formats:
        pool, args, topk = _inputs(shapes, fmt, 8192, 2, device)
        for _, mode, _, _, count in {p for p in _points([fmt])}:
            try:
                _launch_mla(*args, topk if mode == "sparse" else None, 0.07, 8192, count, config)
            except Exception as exc:  # noqa: BLE001 - report and go on: one bad variant must not stop the sweep
                errors.append(f"{name} {fmt} {mode} {count}: {type(exc).__name__}: {str(exc)[:200]}")
    torch.cuda.synchronize()
    return errors


def warm(kv_formats, workers):
    t0 = time.time()
    ctx = mp.get_context("spawn")
    jobs = [(name, (fmt,)) for name in VARIANTS for fmt in kv_formats if fmt == "fp8" or name not in FP8_ONLY]
    with ctx.Pool(min(workers, len(jobs))) as pool:
        errors = sum(pool.map(_warm, jobs), [])
    print(f"compiled {len(jobs)} variant x format jobs in {time.time() - t0:.0f} s; errors: {len(errors)}")
    for e in errors:
        print("  ", e, flush=True)


def run(kv_formats, out_path):
    device = torch.device("cuda", 0)
    shapes = AttentionShapes()
    copy_bw = copy_bandwidth(str(device))
    rows = []
    cache = {}
    for fmt, mode, batch, context, count in _points(kv_formats):
        key = (fmt, batch, 32768 if mode == "sparse" else context)
        if key not in cache:
            cache.clear()
            torch.cuda.empty_cache()
            cache[key] = _inputs(shapes, fmt, key[2], batch, device)
        pool, args, topk = cache[key]
        keys = shapes.topk if mode == "sparse" else context
        nbytes = batch * keys * (pool.row_bytes + (4 if mode == "sparse" else 0))
        ref = None
        for name, config in VARIANTS.items():
            if fmt != "fp8" and name in FP8_ONLY:
                continue
            sel = topk if mode == "sparse" else None
            try:
                out, _ = _launch_mla(*args, sel, 0.07, context, count, config)
            except Exception:  # noqa: BLE001
                continue
            if ref is None:
                ref = out.float()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            call = lambda a=args, s=sel, n=context, k=count, c=config: _launch_mla(*a, s, 0.07, n, k, c)  # noqa: E731
            us = device_us(call)
            rows.append(
                dict(
                    fmt=fmt,
                    mode=mode,
                    batch=batch,
                    context=context,
                    splits=count,
                    variant=name,
                    us=us,
                    gbps=nbytes / us / 1e3,
                    of_copy=nbytes / us / 1e3 / (copy_bw / 1e9),
                    err=err,
                )
            )
            print(
                f"{fmt:>4} {mode:>6} B{batch:<3} N{context:<7} s{count:<4} {name:<14} {us:9.1f} us "
                f"{nbytes / us / 1e3:7.0f} GB/s {rows[-1]['of_copy']:5.2f} err {err:.1e}",
                flush=True,
            )
    with open(out_path, "w") as f:
        json.dump(dict(copy_bw=copy_bw, rows=rows), f)
    print(f"\ncopy bandwidth {copy_bw / 1e9:.0f} GB/s; best per point:")
    best = {}
    for r in rows:
        k = (r["fmt"], r["mode"], r["batch"], r["context"])
        if k not in best or r["us"] < best[k]["us"]:
            best[k] = r
    for r in best.values():
        print(
            f"{r['fmt']:>4} {r['mode']:>6} B{r['batch']:<3} N{r['context']:<7} s{r['splits']:<4} "
            f"{r['variant']:<14} {r['us']:9.1f} us {r['gbps']:7.0f} GB/s {r['of_copy']:5.2f}"
        )


def _warm_decode(job) -> list[str]:
    """Compile one (module, format)'s default kernels for the split-count specialisations the
    comparison meets (direct, a count divisible by 16 or not), dense, sparse and prefill-shaped."""
    module, fmt = job
    fn = importlib.import_module(module).paged_mla_decode
    torch.cuda.set_device(0)
    _, args, topk = _inputs(AttentionShapes(), fmt, 8192, 2, torch.device("cuda", 0))
    errors = []
    for sel in (None, topk):
        for count in (None, 1, 5, 9, 16, 132):
            try:
                fn(*args, sel, 0.07, 8192, num_splits=count)
            except Exception as exc:  # noqa: BLE001 - report and go on
                errors.append(f"{module} {fmt} {count}: {type(exc).__name__}: {str(exc)[:200]}")
    torch.cuda.synchronize()
    return errors


def warm_compare(baseline_module: str, kv_formats, workers: int) -> None:
    t0 = time.time()
    jobs = [(m, f) for m in (baseline_module, "kernels.mla.paged_triton") for f in kv_formats]
    with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
        errors = sum(pool.map(_warm_decode, jobs), [])
    print(f"compiled {len(jobs)} module x format jobs in {time.time() - t0:.0f} s; errors: {errors}")


def compare(baseline_module: str, kv_formats, out_path) -> None:
    """Before / after table: ``baseline_module.paged_mla_decode`` against today's, default splits,
    each timed plainly (``do_bench``: Python launch cost included) and as a CUDA-graph replay."""
    before = importlib.import_module(baseline_module).paged_mla_decode
    device, shapes = torch.device("cuda", 0), AttentionShapes()
    copy_bw = copy_bandwidth(str(device))
    rows = []
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s; us (fraction of copy bandwidth); plain | graph")
    for fmt in kv_formats:
        for batch in (1, 32):
            for context in (8192, 32768, 131072):
                torch.cuda.empty_cache()
                pool, args, topk = _inputs(shapes, fmt, context, batch, device)
                for mode, sel in (("dense", None), ("sparse", topk)):
                    keys = shapes.topk if sel is not None else context
                    nbytes = batch * keys * (pool.row_bytes + (4 if sel is not None else 0))
                    row = dict(fmt=fmt, mode=mode, batch=batch, context=context, bytes=nbytes)
                    want = before(*args, sel, 0.07, context)[0].float()
                    got = paged_mla_decode(*args, sel, 0.07, context)[0].float()
                    row["err"] = ((got - want).norm() / want.norm()).item()
                    for name, fn in (("before", before), ("after", paged_mla_decode)):
                        call = lambda f=fn, a=args, s=sel, n=context: f(*a, s, 0.07, n)  # noqa: E731
                        row[f"{name}_plain"] = device_us(call)
                        row[f"{name}_graph"] = graph_us(call)
                    rows.append(row)
                    cells = " | ".join(
                        f"{row[k]:8.1f} ({nbytes / (row[k] * 1e-6) / copy_bw:4.2f})"
                        for k in ("before_plain", "after_plain", "before_graph", "after_graph")
                    )
                    print(
                        f"{fmt:>4} {mode:>6} B{batch:<3} N{context:<7} {cells}  err {row['err']:.1e}",
                        flush=True,
                    )
    with open(out_path, "w") as f:
        json.dump(dict(copy_bw=copy_bw, rows=rows), f)


def sweep_splits(seq_lens=(2048, 8192, 32768, 131072), splits=(1, 16, 32, 64, 132, 264, 528)) -> None:
    """Dense bf16-row decode at batch 1, default tile, for each split count and length (graph replays)."""
    device, shapes = torch.device("cuda", 0), AttentionShapes()
    copy_bw = copy_bandwidth(str(device))
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s; dense bf16 rows, batch 1")
    print(f"{'N':>7} {'splits':>6} | {'us':>8} {'GB/s':>6} {'/copy':>6}")
    for seq_len in seq_lens:
        torch.cuda.empty_cache()
        pool, args, _ = _inputs(shapes, "bf16", seq_len, 1, device)
        nbytes = seq_len * pool.row_bytes
        for count in splits:
            call = lambda a=args, n=seq_len, k=count: paged_mla_decode(*a, None, 0.07, n, num_splits=k)  # noqa: E731
            us = graph_us(call)
            bps = nbytes / us * 1e6
            print(f"{seq_len:>7} {count:>6} | {us:>8.1f} {bps / 1e9:>6.0f} {bps / copy_bw:>6.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-formats", default="bf16,fp8")
    parser.add_argument("--out", default="attention_tuning.json")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--warm-only", action="store_true", help="only compile (in worker processes)")
    parser.add_argument("--compare", metavar="MODULE", help="before / after table against MODULE")
    parser.add_argument("--splits", action="store_true", help="split-count sweep of the default tile")
    args = parser.parse_args()
    formats = tuple(args.kv_formats.split(","))
    if args.splits:
        sweep_splits()
    elif args.compare and args.warm_only:
        warm_compare(args.compare, formats, args.workers)
    elif args.compare:
        compare(args.compare, formats, args.out)
    elif args.warm_only:
        warm(formats, args.workers)
    else:
        run(formats, args.out)


if __name__ == "__main__":
    main()
