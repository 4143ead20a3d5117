"""``LocalCluster``: per-role worker flags and ``baton serve``'s engine flags reach the right processes (as
each worker's ``--config`` file); bad roles are refused up front."""

import logging
import socket

import grpc
import pytest

from cli.main import build_parser
from cli.serve_command import worker_configs
from deploy.local.launcher import OUTPUT_TAIL_LINES, LocalCluster, ManagedWorker
from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
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
        slots = {worker.role: _stats(worker).total_slots for worker in cluster.workers}
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


def test_serve_engine_flags_reach_the_workers_through_their_config_files(tiny_checkpoint):
    """``baton serve --kv-format fp8 --block-size ...``: one WorkerConfig per role, handed to each worker
    process as its ``--config`` file; the workers run with it (their stats) and serve a request."""
    model = str(tiny_checkpoint("k3"))
    argv = ["serve", "--model", model, "--port", "0", "--dtype", "float32", "--kv-format", "fp8"]
    argv += ["--block-size", "32", "--kv-blocks", "48", "--max-num-seqs", "3", "--no-cuda-graphs"]
    argv += ["--max-model-len", "64"]
    configs = worker_configs(build_parser().parse_args(argv))
    assert {role: c.engine.kv_format for role, c in configs.items()} == {"prefill": "fp8", "decode": "fp8"}
    cluster = LocalCluster(model, 0, 1, 1, configs=configs)
    try:
        for worker in cluster.workers:
            stats = _stats(worker)
            assert (stats.block_size, stats.total_blocks, stats.total_slots) == (32, 48, 3), worker.name
            assert stats.node == socket.gethostname()  # no --node: the host (the cluster index's key)
        with grpc.insecure_channel(f"127.0.0.1:{cluster.port}") as channel:
            request = generation_pb2.GenerateRequest(
                token_ids=generation_pb2.TokenIds(ids=[(5 * i + 1) % 97 for i in range(40)]),
                sampling=generation_pb2.SamplingParameters(max_tokens=3, ignore_eos=True),
            )
            replies = list(generation_pb2_grpc.GenerationStub(channel).Generate(request, timeout=120))
            assert sum(len(r.token_ids) for r in replies) == 3
            assert replies[-1].route.transfer_bytes > 0  # handed off: fp8 blocks crossed between workers
            too_long = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[7] * 70))
            with pytest.raises(grpc.RpcError) as refused:  # by the router: --max-model-len reached it too
                list(generation_pb2_grpc.GenerationStub(channel).Generate(too_long, timeout=60))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "token_ids: 70 tokens leave no room under max_model_len (64)" in refused.value.details()
    finally:
        cluster.stop()


def test_serve_redis_flags_reach_the_configs_and_conflict_up_front(tiny_checkpoint):
    model = str(tiny_checkpoint("k3"))
    argv = ["serve", "--model", model, "--redis-url", "redis://cache:6379"]
    args = build_parser().parse_args(argv)
    assert {c.redis_url for c in worker_configs(args, args.redis_url).values()} == {"redis://cache:6379"}
    args = build_parser().parse_args([*argv, "--no-redis"])
    with pytest.raises(ValueError, match="--redis-url and --no-redis: choose one"):
        args.run(args)


def _stats(worker: ManagedWorker) -> workers_pb2.WorkerStats:
    """A launched worker's ``Stats``."""
    stub_class = (
        workers_pb2_grpc.DecodeWorkerStub if worker.role == "decode" else workers_pb2_grpc.PrefillWorkerStub
    )
    with grpc.insecure_channel(worker.address) as channel:
        return stub_class(channel).Stats(workers_pb2.StatsRequest(), timeout=10)
