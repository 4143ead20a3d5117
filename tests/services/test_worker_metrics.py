"""A worker serves ``/metrics``: pool occupancy gauges follow its engine."""

import time
from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families

from services.engine import SamplingParams
from services.engine.engine_config import EngineConfig
from services.worker_config import WorkerConfig
from services.worker_server import WorkerServer


def scrape(port: int) -> dict:
    text = urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_decode_worker_gauges_follow_the_pools(tiny_checkpoint):
    engine = EngineConfig(model=str(tiny_checkpoint("k3")), dtype="float32", num_blocks=64, max_num_seqs=4)
    server = WorkerServer(WorkerConfig(role="decode", engine=engine, port=0, transfer_backend="grpc_bytes"))
    try:
        role = (("role", "decode"),)
        idle = scrape(server.metrics_port)
        assert idle[("baton_kv_blocks_capacity", role)] == 64
        assert idle[("baton_kda_slots_capacity", role)] == 4
        assert idle[("baton_kv_blocks_used", role)] == 0
        # The prefix cache's counters come with every pass; without a tier, none of the tier's series.
        assert idle[("baton_prefix_cache_hit_tokens_total", (("kind", "kv"), ("tier", "device")))] == 0
        assert ("baton_hicache_tier_up", role) not in idle
        server.engine.loop.call(lambda e: e.reserve(list(range(40)), SamplingParams(), "held-open"))
        server.engine.loop.call(lambda e: None)  # one more loop pass refreshes the gauges
        busy = scrape(server.metrics_port)
        assert busy[("baton_kv_blocks_used", role)] == 3 and busy[("baton_kda_slots_used", role)] == 1
        assert busy[("baton_requests_running", role)] == 1
        server.engine.loop.call(lambda e: e.abort("held-open"))
        assert idle[("baton_request_queue_time_seconds_count", ())] == 0
        server.engine.loop.call(
            lambda e: e.add_request(list(range(10)), SamplingParams(max_tokens=2), "queued")
        )
        deadline = time.monotonic() + 10
        while scrape(server.metrics_port)[("baton_request_queue_time_seconds_count", ())] == 0:
            assert time.monotonic() < deadline, "the started request's queue time was never observed"
            time.sleep(0.05)
    finally:
        server.stop()


def test_a_decode_worker_frees_a_reservation_nobody_completes(tiny_checkpoint):
    engine = EngineConfig(model=str(tiny_checkpoint("k3")), dtype="float32", num_blocks=64, max_num_seqs=4)
    config = WorkerConfig(
        role="decode", engine=engine, port=0, transfer_backend="grpc_bytes", reservation_ttl_s=0.5
    )
    server = WorkerServer(config)
    try:
        server.engine.loop.call(lambda e: e.reserve(list(range(40)), SamplingParams(), "orphan"))
        assert server.stats.latest().running == 1
        deadline = time.monotonic() + 10
        while server.stats.latest().running:
            assert time.monotonic() < deadline, "the orphaned reservation was never freed"
            time.sleep(0.1)
        assert server.stats.latest().free_blocks == 64
    finally:
        server.stop()
