"""HiCache in the chart: ``baton cache`` as a DaemonSet on the node's port (hostPort, no host network),
every worker given its own node's address (status.hostIP), the tier's page files in a node directory both
mount at one path, only workers let in; off by default."""

import math
import os
import stat
import subprocess
import tempfile

import pytest

from cli.cache_command import config_from
from cli.main import build_parser
from common.cluster_secret import write_cluster_secret
from services.hicache.server import GIB
from services.worker_config import load_worker_config
from tests.deploy import chart

ON = ("--set", "hicache.enabled=true")
COMPONENTS = ("router", "prefill", "decode", "hicache")


def _pod(objects: list[dict], component: str) -> dict:
    kind = "DaemonSet" if component == "hicache" else "Deployment"
    return chart.one(objects, kind, f"baton-{component}")["spec"]["template"]


def _selected(selector: dict, objects: list[dict]) -> list[str]:
    return [c for c in COMPONENTS if chart.selects(selector, _pod(objects, c)["metadata"]["labels"])]


def _tier_config(container: dict):
    """The tier container's ``CacheConfig`` as ``baton cache`` parses its args, the cluster secret read
    from a file of this machine in place of the pod's mount."""
    with tempfile.TemporaryDirectory() as folder:
        secret_file = write_cluster_secret(os.path.join(folder, "cluster-secret"))
        flag = "--cluster-secret-file="
        args = [f"{flag}{secret_file}" if arg.startswith(flag) else arg for arg in container["args"]]
        assert args != container["args"]  # the chart passes the flag
        return config_from(build_parser().parse_args(args))


def _shm_dir(objects: list[dict]) -> str:
    """The DaemonSet's ``baton cache --shm-dir``, as the command parses it."""
    container = _pod(objects, "hicache")["spec"]["containers"][0]
    return _tier_config(container).shm_dir


