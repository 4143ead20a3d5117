"""The block hash chain of the prefix cache (the engine's cache keys; the same in every process).

``h_0 = H(root, tokens[0:B])``, ``h_i = H(h_{i-1}, tokens[iB:(i+1)B])`` over full blocks only, with
``root = H(model fingerprint, adapter, tenant)``: two requests share a cached block only when they
share the model, adapter, tenant and every token up to the block's end. SHA-256, so hashes are
stable across processes and machines (the cluster-wide tier relies on that).
"""

import hashlib
import struct


def chain_root(model_fingerprint: str, adapter: str = "", tenant: str = "") -> bytes:
    """The salt every chain starts from."""
    digest = hashlib.sha256(b"baton-prefix-v1")
    for part in (model_fingerprint, adapter, tenant):
        encoded = part.encode()
        digest.update(struct.pack("<I", len(encoded)) + encoded)
    return digest.digest()


def extend_chain(hashes: list[bytes], token_ids: list[int], block_size: int, root: bytes) -> list[bytes]:
    """Hashes of every full block of ``token_ids``, reusing the ``hashes`` already computed for them."""
    hashes = list(hashes)
    for index in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else root
        block = token_ids[index * block_size : (index + 1) * block_size]
        hashes.append(hashlib.sha256(parent + struct.pack(f"<{block_size}q", *block)).digest())
    return hashes
