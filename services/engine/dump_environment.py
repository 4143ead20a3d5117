"""The environment fingerprint of a log-prob dump computed with a Baton model, filled one way for every
producer: ``baton generate`` and ``baton score`` (the engine: ``engine_environment``) and the trainer's
dumps (``trainer/logprob_dump.py``: ``model_environment``).

``mismatch`` is torch-free and takes what it cannot read itself from its caller; this module reads it
from the model: the device by name, the kernel backend, the numerics mode and the compute dtype.
"""

import dataclasses
from collections.abc import Iterable

import torch

from mismatch import Environment, collect_environment, cpu_name
from mismatch.environment import Scalar
from services.engine.adapters.lora_adapter import LoraAdapter
from services.engine.model.causal_lm import CausalLM


def device_name(device: str | torch.device) -> str:
    """The device by name: the GPU's (``NVIDIA H200``) or ``cpu: <model name>``."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def model_environment(
    model: CausalLM,
    *,
    checkpoint: str | None,
    kv_format: str | None = None,
    flags: dict[str, Scalar] | None = None,
) -> Environment:
    """The fingerprint of log-probs ``model`` computed.

    Args:
        model: the model (its device, kernel backend, numerics and dtype are read from it).
        checkpoint: the weights' fingerprint (``EngineCore.model_fingerprint``,
            ``checkpoint_fingerprint(folder)``).
        kv_format: the engine's KV block storage; None where there is no paged cache (the trainer).
        flags: the producer's other settings.
    """
    return collect_environment(
        device=device_name(model.device),
        kernels=model.kernels.name,
        numerics="batch_invariant" if model.numerics.batch_invariant else "default",
        dtype=str(model.dtype).removeprefix("torch."),
        kv_format=kv_format,
        checkpoint=checkpoint,
        flags=flags,
    )


def adapters_flag(adapters: Iterable[LoraAdapter]) -> str:
    """The adapters a run could apply, as one flag value: ``name@digest`` comma-separated, by name
    (the digest hashes the folder's files, so an updated adapter reads differently)."""
    return ",".join(adapter.cache_salt for adapter in sorted(adapters, key=lambda a: a.name))


def engine_flags(llm) -> dict[str, Scalar]:
    """An ``LLM``'s engine settings as dump flags: the ``EngineConfig`` fields the environment has no
    field of its own for, and the loaded adapters as ``adapters_flag`` (their contents, not paths)."""
    own = ("model", "device", "dtype", "batch_invariant", "kv_format", "kernels", "adapters")
    flags = {name: value for name, value in dataclasses.asdict(llm.config).items() if name not in own}
    registry = llm.engine.adapters
    flags["adapters"] = adapters_flag(registry.get(name) for name in registry.names)
    return flags


def engine_environment(llm, flags: dict[str, Scalar]) -> Environment:
    """The fingerprint of log-probs an ``LLM``'s engine computed (``baton generate``, ``baton score``)."""
    return model_environment(
        llm.engine.model, checkpoint=llm.engine.model_fingerprint, kv_format=llm.config.kv_format, flags=flags
    )
