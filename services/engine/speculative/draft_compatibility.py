"""Whether a checkpoint can draft for another: same family, same vocabulary, same tokenizer.

A draft's token ids must mean the target's tokens: its distributions are compared row for row with
the target's (rejection sampling) and its tokens are fed to the target as they are.
"""

from pathlib import Path

from tokenizers import Tokenizer as BackendTokenizer

from common.model_info import read_model_info

TOKENIZER_FILE = "tokenizer.json"


def check_draft_compatible(target_dir: str | Path, draft_dir: str | Path) -> None:
    """Raise unless ``draft_dir`` can draft for ``target_dir`` (checked at start, before loading).

    Rules: the same model family (``common/model_info.py``), the same vocabulary size and, when both
    folders have a ``tokenizer.json``, the same tokenizer: equal file bytes, or else equal
    vocabularies (every token string mapped to the same id, added tokens included).

    Raises:
        ValueError: naming ``--draft-model`` and what differs.
        FileNotFoundError, ConfigError: a folder without a readable ``config.json``.
    """
    if not (Path(draft_dir) / "config.json").is_file():
        raise ValueError(f"--draft-model: {draft_dir} is not a checkpoint folder (no config.json)")
    target, draft = read_model_info(target_dir), read_model_info(draft_dir)
    if draft.family != target.family:
        raise ValueError(
            f"--draft-model: {draft_dir} is a {draft.family} checkpoint, the target {target_dir} is "
            f"{target.family}; the draft must be of the target's family"
        )
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"--draft-model: {draft_dir} has vocab_size {draft.vocab_size}, the target {target_dir} has "
            f"{target.vocab_size}; the draft must share the target's vocabulary"
        )
    target_file, draft_file = Path(target_dir) / TOKENIZER_FILE, Path(draft_dir) / TOKENIZER_FILE
    if not (target_file.is_file() and draft_file.is_file()):
        return
    if target_file.read_bytes() == draft_file.read_bytes():
        return
    target_vocab = BackendTokenizer.from_file(str(target_file)).get_vocab(with_added_tokens=True)
    draft_vocab = BackendTokenizer.from_file(str(draft_file)).get_vocab(with_added_tokens=True)
    if target_vocab != draft_vocab:
        differing = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()), key=lambda pair: pair[1])
        token, token_id = differing[0]
        raise ValueError(
            f"--draft-model: {draft_file} and the target's {target_file} map tokens differently "
            f"({len(differing)} token/id pairs not in both, e.g. {token!r} -> {token_id}); the draft "
            "must use the target's tokenizer"
        )
