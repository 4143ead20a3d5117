"""``LocalCluster``: per-role worker flags reach the right processes; bad roles are refused up front."""

import logging

import grpc
import pytest

from deploy.local.launcher import OUTPUT_TAIL_LINES, LocalCluster, ManagedWorker
from proto.baton.v1 import workers_pb2, workers_pb2_grpc
from services.engine.engine_config import EngineConfig
from services.worker_config import WorkerConfig


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


def test_worker_output_reaches_the_launcher_log_with_the_worker_name(tmp_path, caplog):
    config = WorkerConfig("decode", EngineConfig(model=str(tmp_path / "no-such-checkpoint")), name="decode-7")
    worker = ManagedWorker(config)
    with caplog.at_level(logging.INFO, logger="deploy.local.launcher"):
        with pytest.raises(RuntimeError, match="decode-7 did not become ready") as failure:
            worker.start(ready_timeout_s=120)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[decode-7] ")]
    assert logged, "the worker's lines were not logged"
    assert all(line.removeprefix("[decode-7] ") in failure.value.args[0] for line in logged[-3:])
    assert len(worker.output) <= OUTPUT_TAIL_LINES
