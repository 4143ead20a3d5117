"""Handoffs into and out of parallel workers over NIXL, rank by rank: one pair of real worker processes
(gloo rank groups, every rank its own NIXL agent on host memory), a PCP 2 prefill group writing into a
TP 2 decode group, both batch-invariant, block sizes 8 and 4.

Each prefill rank writes only its share of the request into the decode ranks that own it (the KDA heads
split over the decode TP ranks, the MLA rows whole on both, staged once): the bytes each rank reports
are its share by the plan, they add up to no more than the decode group holds for the request, and the
log-probs equal, bitwise, the decode worker's own prefill of the prompt. A pair that cannot be mapped is
refused before any work, naming the field (a forged reservation at Prefill, a forged sender layout at
Reserve), and a rank whose write fails fails the Prefill call without taking either group down. Through
the router, every decode rank's endpoint reaches the prefill worker. Every decode rank hashes what
landed in it, and the sum must be the prefill ranks' (a forged checksum is refused, and the decode
group's own prefill gives the same tokens)."""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc
import numpy as np
import pytest

from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from services.engine.model import load_model_config
from services.engine.parallel.group_handoff import handoff_side
from services.engine.parallel.handoff_plan import HandoffRequestRows, plan_handoff
from services.engine.parallel.layout import ParallelLayout
from services.rpc.convert import reservation_from_pb
from tests.lifecycle.cluster import worker_metric
from tests.services.routers import router_factory
from tests.services.workers import WorkerProcess

PROMPT = [(5 * i + 2) % 97 for i in range(40)]  # > 32 tokens: pcp 2 splits it into real chunks
MAX_TOKENS = 5
SIZES = ("--dtype", "float32", "--max-model-len", "64", "--max-num-seqs", "2")
ONE_RANK = {"tp": 1, "dcp": 1, "pcp": 1, "pp": 1, "ep": 1}
SAMPLING = generation_pb2.SamplingParameters(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return tiny_checkpoint("k3")


INVARIANT = "--batch-invariant"
GROUPS = {
    "decode": ("decode", "--tp", "2", "--block-size", "4", INVARIANT),
    "prefill": ("prefill", "--pcp", "2", "--block-size", "8", INVARIANT),
}


@pytest.fixture(scope="module")
def groups(model):
    """The two groups every test uses, started at once (their rendezvous overlap on a small machine)."""
    started = start_all(model, GROUPS)
    try:
        yield started
    finally:
        stop_all(started.values())


@pytest.fixture
def workers(groups):
    stubs = Workers(groups["decode"], groups["prefill"])
    yield stubs
    stubs.close()


def start_all(model, specs: dict[str, tuple[str, ...]]) -> dict[str, WorkerProcess]:
    """Start every ``name -> (role, *flags)`` worker side by side (rank groups wait on each other's
    rendezvous, so the starts overlap); stop the started ones if any fails."""
    with ThreadPoolExecutor(len(specs)) as pool:
        starts = {
            name: pool.submit(WorkerProcess, role, model, *flags, *SIZES)
            for name, (role, *flags) in specs.items()
        }
    started = {name: start.result() for name, start in starts.items() if start.exception() is None}
    if len(started) < len(specs):
        stop_all(started.values())
        raise next(start.exception() for start in starts.values() if start.exception() is not None)
    return started


def stop_all(processes) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(WorkerProcess.stop, processes))


