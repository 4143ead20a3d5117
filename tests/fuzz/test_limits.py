"""The limits without a cluster: the byte bound on a prompt's tokens holds for any text, and each
check names its field."""

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from common.limits import MAX_PROMPT_BYTES, FieldError, check_prompt_bytes, check_text, utf8_bytes
from common.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return Tokenizer.from_pretrained(tiny_checkpoint("kimi_linear"))


def test_the_byte_bound_is_the_longest_token_and_none_where_it_cannot_hold(tokenizer):
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    assert tokenizer.max_token_bytes == max(len(t.encode()) for t in tokens)
    normalized = tokenizers.Tokenizer(tokenizers.models.BPE())
    normalized.normalizer = tokenizers.normalizers.NFKC()  # may shrink text before the model
    assert Tokenizer(normalized, {}, [], None).max_token_bytes is None
    unknown = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    assert Tokenizer(unknown, {}, [], None).max_token_bytes is None  # one [UNK] covers a whole word


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    text=st.text(alphabet=st.characters(codec="utf-8"), max_size=400)
    | st.sampled_from(["<|im_end|>" * 9, " " * 300, "\n\n\t" * 50, "the the the " * 20, "😀" * 40])
)
def test_no_text_has_fewer_tokens_than_its_bytes_over_the_bound(tokenizer, text):
    size = len(text.encode())
    assert len(tokenizer.encode(text)) * tokenizer.max_token_bytes >= size


def test_a_lone_surrogate_is_named_with_its_position():
    with pytest.raises(
        FieldError, match=r"^stop\[2\]: holds a lone UTF-16 surrogate U\+DC80 at character 3;"
    ):
        utf8_bytes("abc\udc80", "stop[2]")
    assert utf8_bytes("é😀", "prompt") == 6


def test_text_limits_count_characters():
    check_text("é" * 4, "tenant", 4)
    with pytest.raises(FieldError, match=r"^tenant: 5 characters, more than the limit of 4$") as refused:
        check_text("é" * 5, "tenant", 4)
    assert refused.value.field == "tenant" and isinstance(refused.value, ValueError)


def test_prompt_bytes_against_the_bound_and_the_cap():
    check_prompt_bytes(28 * 99, "text", max_token_bytes=28, max_model_len=100)  # >= 99 tokens: fits
    with pytest.raises(FieldError, match=r"^text: 2801 bytes make at least 101 tokens"):
        check_prompt_bytes(28 * 100 + 1, "text", max_token_bytes=28, max_model_len=100)
    check_prompt_bytes(MAX_PROMPT_BYTES, "chat", max_token_bytes=None, max_model_len=1)  # no bound
    with pytest.raises(FieldError, match=r"^chat: \d+ bytes, more than the limit"):
        check_prompt_bytes(MAX_PROMPT_BYTES + 1, "chat", max_token_bytes=None, max_model_len=1)
