"""Fault injection for tests and chaos drills: a worker pauses at a named phase of a request's path
(``baton worker --fault-delay PHASE=SECONDS``), so a cancel, a deadline or a killed process can be
made to land exactly there.

    decode   reserve        before reserving: the caller may give up before Reserve answers
             decode_start   the handoff's state has arrived, decoding has not started
    prefill  prefill        before computing: decode's reservation exists, no prefill work has begun
             handoff        computed, the caller was still there: a cancel now lands while the write
                            into decode goes ahead (as if the write had already started)
"""

import time
from dataclasses import dataclass

PHASES = {"decode": ("reserve", "decode_start"), "prefill": ("prefill", "handoff")}


@dataclass(frozen=True)
class FaultDelays:
    """Seconds to pause per phase; phases not listed do not pause."""

    seconds: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, role: str, specs: list[str] | tuple[str, ...]) -> "FaultDelays":
        """``["reserve=0.5", ...]`` for a worker of ``role``.

        Raises:
            ValueError: naming ``fault_delay``: not PHASE=SECONDS, a phase the role does not have, or
                a negative or non-numeric number of seconds.
        """
        known = PHASES.get(role, ())
        parsed = {}
        for spec in specs:
            phase, sep, value = spec.partition("=")
            if not sep:
                raise ValueError(f"fault_delay: {spec!r} is not PHASE=SECONDS")
            if phase not in known:
                raise ValueError(
                    f"fault_delay: {phase!r} is not a {role} phase (one of {', '.join(known) or 'none'})"
                )
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(f"fault_delay: {value!r} ({phase}) is not a number of seconds") from None
            if not 0 <= seconds < float("inf"):
                raise ValueError(f"fault_delay: {phase} must be >= 0 seconds, got {value}")
            parsed[phase] = seconds
        return cls(tuple(sorted(parsed.items())))

    def pause(self, phase: str) -> None:
        """Sleep for ``phase``'s delay (none when it has none)."""
        seconds = dict(self.seconds).get(phase, 0.0)
        if seconds:
            time.sleep(seconds)


NO_FAULTS = FaultDelays()
