"""Streaming detokenization: token ids in, newly completed text out.

Byte-level tokens can end in the middle of a UTF-8 character (an emoji is 4 bytes and may span up
to 4 tokens), and decoding such a prefix yields U+FFFD. The detokenizer therefore decodes a short
window of recent ids and only emits once the window no longer ends in an incomplete character
(the prefix-offset / read-offset technique of vLLM and TGI):

    window:  [ prefix tokens | unread tokens ]
              ^0             ^read          ^len(window)
    emitted = decode(window)[len(decode(window[:read])):]

The prefix tokens are the ones emitted last; decoding them again gives decoders that depend on the
left context (e.g. leading-space handling) the same input as a full decode. After an emission the
window drops everything before `read`, so each push costs O(window), not O(sequence). The window
is a few tokens for real text; it only grows while every new token leaves the text ending in U+FFFD,
i.e. while a model emits a run of broken byte sequences.
"""

from __future__ import annotations

from common.tokenizer.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text pieces.

    Invariant: the concatenation of every `push` result and a final `flush()` equals
    `tokenizer.decode(all_pushed_ids, skip_special_tokens=skip_special_tokens)`, and no `push`
    result ends in U+FFFD (characters split across tokens are held back until complete).

    Args:
        tokenizer: the model's tokenizer.
        skip_special_tokens: drop special tokens from the text, as `Tokenizer.decode` does.
        keep_token_ids: special tokens written out all the same (a tool-call parser's markers); the
            invariant then holds for `decode` of the ids without the other special tokens.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        skip_special_tokens: bool = False,
        keep_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        self._tokenizer = tokenizer
        self._skipped_ids = (
            tokenizer.special_token_ids - keep_token_ids if skip_special_tokens else frozenset()
        )
        # Skipped ids never enter the window, so kept ones are decoded by not skipping any there.
        self._skip_special_tokens = skip_special_tokens and not keep_token_ids
        self._window: list[int] = []
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes ("" while a character is incomplete)."""
        if token_id in self._skipped_ids:
            return ""
        self._window.append(token_id)
        prefix_text = self._decode(self._window[: self._read])
        text = self._decode(self._window)
        if len(text) <= len(prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        self._window = self._window[self._read :]
        self._read = len(self._window)
        return text[len(prefix_text) :]

    def flush(self) -> str:
        """End the stream: return the held-back text and reset for a new stream.

        The result may contain U+FFFD when the stream stopped inside a character, exactly as a
        full decode of the same ids would.
        """
        text = self._decode(self._window)[len(self._decode(self._window[: self._read])) :]
        self._window = []
        self._read = 0
        return text
