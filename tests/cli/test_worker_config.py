"""``WorkerConfig`` loading: ``--config`` file < ``BATON_WORKER_*`` < flags, every field reachable from
``baton worker``'s flags, and errors that name the field (and where its value came from)."""

import dataclasses
import typing

import pytest

from cli.main import build_parser
from cli.worker_command import config_from
from services.config_flags import flag_names
from services.engine.engine_config import EngineConfig
from services.worker_config import WorkerConfig, engine_fields, env_name, load_worker_config, worker_fields

# A valid value other than the default for the fields whose strings are checked.
STRINGS = {
    "role": "decode",
    "kv_format": "fp8",
    "kernels": "reference",
    "dtype": "float16",
    "device": "cuda:1",
    "transfer_backend": "grpc_bytes",
    "fault_delays": ("reserve=0.5",),
    "adapters": ("tuned=/adapters/tuned",),
    "redis_url": "redis://cache:6379/0",
    "prefetch_policy": "wait",
    "spec_policy": "fixed",
    "kda_rollback": "replay",
}
# A valid value other than the default for numbers whose range excludes the generic one.
NUMBERS = {"host_cache_kda_fraction": 0.5}


def worker(argv: list[str], env: dict | None = None) -> WorkerConfig:
    return config_from(build_parser().parse_args(["worker", *argv]), env or {})


def _other_value(name: str, hint, default):
    """A value of ``hint`` different from ``default``, as (python value, flag words)."""
    if name in STRINGS:
        value = STRINGS[name]
        return value, [word for item in (value if isinstance(value, tuple) else (value,)) for word in (
            flag_names(name)[0], item)]  # fmt: skip
    kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    if kind is bool:
        flag = flag_names(name)[0]
        return (not default), [flag if not default else "--no-" + flag[2:]]
    value = NUMBERS.get(name, {int: 3, float: 1.5, str: "x"}[kind])
    return value, [flag_names(name)[0], str(value)]


@pytest.mark.parametrize(
    "section, name",
    [("worker", n) for n in worker_fields()] + [("engine", n) for n in engine_fields()],
    ids=lambda v: v,
)
def test_every_field_is_reachable_from_baton_worker_flags(section, name):
    """Derived from the dataclasses: a field added without a flag fails here."""
    cls = WorkerConfig if section == "worker" else EngineConfig
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    hints = worker_fields() if section == "worker" else engine_fields()
    default = None if field.default is dataclasses.MISSING else field.default
    value, words = _other_value(name, hints[name], default)
    base = {"role": ["--role", "decode"], "model": ["--model", "/m"]}
    argv = [w for key, flag in base.items() if key != name for w in flag] + words
    if name == "ep":  # expert parallelism regroups tp x dcp ranks: it needs that many
        argv += ["--tp", str(value)]
    if name == "redis_l3_gib":  # an L3 sits below the engine's own tier, in the worker's Redis
        argv += ["--host-cache-gib", "1", "--redis-url", "redis://cache:6379/0"]
    if name in ("draft_model", "num_draft_tokens"):  # speculative decoding takes both or neither
        argv += ["--num-draft-tokens", "3"] if name == "draft_model" else ["--draft-model", "/draft"]
    config = worker(argv)
    got = getattr(config if section == "worker" else config.engine, name)
    assert got == value and got != default


