"""HiCache: the node's host tier of KV blocks and KDA snapshots (``docs/hicache.md``)."""
