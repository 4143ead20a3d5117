"""Command-line flags generated from the fields of ``WorkerConfig`` and ``EngineConfig``: one declaration.

A field's flag is its name in kebab case (``kv_format`` -> ``--kv-format``); a boolean is a pair
(``--cuda-graphs / --no-cuda-graphs``). ``FLAG_NAMES`` lists the few that keep the names they had
before the flags were generated (``--grace-period``, ``--fault-delay``, ``--prefix-caching``) or name
the field for the operator (``num_blocks`` is ``--kv-blocks``: the device pool beside the host tier).

``baton worker`` adds every field with ``suppress=True``: a flag not given leaves no value, so the
file and environment below it keep theirs (``services/worker_config.py``). Commands that run an engine
without a worker (``baton generate``, ``capacity``, ``bench``, ``serve``) add the engine fields they use
with ordinary defaults, overriding a default where their job needs another one.
"""

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping

from services.engine.engine_config import EngineConfig

from .worker_config import ROLES, WorkerConfig, engine_fields, worker_fields

DTYPE_NAMES = ("bfloat16", "float16", "float32")

# Flags that keep their earlier names; the first is the one shown, every one works.
FLAG_NAMES = {
    "grace_period_s": ("--grace-period",),
    "fault_delays": ("--fault-delay",),
    "enable_prefix_caching": ("--prefix-caching", "--enable-prefix-caching"),
    "num_blocks": ("--kv-blocks",),  # the device pool, beside --host-cache-gib (the host tier)
}

