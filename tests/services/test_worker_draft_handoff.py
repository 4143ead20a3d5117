"""Real prefill and decode worker processes, both with the same ``--draft-model``: the reservation asks
for the draft's rows, the prefill worker sends them beside the target's over NIXL (counted apart), the
router's DecodeRequest says so, and the greedy tokens are the offline plain engine's."""

import grpc
import pytest

from common.sampling_params import SamplingParams
from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from router.dispatch import _decode_request
from services.engine import LLM
from tests.engine.test_draft_model import draft_overrides
from tests.services.routers import scrape
from tests.services.test_dispatch import metrics_port
from tests.services.workers import running_workers

PROMPT = list(range(30, 71))
FLAGS = ("--dtype", "float32", "--num-draft-tokens", "3")


@pytest.fixture(scope="module")
def workers(tiny_checkpoint):
    target, draft = tiny_checkpoint("k3"), tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))
    specs = [(role, "--draft-model", str(draft), *FLAGS) for role in ("decode", "prefill")]
    with running_workers(target, *specs) as (decode, prefill):
        channels = [grpc.insecure_channel(w.address) for w in (decode, prefill)]
        try:
            yield (
                target,
                workers_pb2_grpc.DecodeWorkerStub(channels[0]),
                workers_pb2_grpc.PrefillWorkerStub(channels[1]),
                prefill,
            )
        finally:
            for channel in channels:
                channel.close()


def test_the_draft_rows_go_in_the_same_handoff_and_tokens_stay_the_plain_engines(workers):
    target, decode, prefill, prefill_process = workers
    sampling = generation_pb2.SamplingParameters(max_tokens=8, ignore_eos=True)
    lease = decode.Reserve(
        workers_pb2.ReserveRequest(request_id="spec-1", prompt_ids=PROMPT, sampling=sampling), timeout=60
    )
    reserved = next(lease)
    reservation = reserved.reservation
    assert reservation.HasField("draft_slot") and len(reservation.draft_block_ids) > 0
    assert reservation.layout.HasField("draft") and reservation.layout.draft.model
    first = prefill.Prefill(
        workers_pb2.PrefillRequest(
            reservation=reservation, endpoint=reserved.endpoint, prompt_ids=PROMPT, sampling=sampling
        ),
        timeout=120,
    )
    assert reserved.endpoint.backend == "nixl"
    assert 0 < first.draft_transfer_bytes < first.transfer_bytes
    request = _decode_request("spec-1", first)  # the router's: it passes draft_state on
    assert request.draft_state
    decoded = list(decode.Decode(request, timeout=120))
    assert list(lease) == []
    tokens = [t for message in decoded for t in message.token_ids]
    usage = decoded[-1].usage  # the decode worker's drafts for this request, in its final usage
    assert usage.draft_tokens > 0 and 0 <= usage.accepted_draft_tokens <= usage.draft_tokens
    want = LLM(str(target), dtype="float32").generate(
        [PROMPT], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )[0]
    assert tokens == want.token_ids
    port = metrics_port(prefill_process)
    assert scrape(port, "baton_handoff_draft_bytes_total", backend="nixl") == first.draft_transfer_bytes
    for stub in (decode, prefill):
        after = stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10)
        assert after.ok, after.error
        assert (after.used_blocks, after.used_slots, after.reserved, after.held) == (0, 0, 0, 0)
