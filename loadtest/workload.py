"""What a load test sends: sessions of turns, each turn one request (the contract between workloads,
drivers and reports)."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Turn:
    """One request of a session.

    Attributes:
        prompt_ids: the whole prompt (the session's context so far and the new message).
        max_tokens: tokens to generate (the server is asked to ignore EOS, so this many come back).
        delay_s: wait after the session's previous turn (and its subagents) finished: think time or
            a tool call. Fixed-schedule replay sends the turn at ``max(at_s, previous done + delay_s)``.
        at_s: arrival time in seconds from the run's start, for fixed-schedule replay (trace
            timestamps); None when the trace gives none.
        subagents: sessions started together when this turn finishes; the session's next turn waits
            until all of them are done (an agent waiting on the subagents it spawned).
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    delay_s: float = 0.0
    at_s: float | None = None
    subagents: tuple["Session", ...] = ()


@dataclass(frozen=True)
class Session:
    """A conversation or agent run: turns sent one after another, never overlapping.

    ``session_id`` is sent to the server (decode affinity) and keys the per-session cache metrics.
    """

    session_id: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Workload:
    """Sessions to run, in order of start. Drivers decide when each session starts."""

    name: str
    sessions: tuple[Session, ...]
    description: str = ""
    meta: dict = field(default_factory=dict, compare=False)  # e.g. trace file, scale, seed

    def all_sessions(self) -> list[Session]:
        """Every session, subagents included (depth first)."""
        found: list[Session] = []

        def visit(session: Session) -> None:
            found.append(session)
            for turn in session.turns:
                for child in turn.subagents:
                    visit(child)

        for session in self.sessions:
            visit(session)
        return found
