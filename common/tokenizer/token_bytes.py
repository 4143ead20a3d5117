"""One token's piece of text as bytes and as best-effort text (OpenAI's ``logprobs`` entries).

A byte-level BPE token (GPT-2, Llama 3, Qwen, Kimi) may be part of a UTF-8 character: an emoji's
four bytes can be split over several tokens, so a token's text alone cannot say which bytes it
holds. Its token string can: each character of it stands for one byte, through the byte-level
alphabet (printable bytes stand for themselves, the others are shifted to code points 256 and up):

    byte:       0x21..0x7E  0xA1..0xAC  0xAE..0xFF   the other 68 bytes, in order
    character:  same        same        same         U+0100, U+0101, ...

Added tokens (``<|im_end|>``) are plain text; a SentencePiece byte-fallback token ``<0xE2>`` is that
one byte; any other token of a non-byte-level model is its own decode.
"""

import re
from functools import lru_cache

from common.tokenizer.tokenizer import Tokenizer

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """Character of the byte-level alphabet -> the byte it stands for (all 256 bytes)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in set(printable)]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + k): b for k, b in enumerate(shifted)})
    return table


class TokenBytes:
    """Token id -> its piece's bytes and text, cached per id (a few thousand distinct ids at most in
    practice: the ids a server has reported log-probs for).

    Invariant: for the ids of a text without added tokens, the concatenated ``piece`` bytes of a
    byte-level tokenizer are exactly the text's UTF-8 bytes, whichever token boundaries split a
    character. ``text(i)`` is ``piece(i)`` decoded with U+FFFD for an incomplete character (vLLM
    does the same). Thread-safe: the cache is a plain dict written with whole values.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._byte_level = tokenizer.byte_level
        self._added = tokenizer.added_token_ids
        self._cache: dict[int, bytes] = {}

    def piece(self, token_id: int) -> bytes | None:
        """The bytes of ``token_id``'s piece, or None when the id is outside the vocabulary."""
        piece = self._cache.get(token_id)
        if piece is None:
            piece = self._piece(token_id)
            if piece is not None:
                self._cache[token_id] = piece
        return piece

    def text(self, token_id: int) -> str | None:
        """The piece as text (U+FFFD where it holds part of a character), None outside the vocabulary."""
        piece = self.piece(token_id)
        return None if piece is None else piece.decode("utf-8", errors="replace")

    def _piece(self, token_id: int) -> bytes | None:
        token = self._tokenizer.id_to_token(token_id)
        if token is None:
            return None
        if token_id in self._added:
            return token.encode("utf-8")
        if self._byte_level:
            table = byte_level_decoder()
            if all(c in table for c in token):
                return bytes(table[c] for c in token)
        fallback = _BYTE_FALLBACK.match(token)
        if fallback is not None:
            return bytes([int(fallback.group(1), 16)])
        return self._tokenizer.decode([token_id]).encode("utf-8")
