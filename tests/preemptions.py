"""Which requests an engine's scheduler preempts (the tests that squeeze a cache assert some were)."""

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def counted_preemptions(llm) -> Iterator[list[str]]:
    """The ids of the requests ``llm``'s scheduler preempts inside the block, in order (its own
    ``_preempt`` still runs, and is put back after)."""
    scheduler = llm.engine.scheduler
    original, preempted = scheduler._preempt, []

    def counting(request):
        preempted.append(request.request_id)
        original(request)

    scheduler._preempt = counting
    try:
        yield preempted
    finally:
        scheduler._preempt = original
