"""Open-loop arrival processes: the gaps between session starts for a request-rate run.

``poisson``: exponential gaps, mean ``1 / rate``. ``gamma``: gamma gaps with shape ``burstiness``
and scale ``1 / (rate * burstiness)`` — the same mean, coefficient of variation
``1 / sqrt(burstiness)`` (vLLM ``bench serve``'s convention: 1 is Poisson, below 1 burstier, above
1 more even). Seeded, so a run's arrival times are reproducible.
"""

import random
from collections.abc import Iterator

PROCESSES = ("poisson", "gamma")


def arrival_gaps(
    rate: float, process: str = "poisson", burstiness: float = 1.0, seed: int = 0
) -> Iterator[float]:
    """An endless iterator of gaps in seconds.

    Args:
        rate: mean arrivals per second (> 0).
        process: ``poisson`` or ``gamma``.
        burstiness: the gamma shape (> 0); ignored by ``poisson``.
        seed: seeds a private ``random.Random``.

    Raises:
        ValueError: naming the flag (``--rate``, ``--arrival``, ``--burstiness``).
    """
    if not rate > 0:
        raise ValueError(f"--rate: must be positive, got {rate}")
    if process not in PROCESSES:
        raise ValueError(f"--arrival: expected one of {', '.join(PROCESSES)}, got {process!r}")
    if not burstiness > 0:
        raise ValueError(f"--burstiness: must be positive, got {burstiness}")
    rng = random.Random(seed)
    while True:
        if process == "poisson":
            yield rng.expovariate(rate)
        else:
            yield rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