class Workers:
    """A decode and a prefill worker's stubs."""

    def __init__(self, decode: WorkerProcess, prefill: WorkerProcess):
        self.channels = [grpc.insecure_channel(process.address) for process in (decode, prefill)]
        self.decode = workers_pb2_grpc.DecodeWorkerStub(self.channels[0])
        self.prefill = workers_pb2_grpc.PrefillWorkerStub(self.channels[1])

    def reserve(self, request_id: str, **fields):
        """``(ReserveResponse, lease)``: the reservation lives while the lease stream is open."""
        request = workers_pb2.ReserveRequest(
            request_id=request_id, prompt_ids=PROMPT, sampling=SAMPLING, **fields
        )
        lease = self.decode.Reserve(request, timeout=60)
        return next(lease), lease

    def prefill_into(self, reserved, **changes) -> workers_pb2.PrefillResponse:
        fields = dict(
            reservation=reserved.reservation,
            endpoint=reserved.endpoint,
            rank_endpoints=reserved.rank_endpoints,
            prompt_ids=PROMPT,
            sampling=SAMPLING,
        )
        return self.prefill.Prefill(workers_pb2.PrefillRequest(**{**fields, **changes}), timeout=120)

    def handoff(self, request_id: str, forge_checksum: bool = False):
        """Reserve, prefill (the handoff), decode with the prefill's checksum as the router passes it
        on (``forge_checksum``: one off): ``(ReserveResponse, PrefillResponse, tokens, logprobs)``."""
        reserved, lease = self.reserve(request_id)
        first = self.prefill_into(reserved)
        decode = workers_pb2.DecodeRequest(
            request_id=request_id,
            first_token_id=first.first_token_id,
            first_logprob=first.first_logprob,
            handoff_checksum=(first.handoff_checksum + forge_checksum) % (1 << 64),
            handoff_checksum_spans=first.handoff_checksum_spans,
        )
        decoded = list(self.decode.Decode(decode, timeout=120))
        assert list(lease) == [], "the lease ends once Decode has taken the reservation over"
        tokens = [t for message in decoded for t in message.token_ids]
        return reserved, first, tokens, [p for message in decoded for p in message.logprobs]

    def colocated(self, request_id: str):
        """The decode worker prefills and decodes the prompt itself: ``(tokens, logprobs)``."""
        local = workers_pb2.LocalPrefill(prompt_ids=PROMPT, sampling=SAMPLING)
        request = workers_pb2.DecodeRequest(request_id=request_id, local_prefill=local)
        decoded = list(self.decode.Decode(request, timeout=120))
        return [t for m in decoded for t in m.token_ids], [p for m in decoded for p in m.logprobs]

    def nothing_held(self) -> bool:
        reports = [stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=30) for stub in self.stubs]
        return all(r.ok and r.used_blocks == r.used_slots == r.reserved == r.held == 0 for r in reports)

    @property
    def stubs(self):
        return (self.decode, self.prefill)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def plan_bytes(model, reserved, prefill: ParallelLayout, prefill_block_size: int) -> list[int]:
    """Each prefill rank's share of the request by the plan (which rank sends which bytes)."""
    decode_layout = reservation_from_pb(reserved.reservation).layout
    prefill_layout = replace(decode_layout, parallel=prefill, block_size=prefill_block_size)
    prefill_ids = tuple(range(-(-len(PROMPT) // prefill_block_size)))
    decode_ids = tuple(reserved.reservation.block_ids)
    rows = HandoffRequestRows(
        len(PROMPT), prefill_ids, 0, decode_ids, reserved.reservation.slot, reserved.reservation.cached_tokens
    )
    sides = handoff_side(prefill_layout), handoff_side(decode_layout)
    plan = plan_handoff(load_model_config(model), *sides, rows)
    return [sum(int(write.nbytes.sum()) for write in plan[rank].writes) for rank in sorted(plan)]


def decode_room(reserved) -> int:
    """The most the decode group can need for the request: its blocks and slot, on every rank."""
    blocks, total = len(reserved.reservation.block_ids), 0
    for endpoint in reserved.rank_endpoints or [reserved.endpoint]:
        row_bytes = {region.name: region.row_bytes for region in endpoint.regions}
        total += blocks * row_bytes["blocks"] + row_bytes["state"]
    return total


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_pairs_that_cannot_be_mapped_and_a_failing_rank_are_refused(workers):
    # A sender the decode group cannot take: refused at Reserve, before any room is held.
    forged_sender = workers_pb2.CacheLayout()
    forged_sender.CopyFrom(fed_layout(workers.prefill))
    forged_sender.dtype = "bfloat16"
    error = refused(lambda: workers.reserve("forged-sender", prefill_layout=forged_sender))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("prefill_layout: ") and "reservation.layout.dtype" in error.details()
    assert workers.nothing_held()
    # A decode layout the plan cannot map: refused at Prefill before any prefill work, naming the field.
    reserved, lease = workers.reserve("unmappable", prefill_layout=fed_layout(workers.prefill))
    for degrees, field in (({"pcp": 2}, "decode --pcp 2"), ({"tp": 3}, "decode --tp 3")):
        forged = workers_pb2.CacheReservation()
        forged.CopyFrom(reserved.reservation)
        forged.layout.parallel.CopyFrom(workers_pb2.ParallelDegrees(**{**ONE_RANK, "tp": 2, **degrees}))
        error = refused(lambda forged=forged: workers.prefill_into(reserved, reservation=forged))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and field in error.details()
    # A decode rank's endpoint that cannot take its share: that rank's write fails, so does the call.
    broken = workers_pb2.TransferEndpoint()
    broken.CopyFrom(reserved.rank_endpoints[1])
    for region in broken.regions:
        region.num_rows = 1
    endpoints = [reserved.rank_endpoints[0], broken]
    error = refused(lambda: workers.prefill_into(reserved, rank_endpoints=endpoints))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "handoff writes failed: rank" in error.details() and "pass its end" in error.details()
    workers.decode.Release(workers_pb2.ReleaseRequest(request_id="unmappable", no_handoff_in_flight=True))
    assert list(lease) == []
    assert workers.nothing_held()


def test_pcp2_prefill_into_tp2_decode_rank_by_rank_bitwise(model, groups, workers):
    # Both groups are still up after the refusals: the handoff itself.
    checks = lambda: worker_metric(groups["decode"], "baton_handoff_checks_total")  # noqa: E731
    refused_ = lambda: worker_metric(groups["decode"], "baton_handoff_refused_total", reason="checksum")  # noqa: E731
    checked_before, refused_before = checks(), refused_()
    reserved, first, tokens, logprobs = workers.handoff("pcp-tp")
    # Every decode rank hashed what landed in it and the sum was the prefill ranks' (else: refused).
    assert first.HasField("handoff_checksum") and first.handoff_checksum_spans
    assert (checks(), refused_()) == (checked_before + 1, refused_before)
    assert len(reserved.rank_endpoints) == 2 and reserved.rank_endpoints[0] == reserved.endpoint
    assert reserved.reservation.layout.parallel.tp == 2
    sent = list(first.rank_transfer_bytes)
    assert sent == plan_bytes(model, reserved, ParallelLayout(pcp=2), 8)
    assert all(nbytes > 0 for nbytes in sent), sent  # both PCP ranks send a share
    assert sum(sent) == first.transfer_bytes <= decode_room(reserved)
    want_tokens, want_logprobs = workers.colocated("colocated")
    assert tokens == want_tokens and len(logprobs) == MAX_TOKENS
    bits = np.asarray(logprobs, dtype=np.float32).view(np.int32)
    assert bits.tolist() == np.asarray(want_logprobs, dtype=np.float32).view(np.int32).tolist()
    # Through the router: it pairs the two by their fed layouts, the decode worker checks the sender at
    # Reserve, and every decode rank's endpoint reaches the prefill worker (else the handoff would fail
    # and the decode worker prefill the prompt itself, with no bytes moved).
    with router_factory(model, disaggregation="always") as make:
        router = make([groups["prefill"]], [groups["decode"]])
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=PROMPT), sampling=SAMPLING
        )
        routed = list(router.stub.Generate(request, timeout=120))
    # The decode group kept the prompt's blocks from the handoff above: only the rest and the slot move.
    assert routed[-1].route.prefill_worker == groups["prefill"].address
    assert 0 < routed[-1].route.transfer_bytes < first.transfer_bytes
    assert [t for m in routed for t in m.token_ids] == want_tokens
    # A checksum that is not the landed bytes' is refused: the decode group prefills the prompt itself.
    _, _, forged_tokens, _ = workers.handoff("pcp-tp-forged", forge_checksum=True)
    assert forged_tokens == want_tokens and refused_() == refused_before + 1
    assert workers.nothing_held()


def fed_layout(stub) -> workers_pb2.CacheLayout:
    """The handoff layout a worker's load feed reports on its first (full) picture."""
    feed = stub.WatchLoad(workers_pb2.WatchLoadRequest(), timeout=30)
    first = next(feed)
    feed.cancel()
    return first.layout
