"""The pretraining learning rate: linear warm-up, then a cosine down to a floor."""

import math


def learning_rate(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total``.

    Rises linearly over the first ``warmup`` steps to ``peak`` (step 0 takes ``peak / warmup``), then
    follows a half cosine from ``peak`` at step ``warmup`` to ``peak * min_ratio`` at step ``total - 1``.
    A pure function of the step, so a resumed run continues the schedule exactly.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - 1 - warmup)
    floor = peak * min_ratio
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
