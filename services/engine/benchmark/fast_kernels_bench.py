"""KDA, MoE and sampling kernels at real per-layer shapes, each beside its physical limit and its peer.

Run on a GPU in one call (prints one table; medians of ``triton.testing.do_bench``)::

    python -m services.engine.benchmark.fast_kernels_bench [--only kda_decode,kda_prefill,moe,sampling]

Rows:
- KDA decode, Kimi-Linear-48B layer (32 heads x 128, fp32 state 2 MiB per request), batch 1/32/256:
  ours (``kernels.kda.varlen.kda_varlen`` on strided slots, in place) and fla's public
  ``fused_recurrent_kda`` (dense state in, new state out); state bytes read + written, GB/s, fraction
  of a large device copy's bandwidth measured in the same run (issue 12 target: >= 70%).
- KDA chunk prefill: fla ``chunk_kda`` directly against ours through the slots (target: within 10%).
- MoE grouped GEMM at prefill sizes (E=256 top-8 and K3's E=896 top-16, D=2304, I=1024): the Triton
  kernel and ``torch._grouped_mm``, TFLOP/s and fraction of the bf16 dense peak (target: >= 50%).
- Sampling at vocab 163840, batch 1/32/256: ``sample_batch`` (sort + one launch), the sort alone, and
  the per-row CPU-style sampler as the old peer.
"""

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BF16_PEAK_TFLOPS = 790.0  # H200 / H100 SXM dense bf16
HEADS, HEAD_DIM, CONV_KERNEL = 32, 128, 4
HIDDEN, MOE_INTER = 2304, 1024


