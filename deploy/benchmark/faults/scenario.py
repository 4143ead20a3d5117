"""What a fault run does: the requests (and which of them leave early), the kills, the failed transfers.

``FaultScenario`` is the whole description; ``plan_requests`` turns it into one ``RequestPlan`` per
request, drawn from ``random.Random(seed)``, so a seed fixes every prompt, cancel point and deadline.
Each request is one of four kinds:

    complete      streams to ``max_tokens`` (greedy, ``ignore_eos``)
    cancel_early  the client cancels ``cancel_after_s`` after sending, usually before the first token
    cancel_late   the client cancels after receiving ``cancel_after_tokens`` tokens (1..max_tokens-1)
    deadline      the call's deadline is ``deadline_s`` (one of ``deadlines_s``), e.g. 1 ms

Kills are spread evenly over the run: kill ``i`` of ``n`` (prefill and decode interleaved) fires
once ``(i + 1) / (n + 1)`` of the requests have finished, so streams are in flight when it lands.
"""

import random
from dataclasses import dataclass

KINDS = ("complete", "cancel_early", "cancel_late", "deadline")
_FIRST_ID = 3  # skips pad, bos and eos of the random checkpoints


@dataclass(frozen=True)
class FaultScenario:
    """One fault run. Fractions are of ``requests``; the rest complete normally.

    Raises:
        ValueError: a value out of range, naming the ``baton bench faults`` flag.
    """

    requests: int = 1000
    concurrency: int = 200
    prompt_tokens: tuple[int, int] = (8, 256)  # uniform range; <= 16 tokens are prefilled on decode
    max_tokens: int = 16
    cancel_fraction: float = 0.2  # half cancel early (a random delay), half after a random token count
    cancel_window_s: float = 0.5  # an early cancel comes uniformly within this long after sending
    deadline_fraction: float = 0.2
    deadlines_s: tuple[float, ...] = (0.001, 0.05, 0.5)
    kills_prefill: int = 2
    kills_decode: int = 2
    fail_transfers: int = 5  # each prefill worker's first N handoffs fail (again after a restart)
    client_attempts: int = 1  # 1: no SDK retry, so every client status is the router's own answer
    timeout_s: float = 300.0  # deadline of the requests without a tight one
    seed: int = 0

    def __post_init__(self):
        low, high = self.prompt_tokens
        for flag, value, least in (
            ("--requests", self.requests, 1),
            ("--concurrency", self.concurrency, 1),
            ("--max-tokens", self.max_tokens, 2),  # a late cancel needs a token before the last
            ("--prompt-tokens", low, 1),
            ("--kills-prefill", self.kills_prefill, 0),
            ("--kills-decode", self.kills_decode, 0),
            ("--fail-transfers", self.fail_transfers, 0),
            ("--client-attempts", self.client_attempts, 1),
            ("--seed", self.seed, 0),
        ):
            if value < least:
                raise ValueError(f"{flag}: must be >= {least}, got {value}")
        if high < low:
            raise ValueError(f"--prompt-tokens: expected MIN,MAX with MIN <= MAX, got {low},{high}")
        for flag, value in (
            ("--cancel-fraction", self.cancel_fraction),
            ("--deadline-fraction", self.deadline_fraction),
        ):
            if not 0 <= value <= 1:
                raise ValueError(f"{flag}: must be in [0, 1], got {value}")
        if self.cancel_fraction + self.deadline_fraction > 1:
            raise ValueError("--cancel-fraction + --deadline-fraction: must be <= 1")
        if self.deadline_fraction and (not self.deadlines_s or min(self.deadlines_s) <= 0):
            raise ValueError(f"--deadlines-ms: expected positive values, got {self.deadlines_s}")
        if not self.cancel_window_s > 0 or not self.timeout_s > 0:
            raise ValueError("cancel_window_s, timeout_s: must be > 0")

    def kill_schedule(self) -> list[tuple[int, str]]:
        """``(finished requests, role)`` per kill, in firing order, roles interleaved."""
        order = _interleave(self.kills_prefill, self.kills_decode)
        n = len(order)
        return [((i + 1) * self.requests // (n + 1), role) for i, role in enumerate(order)]


def _interleave(prefill: int, decode: int) -> list[str]:
    """Roles alternating while both have kills left, then the rest. Decode goes first: each kill waits
    for the previous restart, so the first kill is the one sure to land while streams are running,
    and a decode worker dying under running streams is the case that moves them (migration)."""
    order = []
    while prefill or decode:
        if decode:
            order.append("decode")
            decode -= 1
        if prefill:
            order.append("prefill")
            prefill -= 1
    return order


@dataclass(frozen=True)
class RequestPlan:
    """One request: its id, prompt, kind and where it ends early (``None`` where the kind has none)."""

    request_id: str
    kind: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    timeout_s: float
    cancel_after_s: float | None = None
    cancel_after_tokens: int | None = None


def plan_requests(scenario: FaultScenario, vocab_size: int) -> list[RequestPlan]:
    """Every request of ``scenario``, in sending order; kinds shuffled through the run."""
    rng = random.Random(scenario.seed)
    cancels = round(scenario.requests * scenario.cancel_fraction)
    deadlines = round(scenario.requests * scenario.deadline_fraction)
    kinds = (
        ["cancel_early"] * (cancels // 2)
        + ["cancel_late"] * (cancels - cancels // 2)
        + ["deadline"] * deadlines
    )
    kinds += ["complete"] * (scenario.requests - len(kinds))
    rng.shuffle(kinds)
    plans = []
    for index, kind in enumerate(kinds):
        length = rng.randint(*scenario.prompt_tokens)
        prompt = tuple(rng.randrange(_FIRST_ID, vocab_size) for _ in range(length))
        plan = dict(
            request_id=f"fault-{scenario.seed}-{index:05d}-{kind}",
            kind=kind,
            prompt_ids=prompt,
            max_tokens=scenario.max_tokens,
            timeout_s=scenario.timeout_s,
        )
        if kind == "cancel_early":
            plan["cancel_after_s"] = rng.uniform(0, scenario.cancel_window_s)
        elif kind == "cancel_late":
            plan["cancel_after_tokens"] = rng.randint(1, scenario.max_tokens - 1)
        elif kind == "deadline":
            plan["timeout_s"] = rng.choice(scenario.deadlines_s)
        plans.append(RequestPlan(**plan))
    return plans
