"""A checkpoint's identity, the same wherever the folder is mounted.

It salts the prefix-cache hash chain (``common/prefix_hash.py``) and is part of the handoff layout, so
a prefill and a decode worker, or two nodes of the cluster-wide cache tier, agree on it when they
load the same checkpoint from different paths. Reading every weight would take minutes at real sizes:
the fingerprint covers ``config.json`` whole and, of each weight file, its name, its size and its
first and last ``SAMPLE_BYTES`` (the safetensors header, with every tensor's name, dtype, shape and
offset, and weight values at both ends), which tells apart two checkpoints of one architecture.
"""

import hashlib
import struct
from pathlib import Path

SAMPLE_BYTES = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def checkpoint_fingerprint(model_dir: str | Path) -> str:
    """Hex SHA-256 of ``config.json`` and a sample of every weight file (see the module docstring)."""
    folder = Path(model_dir)
    digest = hashlib.sha256(b"baton-checkpoint-v1")
    _add(digest, (folder / "config.json").read_bytes())
    for path in sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()):
        size = path.stat().st_size
        _add(digest, path.name.encode())
        digest.update(struct.pack("<Q", size))
        with path.open("rb") as weights:
            _add(digest, weights.read(SAMPLE_BYTES))
            if size > SAMPLE_BYTES:
                weights.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
                _add(digest, weights.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _add(digest, data: bytes) -> None:
    """Length-prefixed, so no two sequences of parts hash alike."""
    digest.update(struct.pack("<Q", len(data)) + data)
