"""``TokenBytes``: each token's piece as bytes through the byte-level alphabet, for every family's tiny
tokenizer; characters split over tokens; added tokens as text; SentencePiece byte fallback."""

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models

from common.tokenizer import Tokenizer
from common.tokenizer.token_bytes import TokenBytes, byte_level_decoder

TEXTS = ["Hello world", "naïve café", "emoji 😀 and 漢字", "  spaces\n\ttabs"]


def test_the_byte_level_alphabet_covers_every_byte_once():
    table = byte_level_decoder()
    assert sorted(table.values()) == list(range(256))
    assert table["A"] == ord("A") and table["\u0120"] == ord(" ")  # GPT-2's "Ġ" is the space


@pytest.mark.parametrize("text", TEXTS, ids=["ascii", "accents", "emoji", "whitespace"])
def test_pieces_concatenate_to_the_texts_utf8_bytes(tokenizer, text):
    pieces = TokenBytes(tokenizer)
    assert tokenizer.byte_level
    ids = tokenizer.encode(text)
    assert b"".join(pieces.piece(t) for t in ids) == text.encode("utf-8")
    for t in ids:  # the text is the piece decoded, U+FFFD for a partial character
        assert pieces.text(t) == pieces.piece(t).decode("utf-8", errors="replace")
        if "\ufffd" not in pieces.text(t):
            assert pieces.text(t) == tokenizer.decode([t])


def test_a_character_split_over_tokens_keeps_its_raw_bytes(tokenizer):
    pieces = TokenBytes(tokenizer)
    ids = tokenizer.encode("😀")
    partial = [t for t in ids if "\ufffd" in pieces.text(t)]
    assert partial, "the tiny vocabulary should split the emoji"
    assert b"".join(pieces.piece(t) for t in ids) == "😀".encode()


def test_added_tokens_are_their_text_and_unknown_ids_have_none(tokenizer):
    pieces = TokenBytes(tokenizer)
    for token_id in tokenizer.added_token_ids:
        assert pieces.piece(token_id) == tokenizer.id_to_token(token_id).encode()
    assert pieces.piece(tokenizer.vocab_size + 5) is None and pieces.text(tokenizer.vocab_size + 5) is None


def test_a_sentencepiece_byte_fallback_token_is_its_byte():
    vocab = {"<unk>": 0, "<0xE2>": 1, "▁hi": 2}
    backend = Backend(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    pieces = TokenBytes(Tokenizer(backend, {}, [], None))
    assert pieces.piece(1) == b"\xe2" and pieces.text(1) == "\ufffd"
    assert pieces.piece(2) == b" hi"
