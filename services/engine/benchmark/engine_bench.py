"""Engine throughput against the naive full-recompute forward, default and batch-invariant side by side.

For each (mode, batch size, context length): the engine prefills ``batch`` prompts of ``context``
tokens and decodes ``decode_tokens`` more each; the baseline runs the same model with no cache,
recomputing the whole sequence for every generated token (what a server without a KV cache does).
Prefill tokens/s, decode tokens/s and their ratios to the baseline are reported, and the invariant
mode's cost as its ratio to the default mode.
"""

import time
from dataclasses import asdict, dataclass

import torch

from services.engine import LLM, SamplingParams


@dataclass(frozen=True)
class EngineBenchRow:
    """One measured configuration."""

    mode: str
    batch: int
    context: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    naive_prefill_tokens_per_s: float
    naive_decode_tokens_per_s: float

    @property
    def prefill_ratio(self) -> float:
        return self.prefill_tokens_per_s / self.naive_prefill_tokens_per_s

    @property
    def decode_ratio(self) -> float:
        return self.decode_tokens_per_s / self.naive_decode_tokens_per_s

    def as_dict(self) -> dict:
        return asdict(self) | {"prefill_ratio": self.prefill_ratio, "decode_ratio": self.decode_ratio}


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(device: str, work, *args) -> float:
    """Seconds ``work(*args)`` takes, the device synchronised on both sides."""
    _synchronize(device)
    start = time.perf_counter()
    work(*args)
    _synchronize(device)
    return time.perf_counter() - start


def run_engine_bench(
    model_dir: str,
    device: str,
    batches: list[int],
    contexts: list[int],
    decode_tokens: int,
    modes: list[str],
) -> list[EngineBenchRow]:
    """Measure every (mode, batch, context); see the module docstring."""
    rows = []
    for mode in modes:
        longest = max(contexts) + decode_tokens + 1
        llm = LLM(
            model_dir,
            device=device,
            batch_invariant=mode == "invariant",
            enable_prefix_caching=False,
            max_num_seqs=max(batches),
            max_num_batched_tokens=max(8192, max(contexts)),
            max_model_len=longest,
        )
        model = llm.engine.model
        vocab = model.config.vocab_size
        generator = torch.Generator().manual_seed(0)
        warm = torch.randint(0, vocab, (1, 16), generator=generator).tolist()
        llm.generate(warm, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
        for context in contexts:
            for batch in batches:
                prompts = torch.randint(0, vocab, (batch, context), generator=generator).tolist()
                prefill_only = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
                full = SamplingParams(max_tokens=decode_tokens + 1, temperature=0, ignore_eos=True)
                prefill_time = _timed(device, llm.generate, prompts, prefill_only)
                total_time = _timed(device, llm.generate, prompts, full)
                decode_time = max(total_time - prefill_time, 1e-9)
                ids = torch.tensor(prompts, device=device)
                with torch.no_grad():
                    naive_prefill = _timed(device, model, ids)
                    naive_decode = _timed(device, _naive_decode, model, ids, decode_tokens)
                rows.append(
                    EngineBenchRow(
                        mode=mode,
                        batch=batch,
                        context=context,
                        prefill_tokens_per_s=batch * context / prefill_time,
                        decode_tokens_per_s=batch * decode_tokens / decode_time,
                        naive_prefill_tokens_per_s=batch * context / naive_prefill,
                        naive_decode_tokens_per_s=batch * decode_tokens / naive_decode,
                    )
                )
                llm.engine.check_integrity()
    return rows


def _naive_decode(model, ids: torch.Tensor, steps: int) -> None:
    """Greedy decoding by recomputing the whole sequence for each new token (no cache)."""
    for _ in range(steps):
        next_ids = model(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_ids], dim=1)


def format_table(rows: list[EngineBenchRow]) -> str:
    """Aligned table; a last column gives the invariant mode's throughput relative to the default."""
    default = {(r.batch, r.context): r for r in rows if r.mode == "default"}
    header = (
        f"{'mode':<9} {'batch':>5} {'context':>7} {'prefill tok/s':>13} {'naive':>11} {'ratio':>6} "
        f"{'decode tok/s':>12} {'naive':>10} {'ratio':>7} {'vs default (prefill/decode)':>28}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        base = default.get((r.batch, r.context))
        versus = ""
        if r.mode != "default" and base is not None:
            versus = (
                f"{r.prefill_tokens_per_s / base.prefill_tokens_per_s:.3f} / "
                f"{r.decode_tokens_per_s / base.decode_tokens_per_s:.3f}"
            )
        lines.append(
            f"{r.mode:<9} {r.batch:>5} {r.context:>7} {r.prefill_tokens_per_s:>13.0f} "
            f"{r.naive_prefill_tokens_per_s:>11.0f} {r.prefill_ratio:>6.2f} {r.decode_tokens_per_s:>12.1f} "
            f"{r.naive_decode_tokens_per_s:>10.1f} {r.decode_ratio:>7.2f} {versus:>28}"
        )
    return "\n".join(lines)
