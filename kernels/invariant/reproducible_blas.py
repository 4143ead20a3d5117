"""MKL's reproducible mode, which the batch-invariant CPU path relies on.

MKL picks its GEMM kernels by CPU and by thread count: on some x86 machines a row's bits change
between 1 and 2 threads (seen on a CI machine, 2026-11-30: 81,616 of 90,000 elements). MKL's
Conditional Numerical Reproducibility in *strict* mode (``MKL_CBWR=AUTO,STRICT``) documents results
that do not depend on the thread count, so the invariant path asks for it instead of trusting luck.

MKL reads the mode once, at its first call, so it must be chosen before any matrix product runs:
``request_strict_mkl`` (environment, at process start: the ``baton`` command, the engine package and
the test suite call it) and ``ensure_strict_mkl`` (checked when the invariant path first multiplies on
the CPU; it sets the mode itself if MKL has not started yet, and refuses to run otherwise).
"""

import ctypes
import functools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

MKL_CBWR_VARIABLE = "MKL_CBWR"
STRICT_AUTO = "AUTO,STRICT"
_CBWR_ALL = -1  # MKL_CBWR_ALL: the whole mode word, branch and flags
_CBWR_AUTO = 2  # MKL_CBWR_AUTO: the fastest code path this CPU supports
_CBWR_STRICT = 0x10000  # MKL_CBWR_STRICT: results independent of the thread count
_CBWR_SUCCESS = 0


def request_strict_mkl() -> None:
    """Ask for MKL's strict reproducible mode for this process and its children (an explicit
    ``MKL_CBWR`` the user set is kept; ``ensure_strict_mkl`` then says whether it suffices)."""
    os.environ.setdefault(MKL_CBWR_VARIABLE, STRICT_AUTO)


@functools.cache
def _mkl_service() -> ctypes.CDLL | None:
    """torch's own MKL (linked into libtorch_cpu), or None when this torch has no MKL."""
    import torch

    if not torch.backends.mkl.is_available():
        return None
    library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    if not hasattr(library, "mkl_serv_cbwr_get"):
        return None
    library.mkl_serv_cbwr_get.restype = ctypes.c_int
    library.mkl_serv_cbwr_get.argtypes = [ctypes.c_int]
    library.mkl_serv_cbwr_set.restype = ctypes.c_int
    library.mkl_serv_cbwr_set.argtypes = [ctypes.c_int]
    return library


def mkl_mode() -> int | None:
    """MKL's current CNR mode word (``MKL_CBWR_STRICT`` bit included), or None without MKL."""
    library = _mkl_service()
    return None if library is None else library.mkl_serv_cbwr_get(_CBWR_ALL)


def mkl_is_strict() -> bool | None:
    """True when MKL runs in strict reproducible mode; None when this torch has no MKL."""
    mode = mkl_mode()
    return None if mode is None else bool(mode & _CBWR_STRICT)


@functools.cache
def ensure_strict_mkl() -> None:
    """Make sure CPU matrix products are thread-count reproducible, or refuse.

    Raises:
        RuntimeError: MKL already runs in a non-strict mode (it started before the mode was chosen,
            or ``MKL_CBWR`` names a mode without ``STRICT``); the message says what to set.
    """
    library = _mkl_service()
    if library is None:
        log.warning(
            "batch-invariant mode: this torch has no MKL, so CPU matrix products are reproducible "
            "only as far as the fixed-tile probe shows; bits may differ across machines and thread counts"
        )
        return
    mode = library.mkl_serv_cbwr_get(_CBWR_ALL)
    if mode & _CBWR_STRICT:
        return
    if library.mkl_serv_cbwr_set(_CBWR_AUTO | _CBWR_STRICT) == _CBWR_SUCCESS:
        log.info("batch-invariant mode: MKL switched to its strict reproducible mode (%s)", STRICT_AUTO)
        return
    raise RuntimeError(
        f"batch-invariant mode needs MKL's strict reproducible mode, but MKL already runs in mode "
        f"{mode:#x} ({MKL_CBWR_VARIABLE}={os.environ.get(MKL_CBWR_VARIABLE, '<unset>')}): start the "
        f"process with {MKL_CBWR_VARIABLE}={STRICT_AUTO} (the mode is fixed at MKL's first call)"
    )
