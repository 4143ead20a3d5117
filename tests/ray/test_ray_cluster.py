"""``baton serve --ray`` underneath: the cluster on a local Ray instance (1 prefill + 1 decode worker
actor, the router actor). A greedy request equals the offline engine with the state over NIXL; each
role is one placement group; a killed decode actor is restarted by Ray, re-reports its address and
is routed to again; a restarted router actor is given the current workers; ``stop()`` leaves no
actor, placement group or reserved CPU behind."""

import socket
import time

import grpc
import pytest
import ray
from ray.util.placement_group import placement_group_table

from common.prefix_hash import chain_root, extend_chain
from deploy.ray import RayCluster, RayClusterConfig, ServicePlacement
from deploy.ray.cache_actor import NodeCaches
from deploy.ray.cluster import init_ray
from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from router.server import RouterConfig
from services.engine import LLM, SamplingParams
from services.engine.engine_config import EngineConfig
from services.hicache.client import HostCacheClient
from services.hicache.host_tier import KV
from services.hicache.server import CacheConfig
from services.worker_config import ROLES, WorkerConfig

PROMPT = [(7 * i + 3) % 97 for i in range(40)]  # more than --local-prefill-tokens: handed off
MAX_TOKENS = 5
RAY_CPUS = 4
PAGE = 256  # a host tier page (one fake packed block)
SECRET = "ray-cluster-secret-" + "s" * 32


@pytest.fixture(scope="module")
def served(tiny_checkpoint):
    model = str(tiny_checkpoint("k3"))
    # Normal priority and retried start (see init_ray): the suite's other tests share the machine.
    init_ray(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    try:
        config = RayClusterConfig(
            router=RouterConfig(model=model, prefill=(), decode=(), port=0),
            workers={role: WorkerConfig(role, EngineConfig(model=model, dtype="float32")) for role in ROLES},
            ready_timeout_s=120,
            supervise_interval_s=0.2,
            cluster_secret=SECRET,  # as `baton serve --ray` always gives: every actor gets it as a value
        )
        cluster = RayCluster(config)
        try:
            want = LLM(model, dtype="float32").generate(
                [PROMPT], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
            )[0]
            yield cluster, want.token_ids
        finally:
            cluster.stop()
    finally:
        ray.shutdown()


def generate(address: str) -> tuple[list[int], generation_pb2.Route]:
    with grpc.insecure_channel(address) as channel:
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=PROMPT),
            sampling=generation_pb2.SamplingParameters(max_tokens=MAX_TOKENS, ignore_eos=True),
        )
        messages = list(generation_pb2_grpc.GenerationStub(channel).Generate(request, timeout=120))
    return [t for m in messages for t in m.token_ids], messages[-1].route


