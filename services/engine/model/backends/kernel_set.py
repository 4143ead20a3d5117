"""Kernel backends by name: which implementation each op family (attention, indexer, KDA, MoE,
sampling) runs, checked against the device at start.

- ``reference``: the float32 PyTorch code (``kernels/*/naive.py`` through the model's ``Numerics``):
  the oracle and the CPU path; it loops over sequences from the step's host copies.
- ``triton``: the batch-level kernels of ``triton_kernels``. On the CPU it needs the Triton
  interpreter (``TRITON_INTERPRET=1`` set before triton is imported). A family whose kernel cannot
  run under the interpreter or cannot read the KV format runs its reference, and the log says so
  once (the library's kernels all run interpreted and its attention kernels read FP8 rows).

In batch-invariant mode every family runs through the invariant numerics (the reference loops), and
the name picks the numerics' own kernels: ``reference`` the torch invariant ops
(``kernels.invariant``), ``triton`` the fixed-tiling Triton kernels (``kernels.invariant.*_triton``),
with the same device checks as above. The batch-invariant default stays ``reference`` on every device:
the trainer forward (``trainer/``) reproduces the served bits with the torch invariant ops under
autograd, and the invariant Triton kernels have no backward yet, so serving on them is opt-in
(``--kernels triton --batch-invariant``) until they do.
"""

import importlib.util
import logging
import os
from dataclasses import dataclass

import torch

from ..numerics import Numerics
from .attention import AttentionBackend, ReferenceAttention, TritonAttention
from .indexer import IndexerBackend, ReferenceIndexer, TritonIndexer
from .kda import KdaBackend, ReferenceKda, TritonKda
from .moe import MoeBackend, ReferenceMoe, TritonMoe
from .sampling import ReferenceSampling, SamplingBackend, TritonSampling
from .triton_kernels import TritonKernels, library_kernels

log = logging.getLogger(__name__)

KERNEL_BACKENDS = ("reference", "triton")
INTERPRETER_VARIABLE = "TRITON_INTERPRET"

# Op family -> the kernels it needs and whether they read KV rows (FP8-sensitive).
_FAMILY_KERNELS = {
    "attention": (("paged_mla_decode",), True),
    "indexer": (("paged_indexer_topk",), True),
    "kda": (("causal_conv1d_varlen", "kda_varlen"), False),
    "moe": (("moe_grouped",), False),
    "sampling": (("sample_batch",), False),
}


@dataclass(frozen=True)
class KernelSet:
    """One implementation per op family, and the backend name it was chosen by."""

    name: str
    attention: AttentionBackend
    indexer: IndexerBackend
    kda: KdaBackend
    moe: MoeBackend
    sampling: SamplingBackend

    @property
    def forward_graph_safe(self) -> bool:
        """Every forward family reads only device tensors: a CUDA graph may capture the forward."""
        return all(f.graph_safe for f in (self.attention, self.indexer, self.kda, self.moe))

    def reference_families(self) -> tuple[str, ...]:
        """Families running their reference implementation."""
        return tuple(name for name in _FAMILY_KERNELS if getattr(self, name).kind == "reference")


def default_kernels(device: str, batch_invariant: bool = False) -> str:
    """``triton`` on CUDA, ``reference`` on the CPU and in batch-invariant mode (see the module
    docstring: there ``triton`` is asked for explicitly)."""
    return "triton" if device.startswith("cuda") and not batch_invariant else "reference"


def check_kernels(name: str, device: str, batch_invariant: bool = False) -> None:
    """Refuse, at start, a backend that does not exist or cannot run here.

    Raises:
        ValueError: naming ``--kernels`` (and the conflicting flag or variable).
    """
    if name not in KERNEL_BACKENDS:
        raise ValueError(f"--kernels: unknown backend {name!r} (choose from {', '.join(KERNEL_BACKENDS)})")
    if name == "reference":
        return
    what = "triton (with --batch-invariant: the invariant Triton kernels)" if batch_invariant else "triton"
    if importlib.util.find_spec("triton") is None:
        raise ValueError(f"--kernels: {what} needs the triton package, which is not installed")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--kernels: {what} on --device {device} needs a CUDA GPU, and none is visible")
        return
    if os.environ.get(INTERPRETER_VARIABLE) != "1":
        raise ValueError(
            f"--kernels: {what} on the CPU runs under the Triton interpreter; set {INTERPRETER_VARIABLE}=1 "
            "in the environment before starting (it must be set before triton is imported)"
        )


def build_kernels(
    name: str,
    nx: Numerics,
    device: str,
    kv_format: str = "auto",
    library: TritonKernels | None = None,
) -> KernelSet:
    """The ``KernelSet`` for a backend name (``check_kernels`` first).

    Args:
        name: ``reference`` or ``triton``.
        nx: the model's numerics (what the reference families compute with). Batch-invariant numerics
            take the reference families whatever the name (their kernels follow the name instead).
        device: where the model runs.
        kv_format: the block storage format.
        library: the Triton kernels (default: ``library_kernels()``).
    """
    reference = {
        "attention": ReferenceAttention(nx),
        "indexer": ReferenceIndexer(nx),
        "kda": ReferenceKda(nx),
        "moe": ReferenceMoe(nx),
        "sampling": ReferenceSampling(),
    }
    if name == "reference" or nx.batch_invariant:
        return KernelSet(name=name, **reference)
    library = library or library_kernels()
    families = dict(reference)
    for family, (needed, reads_kv) in _FAMILY_KERNELS.items():
        why = _why_reference(library, needed, reads_kv, device, kv_format)
        if why:
            log.info("kernels triton: %s runs its reference (%s)", family, why)
            continue
        families[family] = _triton_family(family, library)
    return KernelSet(name=name, **families)


def _why_reference(
    library: TritonKernels, needed: tuple[str, ...], reads_kv: bool, device: str, kv_format: str
) -> str:
    if not device.startswith("cuda"):
        blocked = [kernel for kernel in needed if kernel not in library.interpretable]
        if blocked:
            return f"cannot run under the Triton interpreter: {', '.join(blocked)}"
    if reads_kv and kv_format == "fp8":
        unread = [kernel for kernel in needed if kernel not in library.reads_fp8]
        if unread:
            return f"cannot read FP8 rows: {', '.join(unread)}"
    return ""


def _triton_family(family: str, library: TritonKernels):
    if family == "attention":
        return TritonAttention(library.paged_mla_decode)
    if family == "indexer":
        return TritonIndexer(library.paged_indexer_topk)
    if family == "kda":
        return TritonKda(library.causal_conv1d_varlen, library.kda_varlen)
    if family == "moe":
        return TritonMoe(library.moe_grouped)
    return TritonSampling(library.sample_batch)
