"""``LocalCluster``: per-role worker flags reach the right processes; bad roles are refused up front."""

import grpc
import pytest

from proto.baton.v1 import workers_pb2, workers_pb2_grpc
from services.launcher import LocalCluster


def test_role_args_reach_each_role_s_workers(tiny_checkpoint):
    cluster = LocalCluster(
        str(tiny_checkpoint("k3")),
        port=0,
        prefill_workers=1,
        decode_workers=1,
        worker_args=["--dtype", "float32"],
        role_args={"prefill": ["--max-num-seqs", "3"], "decode": ["--max-num-seqs", "5"]},
    )
    try:
        slots = {}
        for worker in cluster.workers:
            with grpc.insecure_channel(worker.address) as channel:
                stub_class = (
                    workers_pb2_grpc.DecodeWorkerStub
                    if worker.role == "decode"
                    else workers_pb2_grpc.PrefillWorkerStub
                )
                slots[worker.role] = (
                    stub_class(channel).Stats(workers_pb2.StatsRequest(), timeout=10).total_slots
                )
    finally:
        cluster.stop()
    assert slots == {"prefill": 3, "decode": 5}


def test_an_unknown_role_is_refused_before_anything_starts(tiny_checkpoint):
    with pytest.raises(ValueError, match="role_args"):
        LocalCluster(str(tiny_checkpoint("k3")), 0, 1, 1, [], role_args={"router": ["--device", "cpu"]})