def test_a_request_through_the_router_actor_equals_the_offline_engine(served):
    cluster, want = served
    tokens, route = generate(cluster.endpoints.grpc)
    assert tokens == want
    assert route.transfer_backend == "nixl" and route.transfer_bytes > 0
    prefill, decode = cluster.addresses()
    assert route.prefill_worker == prefill[0] and route.decode_worker == "decode-0"
    # The router actor reached the workers with the secret; a call without it is refused.
    with grpc.insecure_channel(decode[0]) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            workers_pb2_grpc.DecodeWorkerStub(channel).Stats(workers_pb2.StatsRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_each_role_is_one_placement_group_with_a_bundle_per_worker(served):
    cluster, _ = served
    assert sorted(cluster.groups) == ["decode", "prefill"]
    for role, group in cluster.groups.items():
        table = placement_group_table(group)
        assert table["state"] == "CREATED" and table["strategy"] == "PACK"
        assert table["name"] == f"baton-{role}" and table["bundles"] == {0: {"CPU": 1.0}}
        (worker,) = [w for w in cluster.workers if w.role == role]
        assert worker.info.node_id == table["bundles_to_node_id"][0]


@pytest.mark.parametrize("strategy", ["PACK", "STRICT_PACK", "SPREAD"])
def test_a_worker_with_several_ranks_gets_adjacent_bundles(strategy):
    service = ServicePlacement(
        "decode", workers=2, num_cpus=2, num_gpus=1, strategy=strategy, ranks_per_worker=3
    )
    assert service.bundles() == [{"CPU": 2.0, "GPU": 1.0}] * 6
    assert [service.bundle_index(w, r) for w in range(2) for r in range(3)] == list(range(6))
    with pytest.raises(IndexError):
        service.bundle_index(0, 3)


@pytest.mark.parametrize(
    "field, overrides",
    [
        ("placement_strategy", {"strategy": "RANDOM"}),
        ("workers", {"workers": 0}),
        ("ranks_per_worker", {"ranks_per_worker": 0}),
        ("worker_num_cpus", {"num_cpus": 0, "num_gpus": 0}),
    ],
)
def test_placement_errors_name_the_field(field, overrides):
    with pytest.raises(ValueError, match=field):
        ServicePlacement(**{"role": "prefill", "workers": 1, **overrides})


def test_a_killed_decode_actor_comes_back_and_is_routed_to_again(served):
    cluster, want = served
    (decode,) = [w for w in cluster.workers if w.role == "decode"]
    before = decode.info
    ray.kill(decode.actor, no_restart=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        routed = ray.get(cluster.router.workers.remote(), timeout=30)[1]
        if decode.info.pid != before.pid and routed == (decode.info.address,):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"decode-0 did not come back: {decode.info} (router: {routed})")
    assert decode.restarts == 1 and decode.info.address != before.address
    tokens, route = generate(cluster.endpoints.grpc)  # the router kept its port
    assert tokens == want and route.transfer_backend == "nixl" and route.decode_worker == "decode-0"


def test_a_restarted_router_actor_is_given_the_current_workers(served):
    # Ray re-creates the router from its first config, which names decode-0's address from before
    # the previous test killed it; the supervisor sees the stale list and sends the current one.
    cluster, want = served
    before = ray.get(cluster.router.endpoints.remote(), timeout=30)
    ray.kill(cluster.router, no_restart=False)
    deadline, endpoints, routed = time.monotonic() + 60, before, None
    while time.monotonic() < deadline:
        try:  # port 0: the new incarnation listens on a new port
            endpoints = ray.get(cluster.router.endpoints.remote(), timeout=5)
            routed = ray.get(cluster.router.workers.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            pass  # restarting
        if endpoints.grpc != before.grpc and routed == cluster.addresses():
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the router did not come back with the current workers: {endpoints} {routed}")
    tokens, _ = generate(endpoints.grpc)
    assert tokens == want


def test_a_node_tier_actor_serves_its_node_and_comes_back_on_its_port(served):
    """The node's ``baton cache`` as ``RayCluster(host_cache=...)`` starts it: one actor per node on the
    fixed port; killed, Ray restarts it there and a worker's client attaches to the new, empty run."""
    cluster, _ = served
    node = cluster.workers[0].info.node_id
    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    caches = NodeCaches(CacheConfig(8 * PAGE, 0, port=port), max_restarts=-1, timeout_s=120)
    client = None
    try:
        address = caches.address_on(node)
        assert caches.address_on(node) == address and address.endswith(f":{port}") and len(caches.actors) == 1
        client = HostCacheClient(address, retry_s=0.2)
        assert client.attach("ray-layout", PAGE, 0) is not None
        hashes = extend_chain([], list(range(8)), 4, chain_root("model"))
        client.commit_put(client.reserve_put(KV, hashes).lease_id)
        assert client.match(hashes, has_state=False).kv_depth == 2
        ray.kill(caches.actors[node], no_restart=False)
        deadline = time.monotonic() + 60
        while client.epoch < 2:
            assert client.match(hashes, has_state=False).kv_depth in (0, 2)  # never an error
            assert time.monotonic() < deadline, "the client did not attach to the restarted tier"
            time.sleep(0.2)
        assert ray.get(caches.actors[node].address.remote(), timeout=30) == address
        assert client.outages >= 1 and client.match(hashes, has_state=False).kv_depth == 0
    finally:
        if client is not None:
            client.close()
        for actor in caches.actors.values():
            ray.kill(actor, no_restart=True)


def test_a_node_tier_needs_a_fixed_port():
    with pytest.raises(ValueError, match="host_cache.port: give a fixed port"):
        NodeCaches(CacheConfig(8 * PAGE, 0, port=0), max_restarts=-1, timeout_s=1)


def test_stop_leaves_no_actors_placement_groups_or_reserved_cpus(served):
    cluster, _ = served
    actors = [cluster.router] + [w.actor for w in cluster.workers]
    groups = list(cluster.groups.values())
    cluster.stop()
    for actor in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.endpoints.remote() if actor is actors[0] else actor.info.remote(), timeout=30)
    assert all(placement_group_table(g)["state"] == "REMOVED" for g in groups)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU") != RAY_CPUS and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == RAY_CPUS
    assert ray.is_initialized()  # the test started Ray, so the cluster leaves it running


def _parallel_config(strategy: str, num_gpus: float = 0.0) -> RayClusterConfig:
    workers = {role: WorkerConfig(role, EngineConfig(model="m")) for role in ROLES}
    workers["decode"] = WorkerConfig("decode", EngineConfig(model="m", tp=2, dcp=2, ep=2))
    return RayClusterConfig(
        router=RouterConfig(model="m", prefill=(), decode=(), port=0),
        workers=workers,
        decode_workers=2,
        placement_strategy=strategy,
        worker_num_gpus=num_gpus,
    )


def test_a_multi_rank_worker_gets_a_bundle_per_rank_on_one_node():
    prefill, decode = _parallel_config("STRICT_PACK").placements()
    assert (prefill.ranks_per_worker, len(prefill.bundles())) == (1, 1)
    assert (decode.ranks_per_worker, len(decode.bundles())) == (4, 8)  # tp 2 x dcp 2 (ep adds no rank)
    with pytest.raises(ValueError, match="--placement-strategy: a decode worker runs 4 ranks"):
        _parallel_config("PACK")
    with pytest.raises(ValueError, match="--worker-num-gpus: multi-rank decode workers"):
        _parallel_config("STRICT_PACK", num_gpus=1)
