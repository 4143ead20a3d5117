"""Op-family backends chosen by name (``reference``, ``triton``): see ``kernel_set``."""

from .kernel_set import (
    INTERPRETER_VARIABLE,
    KERNEL_BACKENDS,
    KernelSet,
    build_kernels,
    check_kernels,
    default_kernels,
)
from .triton_kernels import TritonKernels, library_kernels

__all__ = [
    "INTERPRETER_VARIABLE",
    "KERNEL_BACKENDS",
    "KernelSet",
    "TritonKernels",
    "build_kernels",
    "check_kernels",
    "default_kernels",
    "library_kernels",
]
