"""``baton bench kernels``: per-op kernel benchmarks at real shapes, each against its limit and peer.

Benchmarks are registered by name (``--ops``) as ``module:function``; each function takes a
``KernelBenchContext`` and returns ``KernelResult`` rows. The limits (copy bandwidth, matrix rate)
are measured once per run and handed to every benchmark, so each row reads "what the kernel
reaches / what the device allows" and "/ what the peer kernel reaches" on the same GPU. The op
benchmarks live beside this file (``attention_kernels``, ``kda_kernels``, ``moe_kernels``,
``sampling_kernels``, ``invariant_kernels``) and time their work with ``timing``.
"""

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch

from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.model.config import ModelConfig
from services.engine.model.config_loader import load_model_config

from .hardware import HBM_BYTES_PER_S, copy_bandwidth, matmul_rate
from .timing import timed


class KernelBench(NamedTuple):
    """A registered benchmark: where its function is (``module:function``) and what it measures."""

    target: str
    summary: str


_HERE = "services.engine.benchmark"
KERNEL_BENCHES = {
    "copy": KernelBench(f"{_HERE}.kernel_bench:bench_copy", "device copy GB/s vs the H200 HBM figure"),
    "matmul": KernelBench(
        f"{_HERE}.kernel_bench:bench_matmul", "expert-shaped GEMM TFLOP/s vs the square-GEMM rate"
    ),
    "mla": KernelBench(
        f"{_HERE}.attention_kernels:bench_mla",
        "paged MLA decode (dense, DSA top-k; bf16 and FP8 rows) GB/s vs copy; chunked prefill TFLOP/s",
    ),
    "indexer": KernelBench(
        f"{_HERE}.attention_kernels:bench_indexer", "DSA indexer scores and top-k GB/s vs copy"
    ),
    "kda": KernelBench(
        f"{_HERE}.kda_kernels:bench_kda", "KDA decode state GB/s and chunked prefill TFLOP/s vs fla's kernels"
    ),
    "moe": KernelBench(
        f"{_HERE}.moe_kernels:bench_moe", "grouped expert GEMMs TFLOP/s vs matmul rate and torch._grouped_mm"
    ),
    "sampling": KernelBench(
        f"{_HERE}.sampling_kernels:bench_sampling", "device sampling GB/s of logits vs the per-row sampler"
    ),
    "checksum": KernelBench(
        f"{_HERE}.checksum_kernels:bench_checksum",
        "the handoff's keyed checksum GB/s vs copy and its torch reference (cost on a link: 2 x link / this)",
    ),
    "invariant": KernelBench(
        f"{_HERE}.invariant_kernels:bench_invariant",
        "batch-invariant Triton matmul, RMSNorm, log-softmax, KDA vs the default kernels (goal: >= 0.90)",
    ),
}


@dataclass(frozen=True)
class KernelBenchContext:
    """What every kernel benchmark gets: where and in what dtype to run, the real shapes (the K3
    shape of the ``full`` preset: Kimi-Linear-48B-A3B layers plus the DSA indexer), and the limits
    measured in this run (bytes/s of a device copy, flop/s of a square matrix product)."""

    device: str
    dtype: torch.dtype
    config: ModelConfig
    copy_bytes_per_s: float
    matmul_flops: float


@dataclass(frozen=True)
class KernelResult:
    """One measured case: ``value`` in ``unit`` (higher is better), its ``limit`` (same unit) and the
    peer's value (None where there is no peer), with what each is."""

    op: str
    case: str
    value: float
    unit: str
    limit: float
    limit_name: str
    peer: float | None = None
    peer_name: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def make_context(device: str, dtype: torch.dtype) -> KernelBenchContext:
    """Measure the limits and build the real-shape config (four layers: one MLA)."""
    config = load_model_config(with_layers(preset_config("k3", "full"), 4))
    return KernelBenchContext(device, dtype, config, copy_bandwidth(device), matmul_rate(device, dtype))


def resolve(ops: list[str]) -> list[Callable[[KernelBenchContext], list[KernelResult]]]:
    """The benchmark function of each name (importing its module).

    Raises:
        ValueError: an unknown name, naming ``--ops``.
    """
    unknown = [op for op in ops if op not in KERNEL_BENCHES]
    if unknown:
        raise ValueError(f"--ops: unknown op {unknown[0]!r} (choose from {', '.join(KERNEL_BENCHES)})")
    functions = []
    for op in ops:
        module_name, function = KERNEL_BENCHES[op].target.split(":")
        functions.append(getattr(importlib.import_module(module_name), function))
    return functions


def bench_copy(context: KernelBenchContext) -> list[KernelResult]:
    """The copy bandwidth itself, against the H200 figure the tables quote."""
    return [
        KernelResult(
            "copy",
            "1 GiB device copy",
            context.copy_bytes_per_s / 1e9,
            "GB/s",
            HBM_BYTES_PER_S / 1e9,
            "H200 HBM",
        )
    ]


def bench_matmul(context: KernelBenchContext) -> list[KernelResult]:
    """Matrix rate at the MoE expert shapes (one expert's gate-up GEMM over a prefill's tokens), against
    the square-product rate: what a grouped GEMM's ratio is read against."""
    c, results = context.config, []
    for tokens in (16, 512, 8192):
        x = torch.randn(tokens, c.hidden_size, device=context.device, dtype=context.dtype)
        w = torch.randn(
            2 * c.moe.intermediate_size, c.hidden_size, device=context.device, dtype=context.dtype
        )
        seconds = timed(context.device, lambda x=x, w=w: x @ w.t())
        flops = 2 * tokens * c.hidden_size * 2 * c.moe.intermediate_size
        results.append(
            KernelResult(
                "matmul",
                f"[{tokens}, {c.hidden_size}] x [{c.hidden_size}, {2 * c.moe.intermediate_size}]",
                flops / seconds / 1e12,
                "TFLOP/s",
                context.matmul_flops / 1e12,
                "square GEMM",
            )
        )
    return results


def format_results(results: list[KernelResult], context_line: str) -> str:
    """Aligned table, one row per case: value, limit, value/limit, peer, value/peer."""
    header = (
        f"{'op':<9} {'case':<44} {'value':>10} {'unit':<8} {'limit':>10} {'of limit':>8} {'peer':>10} "
        f"{'vs peer':>7}  limit / peer"
    )
    lines = [context_line, header, "-" * len(header)]
    for r in results:
        peer = "" if r.peer is None else f"{r.peer:.2f}"
        versus = "" if r.peer is None else f"{r.value / r.peer:.2f}"
        lines.append(
            f"{r.op:<9} {r.case:<44} {r.value:>10.2f} {r.unit:<8} {r.limit:>10.2f} {r.value / r.limit:>8.2f} "
            f"{peer:>10} {versus:>7}  {r.limit_name}{' / ' + r.peer_name if r.peer_name else ''}"
        )
    return "\n".join(lines)
