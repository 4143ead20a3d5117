"""The router's picture of each worker's prefix cache: the block hashes the worker says it holds.

Workers publish their cache events on their load feed (``WatchLoad``: a full picture, then hashes
inserted and evicted), hashed with the engine's own chain (``chain_root`` + ``extend_chain``), salted
by the worker's model fingerprint, adapter and tenant over the worker's block size. So a match is the
number of leading prompt tokens whose blocks that worker really held as of its last update.
"""

from dataclasses import dataclass

from common.prefix_hash import chain_root, extend_chain

BASE_ADAPTER = ""  # what the engine salts base-model requests with (EngineCore.reserve / add_prefill_only)


@dataclass(frozen=True)
class ChainSalt:
    """What a worker's block hashes depend on besides the tokens: its model and block size."""

    model_fingerprint: str
    block_size: int


class PromptHashes:
    """One prompt's block hash chains, computed once per distinct worker salt (a request scores every
    worker; most share one salt). A request under a LoRA ``adapter`` matches nothing: the engine salts
    it with the adapter's name and content digest (``LoraAdapter.cache_salt``), which the load feed does
    not carry, so the router cannot name its blocks and scores it by load alone."""

    def __init__(self, prompt_ids: list[int], tenant: str, adapter: str = BASE_ADAPTER):
        self.prompt_ids = prompt_ids
        self.tenant = tenant
        self.adapter = adapter
        self._by_salt: dict[ChainSalt, list[bytes]] = {}

    def under(self, salt: ChainSalt) -> list[bytes]:
        """Hashes of the prompt's full blocks as a worker with ``salt`` names them."""
        if self.adapter != BASE_ADAPTER:
            return []
        hashes = self._by_salt.get(salt)
        if hashes is None:
            root = chain_root(salt.model_fingerprint, BASE_ADAPTER, self.tenant)
            hashes = extend_chain([], self.prompt_ids, salt.block_size, root)
            self._by_salt[salt] = hashes
        return hashes


class PrefixIndex:
    """Per worker: its chain salt and the set of block hashes its prefix cache holds.

    Not thread-safe: the pool calls it under its lock. A worker with no full picture yet (or one that
    reuses no prefix) matches nothing.
    """

    def __init__(self):
        self._salt: dict[str, ChainSalt] = {}
        self._held: dict[str, set[bytes]] = {}

    def reset(self, worker: str, salt: ChainSalt | None, hashes) -> None:
        """A full picture: ``worker`` holds exactly ``hashes`` (``salt`` None: it caches no prefix)."""
        if salt is None:
            self.forget(worker)
            return
        self._salt[worker] = salt
        self._held[worker] = set(hashes)

    def apply(self, worker: str, inserted, evicted) -> None:
        """An update: blocks registered and evicted since the worker's last one (disjoint sets)."""
        held = self._held.get(worker)
        if held is None:
            return  # no full picture yet: the next one covers these
        held.difference_update(evicted)
        held.update(inserted)

    def salt(self, worker: str) -> ChainSalt | None:
        return self._salt.get(worker)

    def match_tokens(self, worker: str, hashes: list[bytes]) -> int:
        """Leading prompt tokens whose blocks ``worker`` holds; ``hashes`` must be under its salt (a
        lookup: nothing changes)."""
        held, salt = self._held.get(worker), self._salt.get(worker)
        if not held or salt is None:
            return 0
        count = 0
        for block_hash in hashes:
            if block_hash not in held:
                break
            count += 1
        return count * salt.block_size

    def held_blocks(self, worker: str) -> int:
        return len(self._held.get(worker, ()))

    def forget(self, worker: str) -> None:
        """The worker went down or left: what it held is unknown until its next full picture."""
        self._salt.pop(worker, None)
        self._held.pop(worker, None)
