"""``WorkerConfig``: the one typed configuration of a worker process, and how it is loaded.

Three sources, later ones winning field by field (``load_worker_config``)::

    --config FILE (YAML)  <  BATON_WORKER_<FIELD> environment variables  <  command-line flags

The file mirrors the dataclass: worker fields at the top, the engine's in a nested ``engine:``
section (``services/engine/engine_config.py``)::

    role: decode
    port: 50061
    grace_period_s: 240
    engine:
      model: /models/k3
      device: cuda
      kv_format: fp8

Environment variables are flat, ``BATON_WORKER_`` plus the field's name in capitals, for worker and
engine fields alike (``BATON_WORKER_PORT``, ``BATON_WORKER_KV_FORMAT``); booleans read
``true/false/1/0/yes/no/on/off``, an optional field reads ``none`` (or empty) as None and
``fault_delays`` is comma-separated. Flags come from ``services/config_flags.py``.

Everything is checked before a worker starts, and every error names the field and where its value
came from: ``engine.kv_format: 'fp9' is not supported (auto, fp8) (from --kv-format)``; an unknown
key in the file or an unknown ``BATON_WORKER_*`` variable is an error naming it.
"""

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.redis_link import check_redis_url
from services.engine.engine_config import EngineConfig

from .fault_delays import FaultDelays

ROLES = ("prefill", "decode")
ENV_PREFIX = "BATON_WORKER_"
ENGINE = "engine"


@dataclass(frozen=True)
class WorkerConfig:
    """One worker process: its role, where it listens, its transfer backend and its engine."""

    role: str
    engine: EngineConfig
    name: str = ""
    host: str = "127.0.0.1"
    port: int = 0  # 0: the OS picks a free port (``WorkerServer.port`` tells which)
    transfer_backend: str = "nixl"
    max_workers: int | None = None  # gRPC handler threads; None: two per sequence slot + 16
    metrics_port: int = 0  # /metrics; 0 picks a free port (``WorkerServer.metrics_port``)
    fail_transfers: int = 0  # fault injection (prefill): the first N handoffs fail
    stray_handoff_writes: int = 0  # fault injection (prefill): N handoffs get a stray write after
    handoff_checksum: bool = True  # prefill: hash each handoff for the decode worker to verify
    reservation_ttl_s: float = 600.0  # decode: backstop for a reservation whose lease outlives its router
    release_grace_s: float = 5.0  # decode: a released reservation waits this long for an in-flight write
    fault_delays: tuple[str, ...] = ()  # fault injection: PHASE=SECONDS pauses (services/fault_delays.py)
    grace_period_s: float = 30.0  # drain(): how long running work may take to finish after SIGTERM
    node: str = ""  # the node whose HiCache tier it uses, as the cluster index names it; "": the host name
    redis_url: str = ""  # HiCache's cluster index and L3 (redis://HOST:PORT); "": none
    cluster_secret_file: str = (
        ""  # the cluster secret internal calls need and send (common/cluster_secret.py)
    )
    internal_tls_cert: str = ""  # internal mutual TLS (common/internal_tls.py): this process's certificate
    internal_tls_key: str = ""  # its private key
    internal_tls_ca: str = ""  # the cluster CA: the only signer of certificates accepted

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role: {self.role!r} is not one of {', '.join(ROLES)}")
        if not self.grace_period_s >= 0:
            raise ValueError(f"grace_period_s: must be >= 0, got {self.grace_period_s}")
        if not self.release_grace_s >= 0:
            raise ValueError(f"release_grace_s: must be >= 0, got {self.release_grace_s}")
        try:
            FaultDelays.parse(self.role, self.fault_delays)
        except ValueError as error:  # "fault_delay: ..." names one of them; the field is plural
            raise ValueError(f"fault_delays: {str(error).partition(': ')[2]}") from None
        if not self.reservation_ttl_s > 0:
            raise ValueError(f"reservation_ttl_s: must be > 0, got {self.reservation_ttl_s}")
        for name in ("fail_transfers", "stray_handoff_writes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port: must be in [0, 65535], got {self.port}")
        if not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port: must be in [0, 65535], got {self.metrics_port}")
        if self.max_workers is not None and self.max_workers < 1:
            raise ValueError(f"max_workers: must be >= 1, got {self.max_workers}")
        check_redis_url("redis_url", self.redis_url)
        if self.engine.redis_l3_gib > 0 and not self.redis_url:
            raise ValueError(
                "engine.redis_l3_gib: --redis-l3-gib puts the tier's L3 in Redis: give --redis-url too "
                "(or set 0)"
            )

    def to_dict(self) -> dict:
        """The config as plain data in the file's shape (``engine`` nested), which ``from_dict`` reads."""
        data = dataclasses.asdict(self)
        data["fault_delays"] = list(self.fault_delays)
        data[ENGINE] = data.pop(ENGINE)  # last: the worker's own fields read first
        return data

    def to_yaml(self) -> str:
        """The config as a ``--config`` file."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: Mapping) -> "WorkerConfig":
        """A config from plain data in the file's shape, checked field by field (no other source)."""
        return _build([("the config", data)])


