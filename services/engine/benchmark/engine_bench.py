"""Engine throughput per kernel backend, against the weights-once HBM bound and a peer, in one run.

For each (mode, kernels, batch, context): the engine prefills ``batch`` prompts of ``context`` tokens
and decodes ``decode_tokens`` more each. Reported per row: prefill and decode tokens/s, the decode
step time over the weights-once bound (every weight read once per step: weight bytes / 4.3 TB/s,
and / the copy bandwidth measured in the same run), host launches and GPU kernels per decode step
and the kernels' device time (``gpu ms``: a step much longer than it is bound by host work),
and the peer: transformers' ``KimiLinearForCausalLM`` (fla-core kernels where installed) on the same
checkpoint and prompts, as Baton / peer. Rows of another backend also show their decode rate over
the ``reference`` backend's.
"""

import time
from dataclasses import asdict, dataclass

import torch

from services.engine import LLM, SamplingParams
from services.engine.model.causal_lm import CausalLM

from .hardware import HBM_BYTES_PER_S, copy_bandwidth
from .launch_count import KernelTime, LaunchCount, count_launches
from .peer import PeerModel
from .timing import synchronize


@dataclass(frozen=True)
class EngineBenchRow:
    """One measured configuration (times in seconds; None where not measured here)."""

    mode: str
    kernels: str
    batch: int
    context: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    decode_step_s: float
    launches_per_step: int | None
    kernels_per_step: int | None
    peer_decode_tokens_per_s: float | None
    kernel_s_per_step: float | None = None  # device time of a decode step's kernels (less: host-bound)
    busiest_kernels: tuple[KernelTime, ...] = ()  # a decode step's kernels with the most device time

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EngineBenchReport:
    """The rows and the limits they are read against."""

    rows: list[EngineBenchRow]
    weight_bytes: int
    copy_bytes_per_s: float
    peer_note: str

    def bound_s(self, bandwidth: float = HBM_BYTES_PER_S) -> float:
        """Seconds to read every weight once at ``bandwidth`` bytes/s."""
        return self.weight_bytes / bandwidth

    def as_dict(self) -> dict:
        return {
            "weight_bytes": self.weight_bytes,
            "copy_bytes_per_s": self.copy_bytes_per_s,
            "hbm_bytes_per_s": HBM_BYTES_PER_S,
            "peer": self.peer_note,
            "rows": [row.as_dict() for row in self.rows],
        }


def _timed(device: str, work, *args) -> float:
    """Seconds ``work(*args)`` takes, the device synchronised on both sides."""
    synchronize(device)
    start = time.perf_counter()
    work(*args)
    synchronize(device)
    return time.perf_counter() - start


