"""A client's request_id is a label: two live requests may share it, and nothing sent through the public
API (or a worker's Release with that label) can end another request."""

import threading

import grpc

from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from tests.lifecycle.cluster import assert_idle, prompt_of, request


def test_two_requests_with_one_client_id_both_finish_in_full(slow, router_over):
    decode, prefill = slow
    router = router_over([prefill], [decode], disaggregation="conditional")
    shared_id = "same-id-from-two-clients"
    # One handed off (40 uncached tokens), one prefilled on decode (8): each path once per pair.
    prompts = [prompt_of(40, 1), prompt_of(40, 2), prompt_of(8, 3), prompt_of(8, 4)]
    results, errors = [None] * len(prompts), []

    def run(index):
        try:
            results[index] = list(router.stub.Generate(request(prompts[index], 12, shared_id), timeout=120))
        except grpc.RpcError as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    with grpc.insecure_channel(decode.address) as channel:  # the label reaches no worker state
        released = workers_pb2.ReleaseRequest(request_id=shared_id, no_handoff_in_flight=True)
        workers_pb2_grpc.DecodeWorkerStub(channel).Release(released, timeout=10)
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    for messages in results:
        assert sum(len(m.token_ids) for m in messages) == 12
        assert messages[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
        assert {m.request_id for m in messages} == {shared_id}, "the client's label is echoed"
    assert {bool(m[-1].route.prefill_worker) for m in results} == {True, False}
    assert_idle(decode, prefill, timeout_s=10)


def test_without_a_client_id_each_request_gets_its_own(slow, router_over):
    decode, prefill = slow
    router = router_over([prefill], [decode], disaggregation="never")
    finals = [list(router.stub.Generate(request(prompt_of(4, 5), 1), timeout=60))[-1] for _ in range(2)]
    ids = {final.request_id for final in finals}
    assert len(ids) == 2 and all(len(i) >= 32 for i in ids)
