"""Tokenization for the router and the engine: Hugging Face tokenizer folders, chat templates, streaming
detokenization."""

from common.tokenizer.builder import write_tiny_tokenizer, write_tokenizer
from common.tokenizer.detokenizer import IncrementalDetokenizer
from common.tokenizer.tokenizer import Tokenizer, TokenizerNotFoundError

__all__ = [
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerNotFoundError",
    "write_tiny_tokenizer",
    "write_tokenizer",
]
