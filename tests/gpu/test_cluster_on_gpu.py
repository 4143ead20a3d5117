"""The cluster on a GPU (run on the device machine; skipped without CUDA): prefill and decode workers
with their pools in device memory, the handoff over NIXL from VRAM to VRAM, and greedy tokens and
logprobs equal to the single-process engine (batch-invariant mode, bitwise)."""

import grpc
import numpy as np
import pytest
import torch

from deploy.local.launcher import LocalCluster
from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from services.engine import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Two GPUs: prefill on the first, decode on the second (GPU to GPU); one GPU: both on it.
DECODE_DEVICE = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"


@pytest.mark.parametrize("family", ["k3"])
def test_disaggregated_on_gpu_equals_the_single_process_engine(tiny_checkpoint, family):
    model = tiny_checkpoint(family)
    cluster = LocalCluster(
        str(model),
        port=0,
        prefill_workers=1,
        decode_workers=1,
        worker_args=["--dtype", "float32", "--batch-invariant"],
        disaggregation="always",
        role_args={"prefill": ["--device", "cuda:0"], "decode": ["--device", DECODE_DEVICE]},
    )
    try:
        decode = next(w for w in cluster.workers if w.role == "decode")
        with grpc.insecure_channel(decode.address) as channel:
            stub = workers_pb2_grpc.DecodeWorkerStub(channel)
            lease = stub.Reserve(workers_pb2.ReserveRequest(request_id="probe", prompt_ids=[1, 2, 3]))
            reserved = next(lease)  # the reservation lives while this stream is open
            lease.cancel()
        assert {region.mem_type for region in reserved.endpoint.regions} == {"VRAM"}
        assert {region.device_id for region in reserved.endpoint.regions} == {int(DECODE_DEVICE[-1])}

        prompt = [(13 * i + 7) % 200 + 3 for i in range(300)]
        sampling = generation_pb2.SamplingParameters(max_tokens=16, ignore_eos=True, logprobs=0)
        with grpc.insecure_channel(f"127.0.0.1:{cluster.port}") as channel:
            messages = list(
                generation_pb2_grpc.GenerationStub(channel).Generate(
                    generation_pb2.GenerateRequest(
                        token_ids=generation_pb2.TokenIds(ids=prompt), sampling=sampling
                    ),
                    timeout=300,
                )
            )
    finally:
        cluster.stop()
    final = messages[-1]
    assert final.route.transfer_backend == "nixl" and final.route.transfer_bytes > 0
    want = LLM(str(model), device="cuda:0", dtype="float32", batch_invariant=True).generate(
        [prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0)
    )[0]
    assert [t for m in messages for t in m.token_ids] == want.token_ids
    got = np.asarray([p for m in messages for p in m.logprobs], dtype=np.float32).view(np.int32)
    assert got.tolist() == np.asarray(want.logprobs, dtype=np.float32).view(np.int32).tolist()
