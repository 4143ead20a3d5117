"""``TransferBackend.read``: rows of a peer's region into local rows, NIXL agents in one process."""

import pytest
import torch

from common.errors import TransferError
from services.transfer import BLOCKS, STATE, make_backend


def filled(rows: int, row_bytes: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, generator=generator)


@pytest.fixture(scope="module")
def agents():
    owner, reader = make_backend("nixl", "read-owner"), make_backend("nixl", "read-reader")
    remote_blocks, remote_state = filled(6, 48, 1), filled(3, 80, 2)
    owner.register(BLOCKS, remote_blocks)
    owner.register(STATE, remote_state)
    local_blocks, local_state = (
        torch.full((5, 48), 0xA5, dtype=torch.uint8),
        torch.zeros(2, 80, dtype=torch.uint8),
    )
    reader.register(BLOCKS, local_blocks)
    reader.register(STATE, local_state)
    peer = reader.connect(owner.endpoint())
    try:
        yield reader, peer, (remote_blocks, remote_state), (local_blocks, local_state)
    finally:
        reader.close()
        owner.close()


def test_read_copies_rows_bitwise_and_leaves_the_rest(agents):
    reader, peer, (remote_blocks, remote_state), (local_blocks, local_state) = agents
    before = local_blocks.clone()
    stats = reader.read(peer, {BLOCKS: [(0, 3), (1, 4), (3, 0), (4, 0)], STATE: [(1, 2)]})
    assert stats.nbytes == 4 * 48 + 80
    expected = before.clone()
    for local, remote in [(0, 3), (1, 4), (3, 0), (4, 0)]:
        expected[local] = remote_blocks[remote]
    assert torch.equal(local_blocks, expected)
    assert torch.equal(local_state[1], remote_state[2])
    assert not local_state[0].any()


def test_read_checks_rows_before_moving_a_byte(agents):
    reader, peer, _, (local_blocks, _) = agents
    before = local_blocks.clone()
    with pytest.raises(TransferError, match="remote row 6 out of range"):
        reader.read(peer, {BLOCKS: [(0, 1), (1, 6)]})
    with pytest.raises(TransferError, match="local row 2 is written twice"):
        reader.read(peer, {BLOCKS: [(2, 1), (2, 2)]})
    with pytest.raises(TransferError, match="unknown peer"):
        reader.read("nobody", {BLOCKS: [(0, 0)]})
    assert torch.equal(local_blocks, before)


def test_grpc_bytes_cannot_read():
    owner, reader = make_backend("grpc_bytes", "g-owner"), make_backend("grpc_bytes", "g-reader")
    with owner, reader:
        owner.register(BLOCKS, torch.zeros(2, 8, dtype=torch.uint8))
        reader.register(BLOCKS, torch.zeros(2, 8, dtype=torch.uint8))
        peer = reader.connect(owner.endpoint())
        with pytest.raises(TransferError, match="read is not supported by grpc_bytes; use nixl"):
            reader.read(peer, {BLOCKS: [(0, 1)]})
