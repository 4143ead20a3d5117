"""The tokenizer (router and engine): a Hugging Face `tokenizer.json` plus its config and chat template.

Loads the files a Hugging Face model folder ships:

    tokenizer.json           required; the `tokenizers` model (vocabulary, merges, added tokens)
    tokenizer_config.json    optional; named special tokens and `chat_template`
    generation_config.json   optional; `eos_token_id` (int or list) gives the stop ids

Encoding and chat rendering match transformers' `AutoTokenizer` on the same folder.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable
from typing import Any

import tokenizers
from tokenizers import models

from common.tokenizer.chat_template import ChatTemplate
from common.tokenizer.messages import validate_messages, validate_tools

# Named special tokens that transformers hands to chat templates as variables.
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerNotFoundError(FileNotFoundError):
    """The model folder has no tokenizer.json."""


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: malformed JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _load_backend(path: pathlib.Path) -> tokenizers.Tokenizer:
    if not path.is_file():
        raise TokenizerNotFoundError(f"{path}: not found; the folder has no tokenizer")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a bare Exception for every parse failure
        raise ValueError(f"{path}: malformed tokenizer file: {err}") from err


def _named_tokens(
    config: dict[str, Any], path: pathlib.Path, backend: tokenizers.Tokenizer
) -> dict[str, str]:
    named = {}
    for name in _NAMED_TOKENS:
        value = config.get(name)
        # A token is written either as a string or as a serialized AddedToken dict.
        if isinstance(value, dict) and isinstance(value.get("content"), str):
            value = value["content"]
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValueError(f"{path}: {name}: expected a token string or an AddedToken dict, got {value!r}")
        if backend.token_to_id(value) is None:
            raise ValueError(f"{path}: {name} {value!r} is not in the vocabulary")
        named[name] = value
    return named


def _eos_token_ids(
    generation: dict[str, Any], path: pathlib.Path, backend: tokenizers.Tokenizer
) -> list[int] | None:
    eos = generation.get("eos_token_id")
    if eos is None:
        return None
    ids = eos if isinstance(eos, list) else [eos]
    vocab_size = backend.get_vocab_size(with_added_tokens=True)
    if not all(type(i) is int and 0 <= i < vocab_size for i in ids):
        raise ValueError(f"{path}: eos_token_id: expected ids below {vocab_size}, got {eos!r}")
    return ids


def _chat_template(config: dict[str, Any], path: pathlib.Path) -> ChatTemplate | None:
    source = config.get("chat_template")
    if source is None:
        return None
    if not isinstance(source, str):
        raise ValueError(f"{path}: chat_template: expected a string, got {type(source).__name__}")
    try:
        return ChatTemplate(source)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


class Tokenizer:
    """Text <-> token ids, and chat messages -> prompt, for one model.

    Build with `Tokenizer.from_pretrained(model_dir)`.

    Invariants: every id in `eos_token_ids`, `special_token_ids` and `bos_token_id` is < vocab_size.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        named_tokens: dict[str, str],
        eos_token_ids: list[int],
        chat_template: ChatTemplate | None,
    ) -> None:
        """Wrap a loaded backend; prefer `from_pretrained`.

        Args:
            backend: the `tokenizers` model.
            named_tokens: e.g. {"bos_token": "[BOS]", "eos_token": "[EOS]"}; each must be in the vocabulary.
            eos_token_ids: ids that end generation.
            chat_template: the compiled chat template, or None when the model has none.
        """
        self._backend = backend
        self._named_tokens = dict(named_tokens)
        self._eos_token_ids = list(eos_token_ids)
        self._chat_template = chat_template
        self._max_token_bytes: int | None = 0  # 0: not measured yet
        self._special_token_ids = frozenset(
            token_id for token_id, added in backend.get_added_tokens_decoder().items() if added.special
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | pathlib.Path) -> Tokenizer:
        """Load the tokenizer files of a Hugging Face style model folder.

        Raises:
            TokenizerNotFoundError: `model_dir/tokenizer.json` does not exist.
            ValueError: a file is malformed or names a token the vocabulary lacks; the message names the file.
        """
        model_dir = pathlib.Path(model_dir)
        backend = _load_backend(model_dir / "tokenizer.json")
        config_path = model_dir / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        named_tokens = _named_tokens(config, config_path, backend)
        chat_template = _chat_template(config, config_path)
        generation_path = model_dir / "generation_config.json"
        if generation_path.is_file():
            eos_token_ids = _eos_token_ids(_read_json(generation_path), generation_path, backend)
        else:
            eos_token_ids = None
        if eos_token_ids is None:
            eos = named_tokens.get("eos_token")
            eos_token_ids = [] if eos is None else [backend.token_to_id(eos)]
        return cls(backend, named_tokens, eos_token_ids, chat_template)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added and special tokens included; every id is below it."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        """Id of the beginning-of-sequence token, or None when the model names none."""
        bos = self._named_tokens.get("bos_token")
        return None if bos is None else self._backend.token_to_id(bos)

    @property
    def eos_token_ids(self) -> list[int]:
        """Ids that end generation (generation_config's `eos_token_id`, else the config's eos_token)."""
        return list(self._eos_token_ids)

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of all special tokens (the ones `skip_special_tokens` drops)."""
        return self._special_token_ids

    @property
    def max_token_bytes(self) -> int | None:
        """No token covers more than this many UTF-8 bytes of input text, so a text of ``b`` bytes has
        at least ``ceil(b / max_token_bytes)`` tokens: a cheap bound taken before tokenizing.

        None when no such bound holds: an unknown-token model (one ``[UNK]`` may cover a whole
        word) or a normalizer (it may shrink the text before the model sees it). The vocabulary's
        token strings are measured in UTF-8, which overcounts byte-level tokens (a byte may be
        written with a two-byte character): a looser bound, never a wrong one.
        """
        if self._max_token_bytes == 0:
            model = self._backend.model
            safe = isinstance(model, models.BPE) and not model.unk_token and self._backend.normalizer is None
            vocab = self._backend.get_vocab(with_added_tokens=True)
            self._max_token_bytes = max(len(t.encode("utf-8")) for t in vocab) if safe and vocab else None
        return self._max_token_bytes

    @property
    def byte_level(self) -> bool:
        """Whether token strings are written in the byte-level alphabet (the decoder, or one of a
        sequence of decoders, is ``ByteLevel``): GPT-2 style BPE, where each character of a token
        string stands for one byte (``token_bytes.py`` maps them back)."""
        decoder = self._backend.decoder
        return decoder is not None and '"ByteLevel"' in decoder.__getstate__().decode("utf-8")

    @property
    def added_token_ids(self) -> frozenset[int]:
        """Ids of the added tokens (special or not): their strings are plain text, not byte-level."""
        return frozenset(self._backend.get_added_tokens_decoder())

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of `token_id` (byte-level form), or None when out of range."""
        return self._backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        """The id of `token` (byte-level form), or None when it is not in the vocabulary."""
        return self._backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`.

        Control tokens written in `text` (e.g. "<|im_end|>") become their single ids, as in
        transformers. `add_special_tokens` applies the tokenizer.json post-processor (for the tiny
        tokenizers: prepend BOS).
        """
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; bytes that do not form valid UTF-8 become U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """Render a conversation to prompt text with the model's chat template.

        Args:
            messages: dicts with `role` (system/user/assistant/tool) and string `content`; an assistant
                message may carry `tool_calls` instead of content, a tool message a `tool_call_id`.
            tools: JSON schemas of callable tools, or None.
            add_generation_prompt: end with the header that opens the assistant's turn.

        Raises:
            ValueError: invalid message (naming index and field, e.g. "messages[2].role: ..."),
                the model has no chat template, or the template itself raised.
        """
        checked = validate_messages(messages)
        tools = validate_tools(tools)
        if self._chat_template is None:
            raise ValueError(
                "chat_template: this tokenizer has none (tokenizer_config.json lacks 'chat_template')"
            )
        return self._chat_template.render(
            checked, tools=tools, add_generation_prompt=add_generation_prompt, **self._named_tokens
        )

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Token ids of `apply_chat_template(...)`; control tokens in the rendered text become single ids.

        No BOS is added beyond what the template writes (transformers does the same).
        """
        return self.encode(self.apply_chat_template(messages, tools, add_generation_prompt))
