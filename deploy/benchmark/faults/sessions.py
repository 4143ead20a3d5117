"""Multi-turn sessions for a fault run on the HiCache tier: each session's turn ``k + 1`` is its turn ``k``
(prompt and output) plus a little new text, and every session starts from one shared system prefix, so
later turns find their prefix cached, in a device pool or in the node's tier.

    session i:  [system][own text_i]                           turn 0
                [system][own text_i][out_0][new_1]             turn 1
                ...                                            until the context is long: start over

``SessionTraffic`` runs the sessions on threads of this process (one SDK client each, no SDK retry, so
every failure is the router's own answer) until ``stop()``; each turn ends as a ``TurnOutcome`` with its
usage (``cached_tokens_host``: tokens the serving worker loaded from the tier).
"""

import random
import threading
import time
from dataclasses import dataclass

from sdk import Client, RetryPolicy
from sdk.errors import BatonError

_FIRST_ID = 3  # skips pad, bos and eos of the random checkpoints


@dataclass(frozen=True)
class SessionPlan:
    """The shape of every session: token counts of the shared system prefix, of a session's own first text
    and of each later turn's new text; ``max_tokens`` generated per turn; a session starts over (same system
    prefix, new text) before its prompt would pass ``max_prompt_tokens``; ``think_s`` between a session's
    turns (an agent's own work: it also leaves the cores to a process being restarted).

    Raises:
        ValueError: a count out of range, naming the field.
    """

    sessions: int = 4
    system_tokens: int = 16
    first_tokens: int = 32
    new_tokens: int = 8
    max_tokens: int = 4
    max_prompt_tokens: int = 88
    think_s: float = 0.1
    timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self):
        for field in ("sessions", "system_tokens", "first_tokens", "new_tokens", "max_tokens"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field}: must be >= 1, got {getattr(self, field)}")
        if self.think_s < 0:
            raise ValueError(f"think_s: must be >= 0, got {self.think_s}")
        if self.max_prompt_tokens < self.system_tokens + self.first_tokens:
            raise ValueError(
                f"max_prompt_tokens: {self.max_prompt_tokens} cannot hold a first turn "
                f"(system_tokens + first_tokens = {self.system_tokens + self.first_tokens})"
            )


@dataclass(frozen=True)
class TurnOutcome:
    """One turn: its final status (``OK`` or the gRPC code's name), usage and times (``time.monotonic()``)."""

    session: int
    turn: int
    status: str
    prompt_tokens: int
    cached_tokens: int
    cached_tokens_host: int
    sent: float
    ended: float
    detail: str = ""


class SessionTraffic:
    """``plan.sessions`` sessions against the router at ``address``, turn after turn, until ``stop()``.

    ``finished()`` counts the turns that have ended; ``outcomes()`` (after ``stop()``) lists them all in the
    order they ended.
    """

    def __init__(self, address: str, plan: SessionPlan, vocab_size: int):
        self.plan = plan
        self._address = address
        self._vocab_size = vocab_size
        self._outcomes: list[TurnOutcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        rng = random.Random(plan.seed)
        self._system = [rng.randrange(_FIRST_ID, vocab_size) for _ in range(plan.system_tokens)]
        self._threads = [
            threading.Thread(target=self._run, args=(index,), name=f"session-{index}", daemon=True)
            for index in range(plan.sessions)
        ]
        for thread in self._threads:
            thread.start()

    def finished(self) -> int:
        """Turns that have ended so far."""
        return len(self._outcomes)

    def since(self, moment: float) -> list[TurnOutcome]:
        """The turns sent at or after ``moment`` that have ended."""
        with self._lock:
            return [outcome for outcome in self._outcomes if outcome.sent >= moment]

    def stop(self, timeout_s: float = 120.0) -> list[TurnOutcome]:
        """Send no further turn, wait for those in flight, return every outcome.

        Raises:
            TimeoutError: a turn still running after ``timeout_s``.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise TimeoutError(f"{thread.name}: a turn still running after {timeout_s:.0f} s")
        return self.outcomes()

    def outcomes(self) -> list[TurnOutcome]:
        """Every turn ended so far, in the order they ended."""
        with self._lock:
            return list(self._outcomes)

    def _run(self, session: int) -> None:
        plan = self.plan
        rng = random.Random(f"{plan.seed}-{session}")
        new = lambda count: [rng.randrange(_FIRST_ID, self._vocab_size) for _ in range(count)]  # noqa: E731
        prompt, turn = self._system + new(plan.first_tokens), 0
        with Client(self._address, timeout_s=plan.timeout_s, retry=RetryPolicy(max_attempts=1)) as client:
            while not self._stop.is_set():
                outcome, output = self._turn(client, session, turn, prompt)
                with self._lock:
                    self._outcomes.append(outcome)
                prompt, turn = prompt + output + new(plan.new_tokens), turn + 1
                if len(prompt) + plan.max_tokens > plan.max_prompt_tokens:  # a new conversation
                    prompt = self._system + new(plan.first_tokens)
                self._stop.wait(plan.think_s)

    def _turn(self, client: Client, session: int, turn: int, prompt: list[int]) -> tuple[TurnOutcome, list]:
        """One turn, never raising: a failure is its outcome (and the next turn adds no output)."""
        sent = time.monotonic()
        try:
            done = client.generate(
                prompt_ids=prompt,
                max_tokens=self.plan.max_tokens,
                ignore_eos=True,
                session_id=f"session-{session}",
            )
        except BatonError as error:
            ended, status = time.monotonic(), error.code.name
            return TurnOutcome(session, turn, status, len(prompt), 0, 0, sent, ended, error.details), []
        usage = done.usage
        status = "OK" if len(done.token_ids) == self.plan.max_tokens else "INCOMPLETE"
        outcome = TurnOutcome(
            session,
            turn,
            status,
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.cached_tokens_host,
            sent,
            time.monotonic(),
        )
        return outcome, list(done.token_ids)
