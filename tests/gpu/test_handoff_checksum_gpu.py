"""The handoff checksum on the GPU (run on the device machine; skipped without CUDA): a handoff's rows in
several regions of device storages hash, in one sync, to the value the CPU path gives for the same bytes
(a CUDA prefill and a CPU decode agree), and a one-bit change is seen; the same for a parallel
handoff's span checksum."""

import pytest
import torch

from services.engine.handoff_checksum import rows_checksum, settled, span_address, spans_checksum
from services.transfer import BLOCKS, DRAFT_STATE, STATE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CAPABILITY = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def test_device_regions_hash_like_the_cpu():
    g = torch.Generator().manual_seed(0)
    cpu = {
        BLOCKS: torch.randint(0, 256, (40, 9 * 1024 + 8), dtype=torch.uint8, generator=g),
        STATE: torch.randint(0, 256, (5, 3000 * 8), dtype=torch.uint8, generator=g),
        DRAFT_STATE: torch.randint(0, 256, (3, 64), dtype=torch.uint8, generator=g),
    }
    rows = {BLOCKS: [7, 3, 39, 0], STATE: [4], DRAFT_STATE: [1, 2]}
    cuda = {region: storage.cuda() for region, storage in cpu.items()}
    want = rows_checksum(cpu, rows, CAPABILITY)
    assert rows_checksum(cuda, rows, CAPABILITY) == want
    cuda[STATE][4, 17] ^= 4
    assert rows_checksum(cuda, rows, CAPABILITY) != want


def test_device_spans_hash_like_the_cpu():
    """A parallel handoff's span checksum: spans of any length and alignment at scattered addresses, on
    the GPU (the prefill rank's staging) and on the CPU (a decode rank's pools), agree."""
    g = torch.Generator().manual_seed(1)
    source = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=g)
    offsets = torch.sort(torch.randint(0, source.numel() - 70000, (300,), generator=g)).values
    nbytes = torch.randint(0, 70000, (300,), generator=g)
    addresses = span_address(3, STATE, torch.randint(0, 1 << 34, (300,), generator=g))
    want = settled([spans_checksum(source, offsets, addresses, nbytes, 0xFEEDFACECAFEBEEF)])
    device = source.cuda()
    assert settled([spans_checksum(device, offsets, addresses, nbytes, 0xFEEDFACECAFEBEEF)]) == want
    device[int(offsets[int(nbytes.argmax())]) + 1] ^= 1
    assert settled([spans_checksum(device, offsets, addresses, nbytes, 0xFEEDFACECAFEBEEF)]) != want