HELP = {
    # WorkerConfig
    "role": "prefill or decode",
    "name": "worker name in routes and stats (default: ROLE-PORT)",
    "host": "listen address",
    "port": "listen port (0: any free port)",
    "transfer_backend": "handoff backend: nixl or grpc_bytes",
    "max_workers": "gRPC handler threads (default: two per sequence slot + 16)",
    "metrics_port": "/metrics port (0: any free port)",
    "fail_transfers": "fault injection for tests and chaos drills: this prefill worker's first N "
    "handoffs fail",
    "stray_handoff_writes": "fault injection for tests and chaos drills: this prefill worker's first N "
    "handoffs are followed by a stray write into the reservation (the decode worker must refuse them)",
    "handoff_checksum": "prefill: hash the bytes of each handoff under its reservation's capability, for the "
    'decode worker to check before decoding (docs/authentication.md, "KV data plane"); turn off only on '
    "a fabric no other process can write to (default: on)",
    "reservation_ttl_s": "decode: backstop: free a reservation still waiting for its state after S seconds, "
    "even if its router's lease looks alive",
    "release_grace_s": "decode: a reservation whose router left waits up to S seconds for a handoff that "
    "may still be writing into it",
    "fault_delays": "fault injection for tests and chaos drills: pause S seconds at PHASE (decode: "
    "reserve, decode_start; prefill: prefill, handoff); repeatable",
    "grace_period_s": "on SIGTERM/SIGINT: admit nothing new (health NOT_SERVING) and give running requests "
    "and handoffs S seconds to finish; the router moves streams still running to another worker (a "
    "second signal ends the wait)",
    "node": "the node whose HiCache tier this worker uses, as the cluster index names it (default: the "
    "host name; in Kubernetes the node's name)",
    "redis_url": "HiCache's cluster index and L3: redis://HOST:PORT (default: none)",
    "cluster_secret_file": "a file holding the cluster secret (>= 32 characters): every internal call to "
    "this worker must carry it, and it is sent to the node's tier (docs/authentication.md; default: none)",
    "internal_tls_cert": "internal mutual TLS: this worker's PEM certificate, naming baton-internal in its "
    "subjectAltName; its port then takes only clients with a certificate the CA signed, and its calls to the "
    'node\'s tier go over TLS (docs/authentication.md, "Internal trust"; default: plaintext)',
    "internal_tls_key": "internal mutual TLS: the certificate's PEM private key, unencrypted",
    "internal_tls_ca": "internal mutual TLS: the cluster CA (PEM) that signs every internal certificate",
    # EngineConfig
    "model": "checkpoint folder",
    "device": "cpu, cuda or cuda:N",
    "dtype": "compute dtype (default: the checkpoint's)",
    "block_size": "tokens per packed KV block",
    "num_blocks": "blocks in the device KV pool (default: max-num-seqs contexts of max-model-len tokens)",
    "max_num_seqs": "requests running at once (also the number of KDA state slots)",
    "max_num_batched_tokens": "token budget of one step (prefill chunks + decodes)",
    "max_model_len": "longest prompt + generation a request may reach",
    "batch_invariant": "bitwise-reproducible numerics whatever the batch",
    "enable_prefix_caching": "reuse cached blocks (and KDA snapshots) across requests",
    "snapshot_stride": "take a KDA state snapshot every this many blocks",
    "num_snapshots": "KDA snapshots kept for the prefix cache (default: max-num-seqs)",
    "kv_format": "KV block storage: auto (the model dtype) or fp8 (packed FP8 latents and index keys)",
    "kernels": "op backends: reference (float32 PyTorch oracle) or triton (default: triton on CUDA, "
    "reference on the CPU and when batch-invariant; with --batch-invariant, triton picks the invariant "
    "Triton kernels; triton on the CPU needs TRITON_INTERPRET=1)",
    "adapters": "LoRA adapters to load at start, NAME=FOLDER (a PEFT folder), comma-separated; "
    "load and unload while serving with `baton adapters`",
    "cuda_graphs": "replay CUDA graphs for pure-decode steps (a no-op on the CPU)",
    "host_cache_gib": "GiB of host memory for this engine's own HiCache tier (KV blocks and KDA snapshots "
    "a later request loads instead of recomputing; docs/hicache.md); 0: no tier",
    "host_cache_address": "HOST:PORT of the node's `baton cache` tier, used instead of one in this process",
    "host_cache_kda_fraction": "share of --host-cache-gib for KDA snapshots (the rest: KV blocks)",
    "redis_l3_gib": "GiB of Redis (at --redis-url) for an L3 below this engine's own tier: pages it evicts "
    "are written there and prefetched back; 0: none",
    "prefetch_policy": "admitting a request whose prefix is being prefetched from the L3: best_effort (at "
    "once, with what arrived), wait (once the prefetch is over), timeout_ms (that, or --prefetch-timeout-ms "
    "after arrival)",
    "prefetch_timeout_ms": "the timeout_ms prefetch policy's longest wait",
    "tp": "tensor-parallel ranks (attention heads and experts split across them)",
    "dcp": "decode-context-parallel ranks (the cached tokens split across them)",
    "pp": "pipeline-parallel stages (the layers split across them)",
    "pcp": "prefill-context-parallel ranks (a prompt's tokens split across them)",
    "ep": "expert-parallel ranks (the routed experts split across ranks holding the same tokens; "
    "divides tp x dcp)",
    "draft_model": "checkpoint folder of a draft model for speculative decoding (default: none)",
    "num_draft_tokens": "tokens the draft model proposes per verify step, 1-16 (the benchmarks sweep "
    "1-7); needs --draft-model",
    "spec_policy": "how many tokens to draft each step: adaptive (the k up to --num-draft-tokens this "
    "engine measured to give the most tokens per second, none where speculation loses; "
    "docs/speculative.md) or fixed (always --num-draft-tokens)",
    "tenant_cache_reserve_blocks": "prefix-cache blocks each tenant keeps: another tenant's load never "
    "evicts a tenant's cached blocks below this many, nor (KDA models) the state snapshots they need; "
    "the engine's own host tier (--host-cache-gib) keeps as many pages a tenant (default 0: none)",
    "kda_rollback": "how verify steps undo rejected drafts in the KDA state: states (the state after every "
    "draft kept in a slot of its own; fixed-shape verify steps that CUDA graphs replay), replay (one "
    "checkpoint, accepted drafts run again; needed by --batch-invariant) or auto (replay with "
    "--batch-invariant, else states)",
}


def _choices() -> dict[str, tuple[str, ...]]:
    from services.engine.cache.layout import KV_FORMATS
    from services.engine.engine_config import KDA_ROLLBACKS, PREFETCH_POLICIES, SPEC_POLICIES
    from services.engine.model.backends import KERNEL_BACKENDS

    return {
        "role": ROLES,
        "dtype": DTYPE_NAMES,
        "kv_format": KV_FORMATS,
        "kernels": KERNEL_BACKENDS,
        "prefetch_policy": PREFETCH_POLICIES,
        "spec_policy": SPEC_POLICIES,
        "kda_rollback": KDA_ROLLBACKS,
    }


