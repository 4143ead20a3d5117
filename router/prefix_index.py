"""The router's picture of each worker's prefix cache: which prompt prefixes it has sent where."""

from collections import OrderedDict


class PrefixIndex:
    """Chained block hashes of the prompts dispatched to each worker, least recently used forgotten.

    It is an approximation (as SGLang's cache-aware router keeps one): workers evict on their own
    and the router never hears of it, so a match is a likely hit, not a promise. Blocks are
    ``block_tokens`` tokens; a block's hash covers every token before it and the tenant, so equal
    hashes mean equal prefixes.

    Args:
        block_tokens: tokens per hashed block (the workers' block size is a good choice).
        capacity_blocks: blocks remembered per worker.
    """

    def __init__(self, block_tokens: int = 16, capacity_blocks: int = 1 << 16):
        if block_tokens < 1 or capacity_blocks < 1:
            raise ValueError("block_tokens and capacity_blocks: must be >= 1")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_blocks
        self._by_worker: dict[str, OrderedDict[int, None]] = {}

    def block_hashes(self, prompt_ids: list[int], tenant: str) -> list[int]:
        """Hashes of the prompt's full blocks, each chained to the one before."""
        hashes, previous = [], hash(("baton-prefix", tenant))
        size = self.block_tokens
        for start in range(0, len(prompt_ids) - size + 1, size):
            previous = hash((previous, tuple(prompt_ids[start : start + size])))
            hashes.append(previous)
        return hashes

    def match_tokens(self, worker: str, hashes: list[int]) -> int:
        """Leading prompt tokens ``worker`` was last sent (a lookup: nothing changes)."""
        known = self._by_worker.get(worker)
        if not known:
            return 0
        count = 0
        for block_hash in hashes:
            if block_hash not in known:
                break
            count += 1
        return count * self.block_tokens

    def insert(self, worker: str, hashes: list[int]) -> None:
        """Record that ``worker`` now holds these blocks; the oldest beyond capacity are forgotten."""
        known = self._by_worker.setdefault(worker, OrderedDict())
        for block_hash in hashes:
            known[block_hash] = None
            known.move_to_end(block_hash)
        while len(known) > self.capacity_blocks:
            known.popitem(last=False)

    def forget(self, worker: str) -> None:
        """The worker restarted or went down: its cache is gone."""
        self._by_worker.pop(worker, None)
