"""The router pairs only prefill and decode workers whose handoff layouts map (``router/handoff_pairs.py``),
without worker processes: fake stubs record every call, so each test sees which worker got what.

A decode worker no prefill worker can write into is skipped, the Reserve carries the chosen sender's
layout, a sender that cannot write into the decode worker is never called, and when no pair maps the
request is prefilled on decode (``conditional``) or refused naming the field (``always``)."""

from copy import copy

import pytest

from common.metrics import Metrics
from proto.baton.v1 import generation_pb2, workers_pb2
from router.dispatch import Dispatcher
from router.handoff_pairs import NoMappablePair, pair_refusal
from router.worker_pool import Load, Worker, WorkerPool

PROMPT = list(range(1, 41))
DEGREES = {"tp": 1, "dcp": 1, "pcp": 1, "pp": 1, "ep": 1}


def cache_layout(dtype="float32", block_size=16, **degrees) -> workers_pb2.CacheLayout:
    parallel = workers_pb2.ParallelDegrees(**{**DEGREES, **degrees})
    return workers_pb2.CacheLayout(
        block_size=block_size,
        dtype=dtype,
        kv_format="auto",
        block_layout=f"blocks-{block_size}",
        slot_layout="slots",
        numerics="default",
        model="k3",
        parallel=parallel,
    )


class Call:
    """A server stream (or a unary future) as the dispatcher uses it."""

    def __init__(self, messages: list):
        self._messages = iter(messages)
        self._first = messages[0]

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._messages)

    def cancel(self):
        return True

    def result(self):
        return self._first


class FakeStub:
    """Answers like a worker and records ``(method, request)``."""

    def __init__(self, calls: list):
        self.calls = calls
        self.Prefill = self  # the dispatcher calls ``stub.Prefill.future(...)``

    def Reserve(self, request, timeout=None):
        self.calls.append(("Reserve", copy(request)))
        reservation = workers_pb2.CacheReservation(request_id=request.request_id, block_ids=[1, 2, 3])
        endpoint = workers_pb2.TransferEndpoint(backend="nixl")
        return Call([workers_pb2.ReserveResponse(reservation=reservation, endpoint=endpoint)])

    def future(self, request, timeout=None):
        self.calls.append(("Prefill", request))
        return Call([workers_pb2.PrefillResponse(first_token_id=7, transfer_bytes=100)])

    def Decode(self, request, timeout=None):
        self.calls.append(("Decode", request))
        return Call([generation_pb2.GenerateResponse(token_ids=[7, 8], finish_reason=1)])


class Context:
    def add_callback(self, callback):
        return True

    def is_active(self):
        return True

    def time_remaining(self):
        return None


def worker(role: str, name: str, layout, running: int = 0) -> Worker:
    calls: list = []
    fake = Worker(role, name, FakeStub(calls), channel=None, name=name, load=Load(running=running))
    fake.layout = layout
    return fake


def pool_of(prefill: list[Worker], decode: list[Worker]) -> WorkerPool:
    pool = WorkerPool([], [])
    pool.prefill, pool.decode = prefill, decode
    return pool


def run(pool: WorkerPool, disaggregation="conditional") -> tuple[Dispatcher, generation_pb2.Route]:
    """One request of ``PROMPT`` through ``pool``: the dispatcher and the route it took."""
    dispatcher = Dispatcher(pool, Metrics("router"), disaggregation, local_prefill_tokens=4)
    request = generation_pb2.GenerateRequest(sampling=generation_pb2.SamplingParameters(max_tokens=2))
    route = generation_pb2.Route()
    messages = list(dispatcher.run("r1", PROMPT, request, Context(), route))
    assert [m.token_ids for m in messages] == [[7, 8]]
    return dispatcher, route


def methods(fake: Worker) -> list[str]:
    return [method for method, _ in fake.stub.calls]


