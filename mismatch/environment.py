"""The environment fingerprint a dump carries in its header, and how two of them differ.

Everything that can change a log-prob's bits without changing the request: library versions, the
device, the kernel backend, the numerics mode, dtypes, the KV format, the checkpoint, the flags and
the environment variables that steer numerics. ``baton mismatch`` compares it before any token: two
dumps that differ in a field their experiment does not vary are not evidence of anything.

Torch-free by design (the trainer and the CLI both write it): the caller names the device.
"""

import dataclasses
import importlib.metadata
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

NUMERICS = ("default", "batch_invariant")
# Distribution name -> the name the fingerprint gives it.
LIBRARIES = {
    "torch": "torch",
    "triton": "triton",
    "fla-core": "fla",
    "flash-linear-attention": "flash-linear-attention",
    "transformers": "transformers",
    "numpy": "numpy",
}
# Environment variables that change which kernels run or how they reduce.
NUMERICS_VARIABLES = (
    "MKL_CBWR",
    "TRITON_INTERPRET",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
)
Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class Environment:
    """Where and how a dump's log-probs were computed.

    Attributes:
        python: interpreter version.
        platform: OS and machine (``Linux-x86_64``).
        libraries: library name -> version (None when not installed); see ``LIBRARIES``.
        device: the device by name (``NVIDIA H200``, ``cpu: <model name>``).
        kernels: the kernel backend (``reference``, ``triton``, or a trainer's own name).
        numerics: ``default`` or ``batch_invariant``.
        dtype: compute dtype name (None when unknown).
        kv_format: KV block storage (``auto``, ``fp8``); None where there is no paged cache (a trainer).
        checkpoint: the checkpoint's fingerprint (``EngineCore.model_fingerprint``), None if not given.
        flags: other settings that may matter (engine sizes, sampling parameters, trainer options).
        variables: the ``NUMERICS_VARIABLES`` that were set.
    """

    python: str
    platform: str
    libraries: dict[str, str | None]
    device: str
    kernels: str
    numerics: str
    dtype: str | None = None
    kv_format: str | None = None
    checkpoint: str | None = None
    flags: dict[str, Scalar] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics: {self.numerics!r} is not one of {', '.join(NUMERICS)}")
        for name in ("python", "platform", "device", "kernels"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: expected a string, got {getattr(self, name)!r}")
        for name in ("dtype", "kv_format", "checkpoint"):
            if not isinstance(getattr(self, name), (str, type(None))):
                raise ValueError(f"{name}: expected a string or null, got {getattr(self, name)!r}")
        for name, allowed in (("libraries", (str, type(None))), ("flags", Scalar), ("variables", str)):
            table = getattr(self, name)
            if not isinstance(table, dict):
                raise ValueError(f"{name}: expected an object, got {table!r}")
            for key, value in table.items():
                if not isinstance(key, str) or not isinstance(value, allowed):
                    raise ValueError(f"{name}.{key}: expected a {_names(allowed)}, got {value!r}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data) -> "Environment":
        """Read ``to_json``'s form; ValueError naming the field on anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"{missing[0]}: missing")
        return cls(**data)

    def flat(self) -> dict[str, Scalar]:
        """One entry per leaf, dotted (``libraries.torch``, ``flags.max_num_seqs``)."""
        out: dict[str, Scalar] = {}
        for name, value in self.to_json().items():
            if isinstance(value, dict):
                out.update({f"{name}.{key}": leaf for key, leaf in value.items()})
            else:
                out[name] = value
        return out


@dataclass(frozen=True)
class FieldDiff:
    """One environment field whose value differs; ``allowed`` when the experiment varies it."""

    field: str
    a: Scalar
    b: Scalar
    allowed: bool


def diff_environments(a: Environment, b: Environment, may_differ: tuple[str, ...] = ()) -> list[FieldDiff]:
    """The fields whose values differ, in field order. A field is allowed to differ when it, or a
    dotted prefix of it, is in ``may_differ`` (``flags`` allows every ``flags.*``). A leaf present
    on one side only differs from the other side's None."""
    flat_a, flat_b = a.flat(), b.flat()
    diffs = []
    for name in list(flat_a) + [n for n in flat_b if n not in flat_a]:
        left, right = flat_a.get(name), flat_b.get(name)
        if left != right or type(left) is not type(right):
            allowed = any(name == p or name.startswith(p + ".") for p in may_differ)
            diffs.append(FieldDiff(name, left, right, allowed))
    return diffs


def collect_environment(
    *,
    device: str,
    kernels: str,
    numerics: str,
    dtype: str | None = None,
    kv_format: str | None = None,
    checkpoint: str | None = None,
    flags: dict[str, Scalar] | None = None,
) -> Environment:
    """This process's fingerprint: versions and variables read here, the rest from the caller.

    Args:
        device: the device by name; ``cpu_name()`` for the CPU, ``torch.cuda.get_device_name`` on a GPU.
        kernels, numerics, dtype, kv_format, checkpoint, flags: see ``Environment``.
    """
    libraries = {}
    for distribution, name in LIBRARIES.items():
        try:
            libraries[name] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            libraries[name] = None
    return Environment(
        python=platform.python_version(),
        platform=f"{platform.system()}-{platform.machine()}",
        libraries=libraries,
        device=device,
        kernels=kernels,
        numerics=numerics,
        dtype=dtype,
        kv_format=kv_format,
        checkpoint=checkpoint,
        flags=dict(flags or {}),
        variables={name: os.environ[name] for name in NUMERICS_VARIABLES if name in os.environ},
    )


def cpu_name() -> str:
    """``cpu: <model name>`` from ``/proc/cpuinfo`` (kernels differ by instruction set), else the
    machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return f"cpu: {value.strip()}"
    except OSError:
        pass
    return f"cpu: {platform.processor() or platform.machine()}"


def _names(types) -> str:
    parts = getattr(types, "__args__", types if isinstance(types, tuple) else (types,))
    return " or ".join("null" if t is type(None) else t.__name__ for t in parts)