def test_file_then_env_then_flags(tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text(
        "role: prefill\nport: 1111\nmetrics_port: 2222\n"
        "engine:\n  model: /from-file\n  block_size: 8\n  kv_format: fp8\n  cuda_graphs: false\n"
    )
    env = {"BATON_WORKER_PORT": "3333", "BATON_WORKER_BLOCK_SIZE": "32", "BATON_WORKER_CUDA_GRAPHS": "yes"}
    config = worker(["--config", str(path), "--block-size", "64", "--role", "decode"], env)
    assert config.role == "decode"  # flag over file
    assert config.port == 3333 and config.metrics_port == 2222  # env over file; file alone
    assert config.engine.block_size == 64  # flag over env over file
    assert config.engine.kv_format == "fp8" and config.engine.cuda_graphs is True
    assert config.engine.model == "/from-file"
    config = worker(["--config", str(path)], {"BATON_WORKER_FAULT_DELAYS": "prefill=2, handoff=1"})
    assert config.fault_delays == ("prefill=2", "handoff=1")


def test_flags_not_given_leave_lower_sources_alone(tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text("role: decode\ngrace_period_s: 7\nengine:\n  model: /m\n  max_num_seqs: 3\n")
    config = worker(["--config", str(path)])
    assert config.grace_period_s == 7.0 and config.engine.max_num_seqs == 3


def test_to_yaml_round_trips(tmp_path):
    config = WorkerConfig(
        "prefill", EngineConfig(model="/m", kv_format="fp8", num_blocks=9), fault_delays=("handoff=1",)
    )
    path = tmp_path / "worker.yaml"
    path.write_text(config.to_yaml())
    assert load_worker_config(path) == config
    assert WorkerConfig.from_dict(config.to_dict()) == config


def test_env_names_do_not_collide():
    assert not set(worker_fields()) & set(engine_fields())
    assert env_name("kv_format") == "BATON_WORKER_KV_FORMAT"


FILE_ERRORS = {
    "bad-value": (
        "role: decode\nengine: {model: /m, kv_format: fp9}\n",
        r"^engine\.kv_format: 'fp9' is not supported \(auto, fp8\) \(in ",
    ),
    "unknown-engine-key": (
        "role: decode\nengine: {model: /m, kv_fromat: fp8}\n",
        r"^engine\.kv_fromat: unknown key",
    ),
    "unknown-key": ("role: decode\nprot: 1\nengine: {model: /m}\n", r"^prot: unknown key"),
    "string-for-int": (
        "role: decode\nengine: {model: /m, block_size: '16'}\n",
        r"^engine\.block_size \(in .*\): expected an integer",
    ),
    "int-for-bool": (
        "role: decode\nengine: {model: /m, cuda_graphs: 1}\n",
        r"^engine\.cuda_graphs .*: expected true or false",
    ),
    "port-range": (
        "role: decode\nport: 70000\nengine: {model: /m}\n",
        r"^port: must be in \[0, 65535\], got 70000 \(in ",
    ),
    "bad-role": ("role: router\nengine: {model: /m}\n", r"^role: 'router' is not one of prefill, decode"),
    "null-for-int": (
        "role: decode\nengine: {model: /m, max_num_seqs: null}\n",
        r"^engine\.max_num_seqs .*: must be set",
    ),
    "engine-not-a-mapping": ("role: decode\nengine: /m\n", r"^engine: expected a mapping"),
    "no-model": ("role: decode\n", r"^engine\.model: required \(--model, BATON_WORKER_MODEL or"),
    "no-role": ("engine: {model: /m}\n", r"^role: required \(--role, BATON_WORKER_ROLE or"),
    "not-a-mapping": ("- role\n", r"^--config: .*: expected a mapping of fields, got list"),
    "malformed": ("role: [decode\n", r"^--config: .*: not valid YAML"),
    "bad-fault-delay": (
        "role: decode\nfault_delays: [reserve]\nengine: {model: /m}\n",
        r"^fault_delays: 'reserve' is not",
    ),
}


@pytest.mark.parametrize("text, message", FILE_ERRORS.values(), ids=FILE_ERRORS)
def test_file_errors_name_the_field(text, message, tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_worker_config(path)


def test_unreadable_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"^--config: .*missing\.yaml: cannot be read"):
        load_worker_config(tmp_path / "missing.yaml")


ENV_ERRORS = {
    "bad-int": (
        {"BATON_WORKER_BLOCK_SIZE": "big"},
        r"^engine\.block_size \(from BATON_WORKER_BLOCK_SIZE\): expected an",
    ),
    "bad-bool": (
        {"BATON_WORKER_CUDA_GRAPHS": "maybe"},
        r"^engine\.cuda_graphs \(from BATON_WORKER_CUDA_GRAPHS\): expected",
    ),
    "bad-value": (
        {"BATON_WORKER_KV_FORMAT": "fp9"},
        r"^engine\.kv_format: 'fp9' .* \(from BATON_WORKER_KV_FORMAT\)",
    ),
    "unknown-variable": (
        {"BATON_WORKER_BLOK_SIZE": "16"},
        r"^BATON_WORKER_BLOK_SIZE: not a worker or engine field",
    ),
}


@pytest.mark.parametrize("env, message", ENV_ERRORS.values(), ids=ENV_ERRORS)
def test_env_errors_name_the_field_and_variable(env, message):
    with pytest.raises(ValueError, match=message):
        worker(["--role", "decode", "--model", "/m"], env)


def test_flag_errors_name_the_flag():
    with pytest.raises(
        ValueError, match=r"^engine\.block_size: must be a positive integer, got 0 \(from --block-size\)"
    ):
        worker(["--role", "decode", "--model", "/m", "--block-size", "0"])
    with pytest.raises(ValueError, match=r"^grace_period_s: must be >= 0, got -1.0 \(from --grace-period\)"):
        worker(["--role", "decode", "--model", "/m", "--grace-period", "-1"])


def test_optional_env_values_read_none():
    config = worker(["--role", "decode", "--model", "/m"], {"BATON_WORKER_NUM_BLOCKS": "none"})
    assert config.engine.num_blocks is None
    config = worker(["--role", "decode", "--model", "/m"], {"BATON_WORKER_NUM_BLOCKS": "12"})
    assert config.engine.num_blocks == 12


def test_serve_builds_one_config_per_role_from_the_same_flags(tmp_path):
    from cli.serve_command import worker_configs

    argv = ["serve", "--model", "/m", "--kv-format", "fp8", "--block-size", "32", "--no-cuda-graphs"]
    argv += ["--decode-device", "cuda:1", "--grace-period", "9", "--transfer-backend", "grpc_bytes"]
    configs = worker_configs(build_parser().parse_args(argv))
    for role, config in configs.items():
        assert (
            config.role == role and config.grace_period_s == 9.0 and config.transfer_backend == "grpc_bytes"
        )
        assert (config.engine.kv_format, config.engine.block_size, config.engine.cuda_graphs) == (
            "fp8",
            32,
            False,
        )
        path = tmp_path / f"{role}.yaml"
        path.write_text(config.to_yaml())  # what the launcher hands the worker as --config
        assert load_worker_config(path) == config
    assert (configs["prefill"].engine.device, configs["decode"].engine.device) == ("cpu", "cuda:1")
    with pytest.raises(ValueError, match="^--prefill-device: 'tpu' is not supported"):
        worker_configs(build_parser().parse_args(["serve", "--model", "/m", "--prefill-device", "tpu"]))
    with pytest.raises(ValueError, match="^--snapshot-stride: must be a positive integer, got 0"):
        worker_configs(build_parser().parse_args(["serve", "--model", "/m", "--snapshot-stride", "0"]))


def test_parallel_degrees_from_flags_env_file_and_serve_roles(tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text("role: decode\nengine: {model: /m, tp: 4, dcp: 2}\n")
    config = worker(["--config", str(path), "--ep", "2"], {"BATON_WORKER_DCP": "1"})
    assert (config.engine.tp, config.engine.dcp, config.engine.ep, config.engine.world_size) == (4, 1, 2, 4)
    with pytest.raises(ValueError, match="^engine.tp: must be a positive integer, got 0 \\(from --tp\\)"):
        worker(["--role", "decode", "--model", "/m", "--tp", "0"])
    with pytest.raises(ValueError, match="^engine.ep: 4 must divide tp x dcp = 2 .*\\(from --ep\\)$"):
        worker(["--role", "decode", "--model", "/m", "--tp", "2", "--ep", "4"])

    from cli.serve_command import worker_configs

    argv = ["serve", "--model", "/m", "--tp", "2", "--decode-parallel", "dcp=2,ep=4"]
    configs = worker_configs(build_parser().parse_args(argv))
    assert (configs["prefill"].engine.tp, configs["prefill"].engine.world_size) == (2, 2)
    decode = configs["decode"].engine
    assert (decode.tp, decode.dcp, decode.ep, decode.world_size) == (2, 2, 4, 4)
    for text, message in (
        ("tq=2", "^--prefill-parallel: 'tq=2' is not DIM=N"),
        ("tp=0", "^--prefill-parallel: tp must be a positive integer"),
        ("tp=2,tp=2", "^--prefill-parallel: tp is given twice"),
    ):
        with pytest.raises(ValueError, match=message):
            worker_configs(build_parser().parse_args(["serve", "--model", "/m", "--prefill-parallel", text]))
