"""The worker config the chart renders (a ConfigMap per role, read with ``baton worker --config``) loads
with the worker's own loader, carries every engine value, and a bad value fails naming the field."""

import json

import pytest
import yaml

from services.engine.engine_config import PARALLEL_DEGREES, EngineConfig
from services.worker_config import load_worker_config
from tests.deploy import chart

ROLES = ("prefill", "decode")
# values.yaml's engine keys (camelCase) and the EngineConfig fields they set.
ENGINE_VALUES = {
    "maxNumSeqs": ("max_num_seqs", 7),
    "maxNumBatchedTokens": ("max_num_batched_tokens", 512),
    "maxModelLen": ("max_model_len", 1024),
    "kvFormat": ("kv_format", "fp8"),
    "blockSize": ("block_size", 32),
    "numBlocks": ("num_blocks", 100),
    "enablePrefixCaching": ("enable_prefix_caching", True),  # the host tier needs it
    "hostCacheGib": ("host_cache_gib", 0.0),
    "hostCacheKdaFraction": ("host_cache_kda_fraction", 0.5),
    "hostCacheAddress": ("host_cache_address", "cache.local:50070"),
    "redisL3Gib": ("redis_l3_gib", 0.0),  # an L3 needs the worker's own tier, off here
    "prefetchPolicy": ("prefetch_policy", "wait"),
    "prefetchTimeoutMs": ("prefetch_timeout_ms", 250),
    "snapshotStride": ("snapshot_stride", 2),
    "numSnapshots": ("num_snapshots", 3),
    "kernels": ("kernels", "reference"),
    "cudaGraphs": ("cuda_graphs", False),
    "batchInvariant": ("batch_invariant", True),
    "adapters": ("adapters", ("policy=/adapters/policy",)),
    "draftModel": ("draft_model", "/models/draft"),
    "numDraftTokens": ("num_draft_tokens", 3),
    "specPolicy": ("spec_policy", "fixed"),
    "kdaRollback": ("kda_rollback", "replay"),
    "tenantCacheReserveBlocks": ("tenant_cache_reserve_blocks", 8),
}


def _text(value) -> str:
    """A value as ``helm --set`` reads it (booleans lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _load(tmp_path, text: str):
    path = tmp_path / "worker.yaml"
    path.write_text(text)
    return load_worker_config(path)


@pytest.mark.parametrize("values", list(chart.VALUES))
def test_rendered_config_loads_with_the_worker_loader(values, tmp_path):
    objects = chart.render(values)
    for role in ROLES:
        config = _load(tmp_path, chart.worker_config_text(objects, role))
        deployment = chart.one(objects, "Deployment", f"baton-{role}")
        c = chart.container(deployment)
        (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "grpc"]
        (metrics,) = [p["containerPort"] for p in c["ports"] if p["name"] == "metrics"]
        assert (config.role, config.host, config.port, config.metrics_port) == (
            role,
            "0.0.0.0",
            port,
            metrics,
        )
        assert config.engine.model.startswith("/models/")
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["config"] == "/etc/baton"
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == f"baton-{role}-config"


def test_every_engine_field_has_a_chart_value(tmp_path):
    """Each EngineConfig field (but the model, device and dtype, set from their own keys) is a
    role.engine value, mapped camelCase -> snake_case into the file (the parallel degrees come from
    role.parallel: ``test_parallel_values_reach_the_worker_config``)."""
    fields = set(EngineConfig.__dataclass_fields__) - {"model", "device", "dtype", *PARALLEL_DEGREES}
    assert {field for field, _ in ENGINE_VALUES.values()} == fields
    sets = [
        a
        for key, (_, v) in ENGINE_VALUES.items()
        for a in ("--set-json", f"decode.engine.{key}={json.dumps(list(v) if isinstance(v, tuple) else v)}")
    ]
    objects = chart.render("minimal", *sets)
    engine = _load(tmp_path, chart.worker_config_text(objects, "decode")).engine
    assert {field: getattr(engine, field) for field, _ in ENGINE_VALUES.values()} == dict(
        ENGINE_VALUES.values()
    )
    assert (engine.device, engine.dtype) == ("cpu", "float32")
    # Unset (null) values are left out of the file, so the worker's defaults hold.
    assert "kv_format" not in chart.worker_config(objects, "prefill")["engine"]


def test_a_bad_engine_value_fails_naming_the_field(tmp_path):
    # The chart's schema refuses it first ...
    assert "kvFormat" in chart.render_error("default", "--set", "decode.engine.kvFormat=fp9")
    # ... and past the schema, the worker refuses it at start, naming the config field.
    objects = chart.render("default", "--skip-schema-validation", "--set", "decode.engine.kvFormat=fp9")
    with pytest.raises(ValueError, match=r"engine\.kv_format: 'fp9' is not supported \(auto, fp8\)"):
        _load(tmp_path, chart.worker_config_text(objects, "decode"))
    data = chart.worker_config(chart.render(), "prefill")
    data["engine"]["blockSize"] = 16  # a camelCase key that slipped through is an unknown key
    with pytest.raises(ValueError, match=r"engine\.blockSize: unknown key"):
        _load(tmp_path, yaml.safe_dump(data))


def test_parallel_values_reach_the_worker_config(tmp_path):
    """Each role's ``parallel`` degrees land in its worker config's engine section, as the worker reads
    them, and set its GPUs per pod to one per rank."""
    values = ("decode.parallel.tp=2", "decode.parallel.dcp=2", "decode.parallel.ep=4")
    values += ("prefill.parallel.pcp=2", "prefill.parallel.pp=2")
    sets = [word for value in values for word in ("--set", value)]
    objects = chart.render("default", *sets)
    decode = _load(tmp_path, chart.worker_config_text(objects, "decode")).engine
    prefill = _load(tmp_path, chart.worker_config_text(objects, "prefill")).engine
    assert {d: getattr(decode, d) for d in PARALLEL_DEGREES} == dict(tp=2, dcp=2, pp=1, pcp=1, ep=4)
    assert {d: getattr(prefill, d) for d in PARALLEL_DEGREES} == dict(tp=1, dcp=1, pp=2, pcp=2, ep=1)
    for role, ranks in (("decode", 4), ("prefill", 4)):
        limits = chart.container(chart.one(objects, "Deployment", f"baton-{role}"))["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == ranks


def test_the_handoff_checksum_value_reaches_both_roles(tmp_path):
    """``transfer.handoffChecksum`` (on by default) lands in every worker's config as ``handoff_checksum``."""
    for sets, want in (((), True), (("--set", "transfer.handoffChecksum=false"), False)):
        objects = chart.render("default", *sets)
        for role in ROLES:
            assert _load(tmp_path, chart.worker_config_text(objects, role)).handoff_checksum is want
    assert "handoffChecksum" in chart.render_error("default", "--set", "transfer.handoffChecksum=maybe")
