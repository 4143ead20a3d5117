"""Where our Triton kernels may run: CUDA, or the CPU under Triton's interpreter.

Triton decides at ``@triton.jit`` time (module import) whether a kernel is interpreted, so
``TRITON_INTERPRET=1`` must be in the environment before a kernel module is imported. Launchers
call ``check_triton_device`` so a CPU tensor without the interpreter is a clear error, not a
driver traceback.
"""

import os

import torch


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` asks for the interpreter (as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_triton_device(tensor: torch.Tensor, op: str) -> None:
    """Raise unless ``tensor`` lives where a Triton kernel can run (CUDA, or CPU with the interpreter)."""
    if tensor.device.type == "cuda":
        return
    if tensor.device.type == "cpu" and interpreter_enabled():
        return
    raise RuntimeError(
        f"{op}: Triton kernels need a CUDA tensor, or TRITON_INTERPRET=1 set before the kernel modules "
        f"are imported to run on CPU under the interpreter (got a {tensor.device.type} tensor)"
    )
