"""Backend selection by name and the checks every backend shares (in-process, no peer)."""

import time

import pytest
import torch

from common.errors import TransferError
from services.transfer import BLOCKS, known_backends, make_backend
from services.transfer.nixl_backend import NixlBackend


def test_unknown_backend_names_the_known_ones():
    known = r"\['grpc_bytes', 'nixl'\]"
    with pytest.raises(ValueError, match=rf"unknown transfer backend 'rdma9'; known backends: {known}"):
        make_backend("rdma9")
    assert known_backends() == ["grpc_bytes", "nixl"]


def test_nixl_backend_describes_its_regions():
    storage = torch.zeros(5, 96, dtype=torch.uint8)
    with make_backend("nixl", "prefill-x") as backend:
        assert isinstance(backend, NixlBackend)
        backend.register(BLOCKS, storage)
        endpoint = backend.endpoint()
    assert (endpoint.backend, endpoint.agent_name) == ("nixl", "prefill-x")
    assert endpoint.metadata
    region = endpoint.region(BLOCKS)
    assert (region.base_addr, region.row_bytes, region.num_rows) == (storage.data_ptr(), 96, 5)
    assert (region.mem_type, region.device_id) == ("DRAM", 0)


@pytest.mark.parametrize(
    "storage",
    [
        torch.zeros(4, 8, dtype=torch.int32),
        torch.zeros(32, dtype=torch.uint8),
        torch.zeros(8, 4, dtype=torch.uint8).t(),
    ],
    ids=["int32", "1-d", "non-contiguous"],
)
def test_register_rejects_non_row_storage(storage):
    with make_backend("nixl") as backend, pytest.raises(TransferError, match="contiguous 2-D uint8"):
        backend.register(BLOCKS, storage)


def test_misuse_is_a_transfer_error():
    storage = torch.zeros(2, 8, dtype=torch.uint8)
    backend = make_backend("nixl", "prefill-y")
    backend.register(BLOCKS, storage)
    with pytest.raises(TransferError, match="already registered"):
        backend.register(BLOCKS, storage)
    with pytest.raises(TransferError, match=r"unknown peer 'decode-9' \(connected: \[\]\)"):
        backend.write("decode-9", {BLOCKS: [(0, 0)]}, "req-1")
    endpoint = backend.endpoint()
    with pytest.raises(TransferError, match="is for backend 'grpc_bytes', not 'nixl'"):
        backend.connect(type(endpoint)("grpc_bytes", "d", b"", ()))
    with pytest.raises(TransferError, match="nixl: connect to peer 'decode-z' failed"):
        backend.connect(type(endpoint)("nixl", "decode-z", b"not nixl metadata", ()))
    with pytest.raises(TransferError, match="no notification 'req-7' within"):
        backend.wait_notification("req-7", timeout_s=0.05)
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(TransferError, match="closed"):
        backend.endpoint()


@pytest.mark.parametrize(
    "state, error",
    [("PROC", "did not complete before its timeout"), ("ERR", "failed \\(transfer state ERR\\)")],
    ids=["stuck", "error"],
)
def test_write_that_never_completes_is_bounded(monkeypatch, state, error):
    """A transfer NIXL keeps reporting in progress (or failed) ends in a TransferError, on time."""
    with make_backend("nixl", "decode-loop") as receiver, make_backend("nixl", "prefill-loop") as sender:
        receiver.register(BLOCKS, torch.zeros(2, 8, dtype=torch.uint8))
        sender.register(BLOCKS, torch.ones(2, 8, dtype=torch.uint8))
        peer = sender.connect(receiver.endpoint())
        monkeypatch.setattr(sender._agent, "check_xfer_state", lambda handle: state)
        start = time.monotonic()
        with pytest.raises(TransferError, match=error):
            sender.write(peer, {BLOCKS: [(0, 1)]}, message="req-1", timeout_s=0.3)
        assert time.monotonic() - start < 2.0
