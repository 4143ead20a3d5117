"""Host pages in a named shared-memory file: the node tier's arenas, mapped by the workers of its node.

A ``baton cache`` tier whose arenas live in such files lets each worker on the same node map them and move
rows with plain device <-> host copies (page-locked in the worker's own process with
``cudaHostRegister``), at the bus's speed, where a transfer agent's one-sided write from a device into
another process's host memory is staged through bounce buffers (about 1 GB/s for NIXL's UCX backend on
the H200 host; ``docs/performance.md``, "HiCache"). Workers on other nodes keep using the tier's NIXL
regions: ``SharedPages.node_id`` (the kernel's boot id) says whether a worker shares the tier's memory.

The files are named ``baton-hicache-<pid>-<tier id>-<kind>`` in ``directory`` (``/dev/shm`` by default:
memory, never disk). The tier removes its files when it stops; files of a tier that died (no process
``<pid>``, or this very pid under another tier id: a container's pid 1 restarted in its pod) are removed
by the next tier that starts in the same directory. A worker's mapping outlives the file's name, and a
worker only ever touches pages a live lease of the tier gives it.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

PREFIX = "baton-hicache-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def node_id() -> str:
    """This machine's identity as its workers and tier see it: the kernel's boot id (the same in every
    container of a node), or the host name where the kernel does not say."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return os.uname().nodename


@dataclass(frozen=True)
class SharedPages:
    """Where one kind's pages are: ``path`` holds ``num_pages`` rows of ``page_bytes`` bytes, on the
    machine ``node_id``."""

    node_id: str
    path: str
    num_pages: int
    page_bytes: int

    @property
    def nbytes(self) -> int:
        return self.num_pages * self.page_bytes


def create_pages(directory: str, tier_id: str, kind: str, num_pages: int, page_bytes: int) -> SharedPages:
    """A new file for ``num_pages`` pages, its memory reserved now (a full tmpfs then fails here, not as
    a bus error at a later write).

    Raises:
        ValueError: ``directory`` is not a writable directory, or cannot hold the pages (naming both).
    """
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise ValueError(f"shm_dir: {directory!r} is not a writable directory (or give '' to turn it off)")
    path = os.path.join(directory, f"{PREFIX}{os.getpid()}-{tier_id}-{kind}")
    pages = SharedPages(node_id(), path, num_pages, page_bytes)
    descriptor = os.open(pages.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(descriptor, 0, pages.nbytes)
    except OSError as error:
        os.unlink(pages.path)
        raise ValueError(
            f"shm_dir: {directory!r} cannot hold {pages.nbytes} bytes of {kind} pages ({error.strerror})"
        ) from None
    finally:
        os.close(descriptor)
    return pages


def map_pages(pages: SharedPages) -> torch.Tensor:
    """``[num_pages, page_bytes]`` uint8 over the file, shared with every other mapping of it.

    Raises:
        ValueError: the file is missing or not the size ``pages`` says, naming the path.
    """
    try:
        size = os.stat(pages.path).st_size
    except OSError as error:
        raise ValueError(f"shared pages {pages.path!r}: {error.strerror}") from None
    if size != pages.nbytes:
        raise ValueError(f"shared pages {pages.path!r}: {size} bytes, expected {pages.nbytes}")
    flat = torch.from_file(pages.path, shared=True, size=pages.nbytes, dtype=torch.uint8)
    return flat.view(pages.num_pages, pages.page_bytes)


def remove_pages(pages: SharedPages) -> None:
    """Remove the file's name (mappings stay valid until they are dropped)."""
    try:
        os.unlink(pages.path)
    except FileNotFoundError:
        pass


def remove_orphans(directory: str, tier_id: str) -> list[str]:
    """Remove the page files in ``directory`` whose tier process is gone; returns their paths.

    Called by the tier ``tier_id`` before it makes its own files, so a file carrying this process's pid
    but another tier id is a previous process's that had the same pid (a container's pid 1, restarted
    in its pod).
    """
    removed = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        owner = _NAME.match(name)
        if owner is None:
            continue
        pid = int(owner.group(1))
        mine = pid == os.getpid() and name.startswith(f"{PREFIX}{pid}-{tier_id}-")
        if mine or (pid != os.getpid() and _alive(pid)):
            continue
        path = os.path.join(directory, name)
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def pin(storage: torch.Tensor) -> None:
    """Page-lock ``storage`` (host memory mapped by this process) for direct device copies.

    Raises:
        RuntimeError: CUDA refused (its error code in the message).
    """
    status = torch.cuda.cudart().cudaHostRegister(storage.data_ptr(), storage.numel(), 0)
    if int(status) != 0:
        raise RuntimeError(f"cudaHostRegister of {storage.numel()} bytes failed: CUDA error {int(status)}")


def unpin(storage: torch.Tensor) -> None:
    """Undo ``pin`` (no copy may be in flight)."""
    torch.cuda.cudart().cudaHostUnregister(storage.data_ptr())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True
