"""``fanout.open_calls``: a prompt's first sample is sent alone, its siblings only once every first sample
has sent its first message (its prompt prefilled and cached), and every started call is in ``calls``
even when a first sample is refused."""

import asyncio

import grpc
import pytest

from router.openai import fanout


class _Call:
    """A stand-in for a streaming ``Generate`` call: logs its start and its first message."""

    def __init__(self, message: str, log: list, refuse: bool = False):
        self.message, self.log, self.refuse = message, log, refuse
        log.append(("start", message))

    async def _replies(self):
        await asyncio.sleep(0.01)
        if self.refuse:
            raise grpc.aio.AioRpcError(grpc.StatusCode.INVALID_ARGUMENT, None, None, "refused")
        self.log.append(("first", self.message))
        yield f"{self.message}:0"
        yield f"{self.message}:1"

    def __aiter__(self):
        return self._replies()


def test_siblings_start_after_every_first_sample_has_answered():
    log, calls = [], []
    messages = ["p0.s0", "p0.s1", "p0.s2", "p1.s0", "p1.s1", "p1.s2"]
    leaders = [m.endswith("s0") for m in messages]
    replies, firsts = asyncio.run(fanout.open_calls(calls, lambda m: _Call(m, log), messages, leaders))
    assert firsts == [f"{m}:0" for m in messages]
    assert len(calls) == 6 and [c.message for c in calls] == [
        "p0.s0",
        "p1.s0",
        "p0.s1",
        "p0.s2",
        "p1.s1",
        "p1.s2",
    ]
    first_sibling = log.index(("start", "p0.s1"))
    assert {("first", "p0.s0"), ("first", "p1.s0")} <= set(log[:first_sibling])


def test_a_refused_first_sample_starts_no_sibling_and_leaves_its_calls_to_cancel():
    log, calls = [], []
    messages = ["p0.s0", "p0.s1"]
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(
            fanout.open_calls(calls, lambda m: _Call(m, log, refuse=m == "p0.s0"), messages, [True, False])
        )
    assert [c.message for c in calls] == ["p0.s0"] and ("start", "p0.s1") not in log