def _shared_directory(pod_spec: dict, container: dict) -> tuple[dict, str] | None:
    """The HiCache page directory's hostPath and where ``container`` mounts it; None when it is not there."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    mounts = [m for m in container.get("volumeMounts", []) if "hostPath" in volumes[m["name"]]]
    if not mounts:
        return None
    (mount,) = mounts
    return volumes[mount["name"]]["hostPath"], mount["mountPath"]


def test_the_daemonset_runs_baton_cache_on_the_node_port_with_its_budgets():
    with_redis = chart.render("default", *ON, "--set", "redis.enabled=true")
    args = chart.args(_pod(with_redis, "hicache")["spec"]["containers"][0])
    assert args["--redis-url"] == "redis://baton-redis:6379/0"  # publishes to the cluster index
    assert "--redis-l3-gib" not in args  # no L3 by default
    l3 = chart.render("default", *ON, "--set", "redis.enabled=true", "--set", "hicache.redisL3Gib=16")
    container = _pod(l3, "hicache")["spec"]["containers"][0]
    assert _tier_config(container).l3_budget_bytes == 16 * GIB
    no_redis = chart.render("default", *ON, "--set", "hicache.redisL3Gib=16")  # no Redis: no L3
    assert "--redis-l3-gib" not in chart.args(_pod(no_redis, "hicache")["spec"]["containers"][0])
    objects = chart.render("default", *ON, "--set-json", "hicache.kvGib=2.5", "--set", "hicache.kdaGib=1")
    pod = _pod(objects, "hicache")["spec"]
    assert "hostNetwork" not in pod and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    config = _tier_config(container)
    assert (config.kv_budget_bytes, config.kda_budget_bytes) == (int(2.5 * GIB), GIB)
    assert (config.host, config.port, config.node, config.redis_url) == ("0.0.0.0", 50070, "$(NODE_NAME)", "")
    assert config.tenant_cache_reserve_pages == 0  # no reserve by default: plain LRU
    reserved = chart.render("default", *ON, "--set", "hicache.tenantCacheReservePages=1000000")
    tier = _pod(reserved, "hicache")["spec"]["containers"][0]
    assert _tier_config(tier).tenant_cache_reserve_pages == 10**6  # an integer, not 1e+06
    assert chart.env(container)["NODE_NAME"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}
    }  # the workers' node
    grpc_port, metrics_port = container["ports"]
    assert grpc_port == {"name": "grpc", "containerPort": 50070, "hostPort": 50070, "protocol": "TCP"}
    assert "hostPort" not in metrics_port and metrics_port["containerPort"] == config.metrics_port
    assert all(container[f"{kind}Probe"]["grpc"] == {"port": 50070} for kind in ("startup", "liveness"))
    memory = f"{math.ceil(2.5 + 1 + 4)}Gi"  # the pages + overheadGib
    assert container["resources"] == {"requests": {"memory": memory}, "limits": {"memory": memory}}
    service = chart.one(objects, "Service", "baton-hicache")["spec"]
    assert service["clusterIP"] == "None" and _selected({"matchLabels": service["selector"]}, objects) == [
        "hicache"
    ]


def test_every_worker_dials_its_own_node_tier():
    objects = chart.render("default", *ON)
    for role in ("prefill", "decode"):
        env = _pod(objects, role)["spec"]["containers"][0]["env"]
        names = [e["name"] for e in env]
        host_ip = env[names.index("HOST_IP")]
        address = env[names.index("BATON_WORKER_HOST_CACHE_ADDRESS")]
        assert host_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
        assert names.index("HOST_IP") < names.index("BATON_WORKER_HOST_CACHE_ADDRESS")  # $(HOST_IP) expands
        assert address["value"] == "$(HOST_IP):50070"


def test_a_worker_config_takes_the_node_address_from_its_environment(tmp_path):
    objects = chart.render("default", *ON)
    file = tmp_path / "worker.yaml"
    file.write_text(chart.worker_config_text(objects, "decode"))
    config = load_worker_config(file, {"BATON_WORKER_HOST_CACHE_ADDRESS": "10.0.0.7:50070"})
    assert (config.engine.host_cache_address, config.engine.host_cache_gib) == ("10.0.0.7:50070", 0)


def test_only_the_release_workers_reach_the_tier_and_the_tier_reaches_them():
    objects = chart.render("default", *ON)
    policy = chart.one(objects, "NetworkPolicy", "baton-hicache")["spec"]
    assert _selected(policy["podSelector"], objects) == ["hicache"]
    workers, metrics_from = policy["ingress"]
    (peer,) = workers["from"]
    assert _selected(peer["podSelector"], objects) == ["prefill", "decode"]  # never the router
    assert metrics_from["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    for role in ("prefill", "decode"):  # UCX connects back from the tier to the worker
        peers = chart.one(objects, "NetworkPolicy", f"baton-{role}")["spec"]["ingress"][1]["from"][0]
        assert _selected(peers["podSelector"], objects) == ["prefill", "decode", "hicache"]
    redis = chart.render("default", *ON, "--set", "redis.enabled=true")
    peers = chart.one(redis, "NetworkPolicy", "baton-redis")["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert _selected(peers, redis) == ["router", "prefill", "decode", "hicache"]  # the tier publishes
    monitor = chart.render("default", *ON, "--set", "metrics.serviceMonitor.enabled=true")
    selector = chart.one(monitor, "ServiceMonitor", "baton")["spec"]["selector"]
    assert selector["matchExpressions"][0]["values"] == ["router", "prefill", "decode", "hicache"]


@pytest.mark.parametrize(
    "flags, host_path, mount_path",
    [
        ((), "/dev/shm/baton-hicache", "/var/run/baton-hicache"),
        (
            ("--set-json", 'hicache.sharedMemory={"hostPath": "/mnt/b", "mountPath": "/pages"}'),
            "/mnt/b",
            "/pages",
        ),
    ],
    ids=["default", "given"],
)
def test_the_tier_and_its_workers_mount_one_page_directory_at_the_path_the_tier_names(
    flags, host_path, mount_path
):
    objects = chart.render("default", *ON, *flags)
    assert _shm_dir(objects) == mount_path  # the tier's files are named under it in its Attach reply
    tier = _pod(objects, "hicache")["spec"]
    expected = ({"path": host_path, "type": "DirectoryOrCreate"}, mount_path)
    assert _shared_directory(tier, tier["containers"][0]) == expected
    (prepare,) = tier["initContainers"]
    assert _shared_directory(tier, prepare) == expected and prepare["securityContext"] == {"runAsUser": 0}
    assert prepare["command"][-1] == mount_path
    for role in ("prefill", "decode"):
        worker = _pod(objects, role)["spec"]
        (container,) = worker["containers"]
        assert _shared_directory(worker, container) == expected
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert {v["name"]: v for v in worker["volumes"]}[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def test_the_init_container_opens_the_directory_to_every_user_and_removes_a_previous_tiers_files(tmp_path):
    (prepare,) = _pod(chart.render("default", *ON), "hicache")["spec"]["initContainers"]
    for name in ("baton-hicache-1-0f3a-kv", "baton-hicache-1-0f3a-kda", "unrelated"):
        (tmp_path / name).write_bytes(b"x")
    tmp_path.chmod(0o755)  # as the kubelet makes it
    subprocess.run([*prepare["command"][:-1], str(tmp_path)], check=True, timeout=10)
    assert sorted(os.listdir(tmp_path)) == ["unrelated"]
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o1777


def test_no_host_path_keeps_the_pages_private_and_mounts_nothing():
    objects = chart.render("default", *ON, "--set", "hicache.sharedMemory.hostPath=")
    assert _shm_dir(objects) == ""  # private pages, NIXL only (not the command's default /dev/shm)
    tier = _pod(objects, "hicache")["spec"]
    assert [v["name"] for v in tier["volumes"]] == ["cluster-secret"] and "initContainers" not in tier
    for role in ("prefill", "decode"):
        worker = _pod(objects, role)["spec"]
        assert _shared_directory(worker, worker["containers"][0]) is None


def test_off_by_default():
    objects = chart.render()
    assert not [o for o in objects if o["metadata"]["labels"]["app.kubernetes.io/component"] == "hicache"]
    for role in ("prefill", "decode"):
        worker = _pod(objects, role)["spec"]
        env = chart.env(worker["containers"][0])
        assert "HOST_IP" not in env and "BATON_WORKER_HOST_CACHE_ADDRESS" not in env
        assert _shared_directory(worker, worker["containers"][0]) is None  # hostPath is set by default


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--set", "hicache.kvGib=0"], "at '/hicache/kvGib': exclusiveMinimum"),
        (["--set", "hicache.kdaGib=-1"], "at '/hicache/kdaGib': minimum"),
        (["--set", "hicache.port=0"], "at '/hicache/port'"),
        (["--set", "hicache.redisL3Gib=-1"], "at '/hicache/redisL3Gib': minimum"),
        (["--set", "hicache.tenantCacheReservePages=-1"], "at '/hicache/tenantCacheReservePages': minimum"),
        (["--set", "hicache.cache=1"], "additional properties 'cache' not allowed"),
        (["--set", "hicache.sharedMemory.mountPath=pages"], "at '/hicache/sharedMemory/mountPath'"),
        (["--set", "hicache.sharedMemory.hostPath=shm"], "at '/hicache/sharedMemory/hostPath'"),
        (
            ["--set", "hicache.sharedMemory.mountPath=/dev/shm/"],
            "hicache.sharedMemory.mountPath (/dev/shm/) is a path the workers already mount",
        ),
    ],
    ids=[
        "kv-zero",
        "kda-negative",
        "port",
        "l3-negative",
        "reserve-negative",
        "unknown-key",
        "mount-relative",
        "host-relative",
        "mount-taken",
    ],
)
def test_schema_refuses(flags, message):
    error = chart.render_error("default", *ON, *flags)
    assert message in error, error


def test_a_worker_tier_of_its_own_beside_the_node_tier_is_refused():
    error = chart.render_error("default", *ON, "--set", "decode.engine.hostCacheGib=4")
    assert "hicache.enabled: the workers use their node's tier; leave decode.engine.hostCacheGib" in error