def run_engine_bench(
    model_dir: str,
    device: str,
    batches: list[int],
    contexts: list[int],
    decode_tokens: int,
    modes: list[str],
    kernels: list[str],
    cuda_graphs: bool = True,
    prebuilt: CausalLM | None = None,
    peer: bool = True,
) -> EngineBenchReport:
    """Measure every (mode, kernels, batch, context); see the module docstring.

    Args:
        model_dir: the checkpoint folder (with ``prebuilt``: only its name).
        prebuilt: a model built on ``device`` (real-shape presets); no peer runs then.
        peer: run the transformers peer (CUDA and a ``kimi_linear`` checkpoint on disk only).
    """
    rows = []
    generator = torch.Generator().manual_seed(0)
    prompts = {}
    weight_bytes = vocab = 0
    for mode in modes:
        for backend in kernels:
            llm = LLM(
                model_dir,
                device=device,
                batch_invariant=mode == "invariant",
                prebuilt=prebuilt,
                enable_prefix_caching=False,
                max_num_seqs=max(batches),
                max_num_batched_tokens=max(8192, max(contexts)),
                max_model_len=max(contexts) + decode_tokens + 1,
                kernels=backend,
                cuda_graphs=cuda_graphs,
            )
            model = llm.engine.model
            vocab = model.config.vocab_size
            weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            llm.generate([[1] * 16], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
            for context in contexts:
                for batch in batches:
                    if (batch, context) not in prompts:
                        prompts[batch, context] = torch.randint(
                            0, vocab, (batch, context), generator=generator
                        ).tolist()
                    rows.append(_measure(llm, mode, backend, prompts[batch, context], decode_tokens, device))
                    llm.engine.check_integrity()
            del llm
    peer_note = "not run"
    if peer:
        peer_model = PeerModel.load(model_dir, device) if prebuilt is None else None
        peer_note = PeerModel.why_not(model_dir, device) if peer_model is None else peer_model.name
        if peer_model is not None:
            rates = {key: peer_model.decode_tokens_per_s(ids, decode_tokens) for key, ids in prompts.items()}
            rows = [
                EngineBenchRow(**{**row.as_dict(), "peer_decode_tokens_per_s": rates[row.batch, row.context]})
                for row in rows
            ]
    return EngineBenchReport(rows, weight_bytes, copy_bandwidth(device), peer_note)


def _measure(llm: LLM, mode: str, backend: str, prompts: list[list[int]], decode_tokens: int, device: str):
    batch, context = len(prompts), len(prompts[0])
    prefill_only = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    full = SamplingParams(max_tokens=decode_tokens + 1, temperature=0, ignore_eos=True)
    # Untimed first: kernels compile and autotune per shape (fla's chunk kernels, Triton launches),
    # which would land in whichever timed run met the shape first and make decode = total - prefill
    # meaningless.
    llm.generate(prompts, full)
    prefill_time = _timed(device, llm.generate, prompts, prefill_only)
    total_time = _timed(device, llm.generate, prompts, full)
    decode_time = max(total_time - prefill_time, 1e-9)
    launches = _decode_step_launches(llm, prompts)
    return EngineBenchRow(
        mode=mode,
        kernels=backend,
        batch=batch,
        context=context,
        prefill_tokens_per_s=batch * context / prefill_time,
        decode_tokens_per_s=batch * decode_tokens / decode_time,
        decode_step_s=decode_time / decode_tokens,
        launches_per_step=None if launches is None else launches.launches,
        kernels_per_step=None if launches is None else launches.kernels,
        peer_decode_tokens_per_s=None,
        kernel_s_per_step=None if launches is None else launches.kernel_us / 1e6,
        busiest_kernels=() if launches is None else launches.busiest,
    )


def _decode_step_launches(llm: LLM, prompts: list[list[int]]) -> LaunchCount | None:
    """Launches of one pure-decode step of ``prompts`` (prefilled first, then finished)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    requests = [engine.add_request(prompt, params) for prompt in prompts]
    while any(not request.output_ids for request in requests):
        engine.step()
    count = count_launches(engine.step)
    while engine.has_unfinished:
        engine.step()
    return count


def format_table(report: EngineBenchReport) -> str:
    """Aligned table: Baton, its bound and its peer side by side, with ratios."""
    bound = report.bound_s()
    copy_bound = report.bound_s(report.copy_bytes_per_s)
    reference = {(r.mode, r.batch, r.context): r for r in report.rows if r.kernels == "reference"}
    lines = [
        f"weights {report.weight_bytes / 1e9:.3f} GB: read once = {bound * 1e3:.3f} ms at "
        f"{HBM_BYTES_PER_S / 1e12:.1f} TB/s, {copy_bound * 1e3:.3f} ms at the measured copy bandwidth "
        f"({report.copy_bytes_per_s / 1e12:.2f} TB/s); peer: {report.peer_note}",
    ]
    header = (
        f"{'mode':<9} {'kernels':<9} {'batch':>5} {'context':>7} {'prefill tok/s':>13} {'decode tok/s':>12} "
        f"{'ms/step':>8} {'gpu ms':>7} {'step/bound':>10} {'launches':>8} {'kernels':>7} {'peer tok/s':>10} "
        f"{'baton/peer':>10} {'vs reference':>12}"
    )
    lines += [header, "-" * len(header)]
    for r in report.rows:
        base = reference.get((r.mode, r.batch, r.context))
        versus = f"{r.decode_tokens_per_s / base.decode_tokens_per_s:.2f}" if base and r is not base else ""
        peer = r.peer_decode_tokens_per_s
        lines.append(
            f"{r.mode:<9} {r.kernels:<9} {r.batch:>5} {r.context:>7} {r.prefill_tokens_per_s:>13.0f} "
            f"{r.decode_tokens_per_s:>12.1f} {r.decode_step_s * 1e3:>8.3f} {_ms(r.kernel_s_per_step):>7} "
            f"{r.decode_step_s / bound:>10.1f} "
            f"{_count(r.launches_per_step):>8} {_count(r.kernels_per_step):>7} "
            f"{'' if peer is None else f'{peer:.1f}':>10} "
            f"{'' if peer is None else f'{r.decode_tokens_per_s / peer:.2f}':>10} {versus:>12}"
        )
    return "\n".join(lines)


def format_busiest(report: EngineBenchReport, top: int) -> str:
    """Each row's ``top`` busiest decode-step kernels: calls, device ms and share of the step time."""
    lines = []
    for r in report.rows:
        if not r.busiest_kernels:
            continue
        lines.append(
            f"busiest kernels of a decode step: {r.mode} {r.kernels} batch {r.batch} context {r.context}"
        )
        for kernel in r.busiest_kernels[:top]:
            share = kernel.total_us / 1e6 / r.decode_step_s
            lines.append(
                f"  {kernel.total_us / 1e3:8.3f} ms {share:6.1%} {kernel.calls:5d}x  {kernel.name[:110]}"
            )
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f}"


def _count(value: int | None) -> str:
    return "n/a" if value is None else str(value)
