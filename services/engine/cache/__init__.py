"""The engine's cache memory: packed MLA blocks and KDA state slots, their layouts and allocators."""
