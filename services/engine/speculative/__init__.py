"""Speculative decoding: draft proposers, verification of drafted tokens by the target, and the
acceptance rules (greedy and rejection sampling)."""
