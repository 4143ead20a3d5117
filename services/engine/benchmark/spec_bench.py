"""Speculative decoding against plain decoding, side by side in one run (``baton bench spec``).

For each batch size the same prompts are decoded by the plain engine and by the engine drafting ``k``
tokens per step with each draft (a draft checkpoint, and the target as its own draft: acceptance is then
total, the ceiling of what drafting ``k`` tokens can give at that batch) under the fixed policy (every
step drafts ``k``); then, per draft, by the engine's default adaptive policy (``spec_policy.py``) at the
largest ``k``: what a user of the default engine gets. Per row: decode tokens/s, TPOT (decode seconds per
generated token of one request), the ratio to the plain engine's tokens/s at that batch, the mean ``k``
drafted per step (0 for a plain step the policy took), the mean drafts accepted per verify and
per-position acceptance, and the share of decode time spent in the draft. Decode time is timed directly
on the engine's step loop: from the step after every request has its first token (the prefill's) to the
last step; the draft's own catch-up on the prompt at its first verify counts as decode time. Each row is
the best of ``repeats`` timed runs after an untimed one (kernels compile per shape; the adaptive policy's
warm-up runs in it, at the arm's first batch, and its measurements carry over to the timed runs).
With several KDA rollbacks (``--kda-rollback states,replay``: the state after every draft kept, or one
checkpoint and the accepted drafts run again) each fixed arm runs under each, named ``arm/rollback``
past the first; the adaptive arms take the first.
"""

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from services.engine import LLM, SamplingParams
from services.engine.speculative.spec_counters import SpecCounts

from .timing import synchronize

PLAIN = "plain"
DRAFT = "draft"
SELF_DRAFT = "self-draft"
ADAPTIVE = "adaptive"  # the draft's arm under the adaptive policy
SELF_ADAPTIVE = "self-adaptive"


@dataclass(frozen=True)
class SpecArm:
    """One engine configuration: ``draft`` is a checkpoint folder ("" for plain decoding), drafting up to
    ``num_draft_tokens`` per step under ``spec_policy`` (``fixed``: that many every step), rejected drafts
    undone by ``kda_rollback``."""

    name: str
    draft: str
    num_draft_tokens: int
    spec_policy: str = "fixed"
    kda_rollback: str = "auto"


@dataclass(frozen=True)
class SpecBenchRow:
    """One (arm, batch) measurement; acceptance fields and ``mean_draft_tokens`` (the mean ``k`` of the
    timed runs' steps, plain steps the policy took counting 0) are None for the plain arm."""

    arm: str
    num_draft_tokens: int
    batch: int
    decode_tokens_per_s: float
    tpot_ms: float
    speedup: float
    accepted_per_verify: float | None
    acceptance_by_position: tuple[float, ...] | None
    draft_time_share: float | None
    spec_policy: str | None = None
    mean_draft_tokens: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def spec_arms(
    target: str,
    draft: str,
    num_draft_tokens: list[int],
    self_draft: bool,
    adaptive: bool = True,
    rollbacks: tuple[str, ...] = ("auto",),
) -> list[SpecArm]:
    """The plain arm, then for each ``k`` the draft's arm (when given) and the self-draft arm (fixed
    policy) under each of ``rollbacks``, then with ``adaptive`` each of those drafts under the adaptive
    policy at the largest ``k`` (the first rollback)."""
    drafts = [(DRAFT, draft)] if draft else []
    if self_draft:
        drafts.append((SELF_DRAFT, target))
    arms = [SpecArm(PLAIN, "", 0)]
    for k in num_draft_tokens:
        for name, folder in drafts:
            arms += [
                SpecArm(name if i == 0 else f"{name}/{rollback}", folder, k, "fixed", rollback)
                for i, rollback in enumerate(rollbacks)
            ]
    if adaptive:
        adaptive_names = {DRAFT: ADAPTIVE, SELF_DRAFT: SELF_ADAPTIVE}
        largest = max(num_draft_tokens)
        arms += [
            SpecArm(adaptive_names[name], folder, largest, "adaptive", rollbacks[0])
            for name, folder in drafts
        ]
    return arms


def run_spec_bench(
    target: str,
    arms: list[SpecArm],
    prompts: list[list[int]],
    batches: list[int],
    decode_tokens: int,
    temperature: float,
    device: str,
    repeats: int = 2,
    on_row: Callable[[SpecBenchRow], None] | None = None,
    **engine_options,
) -> list[SpecBenchRow]:
    """Measure every arm at every batch size on the first ``batch`` prompts (see the module docstring).

    Args:
        target: the target checkpoint folder.
        arms: from ``spec_arms``; the plain arm first (the speed-ups are read against it).
        prompts: at least ``max(batches)`` token-id prompts.
        decode_tokens: tokens generated per request after the first.
        temperature: 0 for greedy; otherwise sampled with seeds 0, 1, ... per request.
        repeats: timed runs per row (the best is kept).
        on_row: called with each row as soon as it is measured (a long run shows its rows as it goes,
            and one stopped early keeps them).
        engine_options: more ``EngineConfig`` fields (``dtype``, ``kernels``, ...).
    """
    if len(prompts) < max(batches):
        raise ValueError(f"prompts: {len(prompts)} given, the largest batch needs {max(batches)}")
    longest = max(len(p) for p in prompts)
    rows: list[SpecBenchRow] = []
    plain_rate: dict[int, float] = {}
    for arm in arms:
        spec = (
            {
                "draft_model": arm.draft,
                "num_draft_tokens": arm.num_draft_tokens,
                "spec_policy": arm.spec_policy,
                "kda_rollback": arm.kda_rollback,
            }
            if arm.draft
            else {}
        )
        llm = LLM(
            target,
            device=device,
            enable_prefix_caching=False,
            max_num_seqs=max(batches),
            max_model_len=longest + decode_tokens + 2,
            **spec,
            **engine_options,
        )
        for batch in batches:
            plain = plain_rate.get(batch)
            row = _measure(llm, arm, prompts[:batch], decode_tokens, temperature, device, plain, repeats)
            if arm.name == PLAIN:
                plain_rate[batch] = row.decode_tokens_per_s
            rows.append(row)
            if on_row is not None:
                on_row(row)
            llm.engine.check_integrity()
        del llm
    return rows