@pytest.mark.parametrize(
    "prefill, decode, refusal",
    [
        (cache_layout(), cache_layout(), None),
        (None, cache_layout(pcp=2), None),  # not heard yet: the workers judge
        (cache_layout(tp=2), cache_layout(dcp=2, block_size=4), None),  # ranks mapped: block sizes may differ
        (cache_layout(block_size=8), cache_layout(), "layout.block_size"),  # one rank each: whole rows
        (cache_layout(dtype="bfloat16", tp=2), cache_layout(dcp=2), "layout.dtype"),
        (cache_layout(), cache_layout(pcp=2), "decode --pcp 2"),
        (cache_layout(), cache_layout(pp=2), "decode --pp 2"),
    ],
    ids=["equal", "unknown", "tp2-into-dcp2", "block-size", "dtype", "decode-pcp", "decode-pp"],
)
def test_pair_refusal_names_the_field(prefill, decode, refusal):
    said = pair_refusal(prefill, decode)
    assert (said is None) if refusal is None else (refusal in said)


def test_a_decode_worker_no_prefill_worker_maps_into_is_skipped():
    sender = worker("prefill", "p", cache_layout(tp=2))
    idle_but_unmappable = worker("decode", "d-pcp", cache_layout(pcp=2), running=0)
    busy = worker("decode", "d-dcp", cache_layout(dcp=2, block_size=4), running=3)
    _, route = run(pool_of([sender], [idle_but_unmappable, busy]))
    assert route.decode_worker == "d-dcp" and route.prefill_worker == "p"
    assert methods(idle_but_unmappable) == [] and methods(busy) == ["Reserve", "Decode"]
    reserve = busy.stub.calls[0][1]
    assert reserve.prefill_layout == sender.layout, "the decode worker checks the chosen sender"


def test_a_prefill_worker_that_cannot_write_into_the_decode_worker_is_never_called():
    wrong_dtype = worker("prefill", "p-bf16", cache_layout(dtype="bfloat16", tp=2))
    right = worker("prefill", "p", cache_layout(tp=2))
    decode = worker("decode", "d", cache_layout(dcp=2, block_size=4))
    for _ in range(3):  # equal prefix scores rotate: the wrong one comes first in some of them
        _, route = run(pool_of([wrong_dtype, right], [decode]))
        assert route.prefill_worker == "p"
    assert methods(wrong_dtype) == [] and methods(right) == ["Prefill"] * 3
    assert all(request.prefill_layout == right.layout for m, request in decode.stub.calls if m == "Reserve")


def test_no_pair_maps_conditional_prefills_on_decode():
    prefill = worker("prefill", "p", cache_layout(dtype="bfloat16"))
    decode = worker("decode", "d", cache_layout())
    dispatcher, route = run(pool_of([prefill], [decode]))
    assert route.decode_worker == "d" and route.prefill_worker == ""
    assert methods(prefill) == [] and methods(decode) == ["Decode"]
    assert decode.stub.calls[0][1].HasField("local_prefill")
    assert dispatcher.metrics.local_prefills.labels("no_mappable_prefill")._value.get() == 1


def test_no_pair_maps_always_is_refused_naming_the_field():
    prefill = worker("prefill", "p", cache_layout(dtype="bfloat16"))
    decode = worker("decode", "d", cache_layout())
    with pytest.raises(NoMappablePair, match="prefill_layout: .*decode worker d: layout.dtype"):
        run(pool_of([prefill], [decode]), disaggregation="always")
    assert methods(prefill) == [] and methods(decode) == []


def test_the_pool_keeps_the_layout_a_full_picture_reports():
    pool = pool_of([], [])
    decode = worker("decode", "d", None)
    pool.decode = [decode]
    stats = workers_pb2.WorkerStats(worker="d", block_size=16)
    pool._heard(decode, workers_pb2.LoadUpdate(stats=stats, full=True, layout=cache_layout(dcp=2)))
    assert decode.layout == cache_layout(dcp=2)
    pool._heard(decode, workers_pb2.LoadUpdate(stats=stats))  # a delta keeps it
    assert decode.layout == cache_layout(dcp=2)
