"""What the exact distributed DSA top-k costs beside a rank's local top-k, on CPU ranks over gloo.

Designs measured per call (``T`` query rows, ``W`` keys per sequence split over ``D`` ranks, budget k):

- ``local``: one rank's best-k of its ``W / D`` keys alone (the work every design does first);
- ``single``: one rank's best-k over all ``W`` keys (DCP 1), ranked the same way (``best_candidates``);
- ``exchange``: the default (``distributed_topk``: fair-share candidates, detect, refill);
- ``one_round``: ``candidates = k`` (one all-gather of k per rank, never a refill);
- ``all_scores``: every rank all-gathers every score and ranks them all (the replicated-keys bound:
  the same result without a candidate merge, at ``W / D`` scores sent per rank and row).

Scores are ``random`` (a refill is rare) or ``skewed`` (every best key on rank 0: a refill every call).
Run: ``python -m services.engine.benchmark.dcp_topk`` (docs/performance.md, "Parallel layouts").
"""

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kernels.dsa.paged_naive import topk_by_score
from kernels.dsa.topk_merge import best_candidates
from services.engine.parallel.collectives import all_gather_cat
from services.engine.parallel.dcp_shard import DcpShard
from services.engine.parallel.distributed_topk import ExchangeStats, default_candidates, distributed_topk

SCORES = ("random", "skewed")


def _scores(kind: str, rows: int, keys: int, size: int) -> torch.Tensor:
    scores = torch.randn(rows, keys, generator=torch.Generator().manual_seed(0))
    if kind == "skewed":
        scores[:, ::size] += 100.0
    return scores


def _median_s(work, repeats: int) -> float:
    """Median seconds of ``work()``, the ranks started together by a barrier before each call."""
    work()
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _designs(scores: torch.Tensor, shard: DcpShard, topk: int, repeats: int) -> dict:
    """Every design's cost on one score matrix (the whole of it; this rank keeps its columns)."""
    rows = scores.shape[0]
    mine = scores[:, shard.rank :: shard.size].contiguous()
    positions = shard.global_positions(torch.arange(mine.shape[1])).expand(rows, -1)
    want = topk_by_score(scores, topk)  # the float32 reference each design must equal
    everywhere = torch.arange(scores.shape[1]).expand(rows, -1)
    designs = {}
    for name, candidates in (("exchange", None), ("one_round", topk)):
        stats = ExchangeStats()
        assert torch.equal(distributed_topk(mine, shard, dist.group.WORLD, topk, candidates, stats), want), (
            name
        )
        seconds = _median_s(
            lambda c=candidates: distributed_topk(mine, shard, dist.group.WORLD, topk, c), repeats
        )
        designs[name] = {
            "ms": seconds * 1e3,
            "rounds": stats.rounds,
            "bytes_sent": stats.bytes_sent,
            "refilled_rows": stats.refilled_rows,
        }

    def all_scores():
        gathered = all_gather_cat(mine[None], dist.group.WORLD)  # [D, T, W / D]: rank r's l is l D + r
        return best_candidates(gathered.permute(1, 2, 0).reshape(rows, -1), everywhere, topk)[1]

    assert torch.equal(all_scores(), want), "all_scores"
    designs["all_scores"] = {
        "ms": _median_s(all_scores, repeats) * 1e3,
        "rounds": 1,
        "bytes_sent": mine.numel() * mine.element_size(),
        "refilled_rows": 0,
    }
    designs["local"] = {"ms": _median_s(lambda: best_candidates(mine, positions, topk), repeats) * 1e3}
    designs["single"] = {"ms": _median_s(lambda: best_candidates(scores, everywhere, topk), repeats) * 1e3}
    return designs


def _rank_bench(rank: int, size: int, rows: int, keys: int, topk: int, repeats: int) -> dict:
    shard = DcpShard(rank, size)
    return {kind: _designs(_scores(kind, rows, keys, size), shard, topk, repeats) for kind in SCORES}


def _rank_main(rank: int, size: int, port: int, out: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        report = _rank_bench(rank, size, *args)
        if rank == 0:
            Path(out).write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def bench_distributed_topk(size: int, rows: int, keys: int, topk: int, repeats: int = 20) -> dict:
    """Spawn ``size`` gloo ranks and measure every design (module docstring); rank 0's numbers.

    Returns:
        ``{scores kind: {design: {"ms", "rounds", "bytes_sent", "refilled_rows"}}}`` (per call, per rank;
        ``local`` and ``single`` carry only ``ms``), plus ``"candidates"``: what ``exchange`` sends.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "report.json")
        mp.spawn(_rank_main, args=(size, port, out, (rows, keys, topk, repeats)), nprocs=size, join=True)
        report = json.loads(Path(out).read_text())
    report["candidates"] = default_candidates(topk, size)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dcp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rows", type=int, default=16, help="query rows per call (decode batch)")
    parser.add_argument("--keys", type=int, default=32768, help="keys per sequence (context length)")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    for size in args.dcp:
        report = bench_distributed_topk(size, args.rows, args.keys, args.topk, args.repeats)
        shape = f"rows {args.rows}, keys {args.keys}, topk {args.topk}"
        print(f"dcp {size}: {shape}, candidates {report['candidates']}")
        for kind in SCORES:
            for name, row in report[kind].items():
                line = f"  {kind:7s} {name:10s} {row['ms']:8.3f} ms"
                if "rounds" in row:
                    line += f"  rounds {row['rounds']}  bytes/rank {row['bytes_sent']}"
                    line += f"  refilled rows {row['refilled_rows']}"
                print(line)


if __name__ == "__main__":
    main()