def worker_fields() -> dict[str, type]:
    """``{field: type}`` of ``WorkerConfig`` (``engine`` left out)."""
    return {k: v for k, v in typing.get_type_hints(WorkerConfig).items() if k != ENGINE}


def engine_fields() -> dict[str, type]:
    """``{field: type}`` of ``EngineConfig``."""
    return typing.get_type_hints(EngineConfig)


def env_name(field: str) -> str:
    """``kv_format`` -> ``BATON_WORKER_KV_FORMAT`` (worker and engine fields share one flat namespace)."""
    return ENV_PREFIX + field.upper()


def load_worker_config(
    file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> WorkerConfig:
    """The worker config from a YAML file, then ``BATON_WORKER_*`` variables, then flags, later winning.

    Args:
        file: a YAML file in ``WorkerConfig.to_yaml``'s shape, or None.
        env: the environment (only ``BATON_WORKER_*`` names are read); None reads none.
        flags: the flags given on the command line, ``{field: value}`` with engine fields flat
            beside worker fields (``services.config_flags.given_flags``).

    Raises:
        ValueError: naming the field (``engine.kv_format: ...``) and where its value came from; an
            unreadable or malformed file, an unknown key or variable, a missing ``role`` or
            ``engine.model``, a value of the wrong type, or one its dataclass refuses.
    """
    layers = []
    if file is not None:
        layers.append((f"--config {file}", _read_file(Path(file))))
    if env:
        layers.append(("env", _from_env(env)))
    if flags:
        layers.append(("flags", _nest(flags, "flag")))
    return _build(layers)


def _read_file(path: Path) -> dict:
    where = f"--config: {path}"
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ValueError(f"{where}: cannot be read ({error.strerror or error})") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{where}: not valid YAML ({error})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    return data


def _from_env(env: Mapping[str, str]) -> dict:
    hints = {**worker_fields(), **engine_fields()}
    flat = {}
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        field = name[len(ENV_PREFIX) :].lower()
        if field not in hints:
            raise ValueError(f"{name}: not a worker or engine field")
        path = f"{ENGINE}.{field}" if field in engine_fields() else field
        flat[field] = _parse_text(text, hints[field], f"{path} (from {name})")
    return _nest(flat, "variable")


def _nest(flat: Mapping[str, object], what: str) -> dict:
    """``{kv_format: ..., port: ...}`` -> ``{port: ..., engine: {kv_format: ...}}``."""
    engine = engine_fields()
    nested: dict = {}
    for field, value in flat.items():
        if field in engine:
            nested.setdefault(ENGINE, {})[field] = value
        elif field in worker_fields():
            nested[field] = value
        else:
            raise ValueError(f"{field}: not a worker or engine field ({what})")
    return nested


def _build(layers: list[tuple[str, Mapping]]) -> WorkerConfig:
    """Merge ``[(source, nested data)]`` (later wins), type-check each value, build the dataclasses."""
    values: dict[str, object] = {}
    engine: dict[str, object] = {}
    origin: dict[str, str] = {}  # "engine.kv_format" -> where its value came from
    for source, data in layers:
        for key, value in data.items():
            if key == ENGINE:
                if not isinstance(value, Mapping):
                    raise ValueError(f"engine: expected a mapping of engine fields ({_from(source, key)})")
                for sub, sub_value in value.items():
                    path = f"{ENGINE}.{sub}"
                    if sub not in engine_fields():
                        raise ValueError(f"{path}: unknown key ({_from(source, sub)})")
                    origin[path] = _from(source, sub)
                    engine[sub] = _check(sub_value, engine_fields()[sub], f"{path} ({origin[path]})")
            elif key in worker_fields():
                origin[key] = _from(source, key)
                values[key] = _check(value, worker_fields()[key], f"{key} ({origin[key]})")
            else:
                raise ValueError(f"{key}: unknown key ({_from(source, key)})")
    if "role" not in values:
        raise ValueError(f"role: required ({_sources('role')})")
    if "model" not in engine:
        raise ValueError(f"engine.model: required ({_sources('model', 'engine')})")
    try:
        built = EngineConfig(**engine)
    except ValueError as error:
        raise _named(error, ENGINE, origin) from None
    try:
        return WorkerConfig(engine=built, **values)
    except ValueError as error:
        raise _named(error, "", origin) from None


def _named(error: ValueError, section: str, origin: Mapping[str, str]) -> ValueError:
    """A dataclass's ``field: message`` as ``section.field: message (from SOURCE)``."""
    field, sep, message = str(error).partition(": ")
    if not sep:
        return error
    path = f"{section}.{field}" if section else field
    where = f" ({origin[path]})" if path in origin else ""
    return ValueError(f"{path}: {message}{where}")


def _from(source: str, field: str) -> str:
    if source == "env":
        return f"from {env_name(field)}"
    if source == "flags":
        from .config_flags import flag_names  # imported late: config_flags imports this module

        return f"from {flag_names(field)[0]}"
    return f"in {source}"


def _sources(field: str, section: str = "") -> str:
    from .config_flags import flag_names

    key = f"{section}: {field}:" if section else f"{field}:"
    return f"{flag_names(field)[0]}, {env_name(field)} or {key!r} in the --config file"


def _optional(hint) -> tuple[object, bool]:
    """``int | None`` -> ``(int, True)``; ``int`` -> ``(int, False)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _check(value, hint, where: str):
    """``value`` as ``hint`` (ints widen to floats, lists to tuples); ValueError naming ``where``."""
    kind, optional = _optional(hint)
    if value is None:
        if optional:
            return None
        raise ValueError(f"{where}: must be set, got null")
    if typing.get_origin(kind) is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError(f"{where}: expected a list of strings, got {value!r}")
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ValueError(f"{where}: expected {_TYPE_NAMES.get(kind, kind)}, got {value!r}")
    return value


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _parse_text(text: str, hint, where: str):
    """An environment variable's text as ``hint``; ValueError naming ``where``."""
    kind, optional = _optional(hint)
    stripped = text.strip()
    if optional and stripped.lower() in ("", "none", "null"):
        return None
    if typing.get_origin(kind) is tuple:
        return tuple(part.strip() for part in stripped.split(",") if part.strip())
    if kind is bool:
        if stripped.lower() in _TRUE + _FALSE:
            return stripped.lower() in _TRUE
        raise ValueError(f"{where}: expected true or false, got {text!r}")
    if kind in (int, float):
        try:
            return kind(stripped)
        except ValueError:
            raise ValueError(f"{where}: expected {_TYPE_NAMES[kind]}, got {text!r}") from None
    return text
