"""Hugging Face checkpoint folders: explicit tensor-name mapping, streaming load, random tiny checkpoints."""
