"""Writes deterministic Hugging Face tokenizer folders: tiny ones for tests and toy checkpoints
(`write_tiny_tokenizer`), and ones trained on a given corpus (`write_tokenizer`, the demo model's).

The result loads both with `Tokenizer.from_pretrained` and with transformers'
`AutoTokenizer.from_pretrained`:

    out_dir/
      tokenizer.json           byte-level BPE trained on the corpus, the family's specials appended
      tokenizer_config.json    named special tokens, added_tokens_decoder, chat_template
      generation_config.json   bos_token_id, eos_token_id (list of stop ids), pad_token_id

Ids: 0..255 are the byte alphabet, then the learned merges, then the family's special tokens in
`FamilySpec.special_tokens` order (as in Kimi's vocabularies, control tokens sit at the top).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from common.tokenizer.corpus import TRAINING_CORPUS
from common.tokenizer.family import FamilySpec, get_family

# Floor on learned merges, so that the commonest words (" the", " and") are single tokens.
MIN_MERGES = 64
_BYTE_ALPHABET_SIZE = 256


def _train(spec: FamilySpec, vocab_size: int, corpus: Iterable[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(spec.special_tokens),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.special_tokens])
    bos_id = tokenizer.token_to_id(spec.bos_token)
    # encode(..., add_special_tokens=True) prepends BOS; chat templates write their own BOS instead.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{spec.bos_token} $A",
        pair=f"{spec.bos_token} $A $B",
        special_tokens=[(spec.bos_token, bos_id)],
    )
    return tokenizer


def _tokenizer_config(spec: FamilySpec, tokenizer: Tokenizer) -> dict:
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in spec.special_tokens
    }
    named = {spec.bos_token, spec.eos_token, spec.pad_token}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": spec.bos_token,
        "eos_token": spec.eos_token,
        "pad_token": spec.pad_token,
        "additional_special_tokens": [t for t in spec.special_tokens if t not in named],
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
        "chat_template": spec.chat_template,
    }


def _generation_config(spec: FamilySpec, tokenizer: Tokenizer) -> dict:
    return {
        "bos_token_id": tokenizer.token_to_id(spec.bos_token),
        "eos_token_id": [tokenizer.token_to_id(token) for token in spec.stop_tokens],
        "pad_token_id": tokenizer.token_to_id(spec.pad_token),
    }


def _write_json(path: pathlib.Path, data: dict) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def write_tokenizer(out_dir: pathlib.Path, family: str, vocab_size: int, corpus: Iterable[str]) -> None:
    """Train a byte-level BPE tokenizer for `family` on `corpus` and write it to `out_dir`.

    The output depends only on (family, vocab_size, the corpus's documents in order): training is
    deterministic, so the same inputs give byte-identical files.

    Args:
        out_dir: folder to write into; created if missing; existing tokenizer files are replaced.
        family: "k3", "kimi_linear" or "deepseek_v32".
        vocab_size: upper bound on the total vocabulary, special tokens included (every id is
            < vocab_size). A corpus that supports fewer merges gives a smaller vocabulary.
        corpus: the training documents; iterated once.

    Raises:
        ValueError: unknown family, or vocab_size too small for the 256 byte tokens, the family's
            special tokens and MIN_MERGES merges.
    """
    spec = get_family(family)
    minimum = _BYTE_ALPHABET_SIZE + len(spec.special_tokens) + MIN_MERGES
    if vocab_size < minimum:
        raise ValueError(
            f"vocab_size: {vocab_size} is too small for family {family!r}; need at least {minimum} "
            f"({_BYTE_ALPHABET_SIZE} byte tokens + {len(spec.special_tokens)} special tokens "
            f"+ {MIN_MERGES} merges)"
        )
    tokenizer = _train(spec, vocab_size, corpus)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(spec, tokenizer))
    _write_json(out_dir / "generation_config.json", _generation_config(spec, tokenizer))


def write_tiny_tokenizer(out_dir: pathlib.Path, family: str, vocab_size: int) -> None:
    """Train a tiny tokenizer for `family` on the embedded `corpus.TRAINING_CORPUS` and write it.

    `write_tokenizer` on that corpus: the output depends only on (family, vocab_size); same
    arguments and errors.
    """
    write_tokenizer(out_dir, family, vocab_size, TRAINING_CORPUS)
