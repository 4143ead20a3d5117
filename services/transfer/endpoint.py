"""What a peer sees of a backend: its registered regions and connection metadata.

``TransferEndpoint`` is the one object the receiver hands the sender (through the gRPC reservation
answer); ``RegionInfo`` describes one registered ``[num_rows, row_bytes]`` uint8 region in it.
"""

from dataclasses import dataclass

import torch

from common.errors import TransferError


@dataclass(frozen=True)
class RegionInfo:
    """One registered region as a peer sees it.

    Attributes:
        name: region name (``BLOCKS``, ``STATE``, ...).
        base_addr: address of row 0 in the owner's address space (host or device pointer).
        row_bytes: bytes per row.
        num_rows: rows in the region.
        mem_type: ``"DRAM"`` (host) or ``"VRAM"`` (GPU).
        device_id: GPU index for ``"VRAM"``, 0 for ``"DRAM"``.
    """

    name: str
    base_addr: int
    row_bytes: int
    num_rows: int
    mem_type: str
    device_id: int

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.num_rows


@dataclass(frozen=True)
class TransferEndpoint:
    """Everything a sender needs to write into a receiver; travels over gRPC unchanged.

    Attributes:
        backend: the backend name that produced it (a peer must use the same backend).
        agent_name: the receiver's unique agent name (the key notifications and peers use).
        metadata: opaque backend connection metadata (NIXL agent metadata for ``"nixl"``).
        regions: the receiver's registered regions, in registration order.
    """

    backend: str
    agent_name: str
    metadata: bytes
    regions: tuple[RegionInfo, ...]

    def region(self, name: str) -> RegionInfo:
        for info in self.regions:
            if info.name == name:
                return info
        known = [info.name for info in self.regions]
        raise TransferError(f"peer {self.agent_name!r} has no region {name!r} (it has {known})")


def region_info(name: str, storage: torch.Tensor) -> RegionInfo:
    """Describe ``storage`` (``[num_rows, row_bytes]`` contiguous uint8) as region ``name``."""
    if storage.dtype != torch.uint8 or storage.dim() != 2 or not storage.is_contiguous():
        raise TransferError(
            f"region {name!r}: storage must be a contiguous 2-D uint8 tensor [rows, row_bytes], got "
            f"{storage.dtype} shape {tuple(storage.shape)} contiguous={storage.is_contiguous()}"
        )
    if storage.device.type == "cuda":
        mem_type, device_id = "VRAM", storage.device.index or 0
    elif storage.device.type == "cpu":
        mem_type, device_id = "DRAM", 0
    else:
        raise TransferError(f"region {name!r}: unsupported device {storage.device}")
    rows, row_bytes = storage.shape
    return RegionInfo(name, storage.data_ptr(), row_bytes, rows, mem_type, device_id)
