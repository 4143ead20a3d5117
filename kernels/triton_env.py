"""Where our Triton kernels may run: CUDA, or the CPU under Triton's interpreter.

Triton decides at ``@triton.jit`` time (module import) whether a kernel is interpreted, so
``TRITON_INTERPRET=1`` must be in the environment before a kernel module is imported. Launchers
call ``require_triton_device`` so a CPU tensor without the interpreter is a clear error, not a
driver traceback.
"""

import os

import torch


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` asks for the interpreter (as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def require_triton_device(op: str, *tensors: torch.Tensor) -> None:
    """Raise a clear error when ``op``'s Triton kernel cannot run on the tensors' device.

    CUDA tensors run compiled kernels; CPU tensors run only under the Triton interpreter.

    Raises:
        ValueError: tensors on different devices.
        RuntimeError: CPU tensors without ``TRITON_INTERPRET=1``, or another device type.
    """
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{op}: all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cuda" or (device.type == "cpu" and interpreter_enabled()):
        return
    if device.type == "cpu":
        raise RuntimeError(
            f"{op}: the Triton kernel got CPU tensors; CPU runs need the Triton interpreter "
            "(set TRITON_INTERPRET=1 before triton is imported) or the reference backend"
        )
    raise RuntimeError(f"{op}: the Triton kernel does not run on device type {device.type!r}")
