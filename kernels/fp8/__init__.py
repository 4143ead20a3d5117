"""Packed FP8 storage formats for the paged KV cache (MLA latent, DSA index key); see ``naive.py``."""