def _params(batch: int, max_tokens: int, temperature: float) -> list[SamplingParams]:
    if temperature == 0:
        return [SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)] * batch
    return [
        SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=i, ignore_eos=True)
        for i in range(batch)
    ]


def _decode_seconds(llm: LLM, prompts: list[list[int]], params: list[SamplingParams], device: str) -> float:
    """Seconds of the decode phase: every step after each request has its first token."""
    engine = llm.engine
    requests = [engine.add_request(prompt, p) for prompt, p in zip(prompts, params, strict=True)]
    while any(not request.output_ids for request in requests):
        engine.step()
    synchronize(device)
    start = time.perf_counter()
    while engine.has_unfinished:
        engine.step()
    synchronize(device)
    return time.perf_counter() - start


def _measure(
    llm: LLM,
    arm: SpecArm,
    prompts: list[list[int]],
    decode_tokens: int,
    temperature: float,
    device: str,
    plain_rate: float | None,
    repeats: int,
) -> SpecBenchRow:
    batch = len(prompts)
    full = _params(batch, decode_tokens + 1, temperature)
    _decode_seconds(llm, prompts, full, device)  # untimed: kernels compile per shape
    counters = getattr(llm.engine, "spec_counters", None)
    before = counters.counts() if counters is not None else None
    times = [_decode_seconds(llm, prompts, full, device) for _ in range(repeats)]
    decode_time = min(times)
    rate = batch * decode_tokens / decode_time
    accepted = by_position = share = mean_k = None
    if before is not None:  # over every timed run: the counters grew through all of them
        after = counters.counts()
        accepted, by_position, share = _acceptance(before, after, sum(times))
        mean_k = _mean_draft_tokens(before, after)
    return SpecBenchRow(
        arm=arm.name,
        num_draft_tokens=arm.num_draft_tokens,
        batch=batch,
        decode_tokens_per_s=rate,
        tpot_ms=decode_time / decode_tokens * 1e3,
        speedup=rate / plain_rate if plain_rate else 1.0,
        accepted_per_verify=accepted,
        acceptance_by_position=by_position,
        draft_time_share=share,
        spec_policy=arm.spec_policy if arm.draft else None,
        mean_draft_tokens=mean_k,
    )


def _mean_draft_tokens(before: SpecCounts, after: SpecCounts) -> float:
    """The mean ``k`` of the steps with requests to draft for between ``before`` and ``after`` (0.0:
    none)."""
    steps = [a - b for a, b in zip(after.steps_by_draft_tokens, before.steps_by_draft_tokens, strict=True)]
    return sum(k * count for k, count in enumerate(steps)) / sum(steps) if sum(steps) else 0.0


def _acceptance(
    before: SpecCounts, after: SpecCounts, decode_time: float
) -> tuple[float, tuple[float, ...], float]:
    """Mean drafts accepted per verify, acceptance rate per draft position, and the draft's share of
    ``decode_time`` (the runs' total), over what the counters gained between ``before`` and ``after``."""
    verifies = after.verifies - before.verifies
    lengths = [a - b for a, b in zip(after.accepted_lengths, before.accepted_lengths, strict=True)]
    accepted = sum(n * count for n, count in enumerate(lengths)) / verifies if verifies else 0.0
    drafted = [a - b for a, b in zip(after.drafted_by_position, before.drafted_by_position, strict=True)]
    kept = [a - b for a, b in zip(after.accepted_by_position, before.accepted_by_position, strict=True)]
    by_position = tuple(k / d if d else 0.0 for k, d in zip(kept, drafted, strict=True))
    share = (after.draft_seconds - before.draft_seconds) / decode_time
    return accepted, by_position, share


def table_header(note: str) -> str:
    """The table's first lines: the note (what the drafts are, whether acceptance means anything) and
    the column names."""
    header = (
        f"{'arm':<13} {'k':>2} {'mean k':>6} {'batch':>5} {'decode tok/s':>12} {'TPOT ms':>8} "
        f"{'vs plain':>8} {'accepted/verify':>15} {'draft time':>10}  acceptance by position"
    )
    return "\n".join([note, header, "-" * len(header)])


def format_row(r: SpecBenchRow) -> str:
    """One aligned row under ``table_header``."""
    accepted = "-" if r.accepted_per_verify is None else f"{r.accepted_per_verify:.2f}"
    share = "-" if r.draft_time_share is None else f"{r.draft_time_share:.0%}"
    mean_k = "-" if r.mean_draft_tokens is None else f"{r.mean_draft_tokens:.2f}"
    by_position = r.acceptance_by_position
    positions = "-" if by_position is None else " ".join(f"{p:.2f}" for p in by_position)
    return (
        f"{r.arm:<13} {r.num_draft_tokens:>2} {mean_k:>6} {r.batch:>5} {r.decode_tokens_per_s:>12.1f} "
        f"{r.tpot_ms:>8.2f} {r.speedup:>7.2f}x {accepted:>15} {share:>10}  {positions}"
    )
