"""Tokenization for the engine: Hugging Face tokenizer folders, chat templates, streaming detokenization."""

from services.engine.tokenizer.builder import write_tiny_tokenizer
from services.engine.tokenizer.detokenizer import IncrementalDetokenizer
from services.engine.tokenizer.tokenizer import Tokenizer, TokenizerNotFoundError

__all__ = ["IncrementalDetokenizer", "Tokenizer", "TokenizerNotFoundError", "write_tiny_tokenizer"]
