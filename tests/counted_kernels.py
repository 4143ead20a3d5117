"""The library's triton kernels with a call counter around each (the real kernel still runs), so a
backend test can prove the path under test ran rather than pass vacuously (DESIGN.md section 4)."""

import dataclasses
from collections import Counter

from services.engine.model.backends import TritonKernels

KERNEL_FIELDS = frozenset(f.name for f in dataclasses.fields(TritonKernels)) - {"interpretable", "reads_fp8"}


def counting(library: TritonKernels) -> tuple[TritonKernels, Counter]:
    """``library`` with every kernel wrapped to count its calls; returns it and the live counter."""
    calls: Counter = Counter()

    def wrap(name: str):
        kernel = getattr(library, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return kernel(*args, **kwargs)

        return counted

    return dataclasses.replace(library, **{name: wrap(name) for name in KERNEL_FIELDS}), calls