_METAVARS = {"fault_delays": "PHASE=S", "fail_transfers": "N", "stray_handoff_writes": "N"}


def flag_names(field: str) -> tuple[str, ...]:
    """The flags that set ``field``: ``kv_format`` -> ``("--kv-format",)``."""
    return FLAG_NAMES.get(field, ("--" + field.replace("_", "-"),))


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    config: type = EngineConfig,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    defaults: Mapping[str, object] | None = None,
    suppress: bool = False,
) -> None:
    """Add a flag per field of ``config`` (``EngineConfig`` or ``WorkerConfig``, whose ``engine`` is
    left out: add ``EngineConfig`` too).

    Args:
        only, exclude: which fields (default: all).
        defaults: ``{field: default}`` where this command needs another than the dataclass's.
        suppress: a flag not given sets nothing (``given_flags`` then returns only those given), so
            lower-precedence sources keep their values; required fields are not required here.
    """
    hints = engine_fields() if config is EngineConfig else worker_fields()
    declared = {f.name: f for f in dataclasses.fields(config)}
    names = [name for name in hints if only is None or name in set(only)]
    defaults = dict(defaults or {})
    choices = _choices()
    for name in names:
        if name in set(exclude):
            continue
        kind, _ = _optional(hints[name])
        field = declared[name]
        has_default = name in defaults or field.default is not dataclasses.MISSING
        default = defaults.get(name, field.default)
        shown = "" if not has_default or default in (None, "", ()) else f" (default {_shown(default)})"
        options: dict = {"dest": name, "help": HELP[name] + shown}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
            options["help"] = HELP[name] + (f" (default {'on' if default else 'off'})" if has_default else "")
        elif typing.get_origin(kind) is tuple:
            options.update(action="append", metavar=_METAVARS.get(name))
        else:
            options.update(type=kind, metavar=_METAVARS.get(name, _metavar(name, kind)))
            if name in choices:
                options.update(choices=choices[name], metavar=None)
        if suppress:
            options["default"] = argparse.SUPPRESS
        elif has_default:
            options["default"] = list(default) if options.get("action") == "append" else default
        else:
            options["required"] = True
        parser.add_argument(*flag_names(name), **options)


def given_flags(args: argparse.Namespace, config: type = EngineConfig) -> dict[str, object]:
    """``{field: value}`` of the fields of ``config`` that ``args`` holds (``suppress``: those given)."""
    hints = engine_fields() if config is EngineConfig else worker_fields()
    return {name: _value(getattr(args, name)) for name in hints if hasattr(args, name)}


def engine_config(args: argparse.Namespace, **fixed) -> EngineConfig:
    """The ``EngineConfig`` of a command's engine flags, with ``fixed`` fields on top.

    Raises:
        ValueError: as ``EngineConfig`` does, naming the flag (``--kv-format: ...``).
    """
    values = {**given_flags(args), **fixed}
    values["model"] = str(values["model"])
    try:
        return EngineConfig(**values)
    except ValueError as error:  # "kv_format: ..." -> "--kv-format: ..."
        field, sep, message = str(error).partition(": ")
        if sep and field in values:
            raise ValueError(f"{flag_names(field)[0]}: {message}") from None
        raise


def worker_config_from_flags(argv: list[str]) -> WorkerConfig:
    """A ``WorkerConfig`` from ``baton worker`` flags alone (no file, no environment)."""
    from .worker_config import load_worker_config

    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_config_flags(parser, WorkerConfig, suppress=True)
    add_config_flags(parser, EngineConfig, suppress=True)
    try:
        args, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as error:
        raise ValueError(str(error)) from None
    if extra:
        raise ValueError(f"{extra[0]}: not a worker flag")
    return load_worker_config(flags={**given_flags(args, WorkerConfig), **given_flags(args)})


def _value(value):
    return tuple(value) if isinstance(value, list) else value


def _optional(hint):
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None)), True
    return hint, False


def _metavar(name: str, kind) -> str:
    if name.endswith("_s") or name == "grace_period_s":
        return "S"
    return {int: "N", float: "X"}.get(kind, name.upper())


def _shown(value) -> str:
    return str(value)