@dataclass(frozen=True)
class Row:
    """One measured line: ``what`` took ``ms``; ``rate`` ``unit`` and its ``fraction`` of the limit."""

    group: str
    what: str
    ms: float
    rate: float | None = None
    unit: str = ""
    fraction: float | None = None
    note: str = ""


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Read + write bandwidth of one large device-to-device copy, GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _bench(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def _slot_pool(batch: int):
    """A slot pool laid out like ``slot_layout`` (fp32 recurrent state, then the bf16 conv tail)."""
    state = HEADS * HEAD_DIM * HEAD_DIM
    conv_elems = 3 * HEADS * HEAD_DIM * (CONV_KERNEL - 1)
    slot_bytes = -(-(state * 4 + conv_elems * 2) // 64) * 64
    storage = torch.zeros(batch, slot_bytes, dtype=torch.uint8, device="cuda")
    pool = storage[:, : state * 4].view(torch.float32).view(batch, HEADS, HEAD_DIM, HEAD_DIM)
    pool.copy_(torch.randn_like(pool) * 0.01)
    return pool


def _kda_inputs(tokens: int, dtype=torch.bfloat16):
    shape = (tokens, HEADS, HEAD_DIM)
    q = F.normalize(torch.randn(shape, device="cuda"), dim=-1).to(dtype)
    k = F.normalize(torch.randn(shape, device="cuda"), dim=-1).to(dtype)
    v = torch.randn(shape, device="cuda").to(dtype)
    g = -torch.rand(shape, device="cuda") * 0.1
    beta = torch.rand(tokens, HEADS, device="cuda").to(dtype)
    return q, k, v, g, beta


def _kda_decode_case(batch: int, copy_gbs: float) -> list[Row]:
    from fla.ops.kda import fused_recurrent_kda

    from kernels.kda.varlen import kda_varlen

    q, k, v, g, beta = _kda_inputs(batch)
    pool = _slot_pool(batch)
    slots = torch.arange(batch, dtype=torch.int32, device="cuda").flip(0)
    has_state = torch.ones(batch, dtype=torch.bool, device="cuda")
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    cu_long = cu.long()
    state_bytes = 2 * batch * HEADS * HEAD_DIM * HEAD_DIM * 4
    scale = HEAD_DIM**-0.5
    dense = pool.contiguous()
    # Every sequence continues its state (any_fresh False): the engine's decode step, no zeroing launch.
    ours = _bench(lambda: kda_varlen(q, k, v, g, beta, scale, pool, slots, has_state, cu, 1, False))
    fla = _bench(
        lambda: fused_recurrent_kda(
            q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=dense,
            output_final_state=True, cu_seqlens=cu_long,
        )
    )  # fmt: skip
    rows = []
    for what, ms in (("ours (slots, in place)", ours), ("fla fused_recurrent_kda", fla)):
        gbs = state_bytes / ms / 1e6
        rows.append(Row("kda decode", f"B={batch} {what}", ms, gbs, "GB/s", gbs / copy_gbs))
    return rows


def bench_kda_decode(copy_gbs: float, batches=(1, 32, 256)) -> list[Row]:
    return [row for batch in batches for row in _kda_decode_case(batch, copy_gbs)]


def _kda_prefill_case(seqs: int, length: int) -> list[Row]:
    from fla.ops.kda import chunk_kda

    from kernels.kda.varlen import kda_varlen

    tokens = seqs * length
    q, k, v, g, beta = _kda_inputs(tokens)
    pool = _slot_pool(seqs)
    slots = torch.arange(seqs, dtype=torch.int32, device="cuda")
    has_state = torch.ones(seqs, dtype=torch.bool, device="cuda")
    cu = torch.arange(0, tokens + 1, length, dtype=torch.int32, device="cuda")
    cu_long = cu.long()
    scale = HEAD_DIM**-0.5
    dense = pool.contiguous()
    fla = _bench(
        lambda: chunk_kda(
            q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=dense,
            output_final_state=True, cu_seqlens=cu_long,
        )
    )  # fmt: skip
    ours = _bench(lambda: kda_varlen(q, k, v, g, beta, scale, pool, slots, has_state, cu, length, False))
    label = f"{seqs}x{length}"
    return [
        Row("kda prefill", f"{label} fla chunk_kda", fla),
        Row("kda prefill", f"{label} ours (slots)", ours, note=f"ours/fla {ours / fla:.3f}"),
    ]


def bench_kda_prefill(shapes=((1, 16384), (4, 4096), (16, 1024))) -> list[Row]:
    return [row for seqs, length in shapes for row in _kda_prefill_case(seqs, length)]


def _moe_case(tokens: int, experts: int, top_k: int) -> list[Row]:
    from kernels.moe import grouped, grouped_mm

    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w_gate_up = torch.randn(experts, 2 * MOE_INTER, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    w_down = torch.randn(experts, HIDDEN, MOE_INTER, device="cuda", dtype=torch.bfloat16) * 0.02
    expert_ids = torch.rand(tokens, experts, device="cuda").topk(top_k, dim=-1).indices
    weights = torch.rand(tokens, top_k, device="cuda")
    flops = 6 * tokens * top_k * HIDDEN * MOE_INTER
    label = f"N={tokens} E={experts} k={top_k}"
    rows = []
    for name, impl in (("triton", grouped.moe_grouped), ("torch._grouped_mm", grouped_mm.moe_grouped)):
        try:
            ms = _bench(lambda impl=impl: impl(x, expert_ids, weights, w_gate_up, w_down))
        except (RuntimeError, NotImplementedError) as error:  # e.g. _grouped_mm missing on this build
            rows.append(Row("moe", f"{label} {name}", float("nan"), note=str(error)[:60]))
            continue
        tflops = flops / ms / 1e9
        rows.append(Row("moe", f"{label} {name}", ms, tflops, "TFLOP/s", tflops / BF16_PEAK_TFLOPS))
    return rows


def bench_moe(shapes=((4096, 256, 8), (16384, 256, 8), (4096, 896, 16), (16384, 896, 16))) -> list[Row]:
    rows = []
    for shape in shapes:
        rows += _moe_case(*shape)
        torch.cuda.empty_cache()
    return rows


def _sampling_case(batch: int, vocab: int) -> list[Row]:
    from kernels.sampling.sample import sample_batch
    from services.engine.sampling.params import SamplingParams
    from services.engine.sampling.sampler import sample

    logits = torch.randn(batch, vocab, device="cuda") * 3
    temperature = torch.full((batch,), 0.8, device="cuda")
    top_k = torch.zeros(batch, dtype=torch.int32, device="cuda")
    top_p = torch.full((batch,), 0.9, device="cuda")
    min_p = torch.zeros(batch, device="cuda")
    seeds = torch.arange(batch, dtype=torch.int64, device="cuda")
    positions = torch.full((batch,), 100, dtype=torch.int64, device="cuda")
    args = (logits, temperature, top_k, top_p, min_p, seeds, positions, 5)
    ours = _bench(lambda: sample_batch(*args))
    sort = _bench(lambda: torch.sort(logits, dim=-1, descending=True, stable=True))
    rows = [Row("sampling", f"B={batch} sample_batch (top_p 0.9, n=5)", ours, note=f"sort {sort:.3f} ms")]
    if batch <= 32:
        params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, logprobs=5) for i in range(batch)]
        old = _bench(lambda: sample(logits, params, [100] * batch))
        rows.append(Row("sampling", f"B={batch} per-row sampler (old)", old))
    return rows


def bench_sampling(batches=(1, 32, 256), vocab: int = 163840) -> list[Row]:
    return [row for batch in batches for row in _sampling_case(batch, vocab)]


def print_rows(rows: list[Row], copy_gbs: float) -> None:
    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth: {copy_gbs:.0f} GB/s")
    print(f"{'group':<12} {'what':<44} {'ms':>9} {'rate':>14} {'of limit':>9}  note")
    for row in rows:
        rate = f"{row.rate:.1f} {row.unit}" if row.rate is not None else ""
        frac = f"{row.fraction:.1%}" if row.fraction is not None else ""
        print(f"{row.group:<12} {row.what:<44} {row.ms:>9.4f} {rate:>14} {frac:>9}  {row.note}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="kda_decode,kda_prefill,moe,sampling")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fast_kernels_bench: needs a CUDA GPU")
    groups = set(args.only.split(","))
    copy_gbs = copy_bandwidth_gbs()
    rows: list[Row] = []
    with torch.inference_mode():
        if "kda_decode" in groups:
            rows += bench_kda_decode(copy_gbs)
        if "kda_prefill" in groups:
            rows += bench_kda_prefill()
        if "moe" in groups:
            rows += bench_moe()
        if "sampling" in groups:
            rows += bench_sampling()
    print_rows(rows, copy_gbs)


if __name__ == "__main__":
    main()
