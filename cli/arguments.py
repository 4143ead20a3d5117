"""Argument parsing helpers shared by subcommands."""

import torch

# The compute dtypes by the names the flags take (``services.config_flags.DTYPE_NAMES``).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_token_ids(text: str, flag: str) -> list[int]:
    """``"5,17,42"`` -> ``[5, 17, 42]``; a clear ValueError naming ``flag`` otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"{flag}: expected comma-separated token ids like 5,17,42, got {text!r}")
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    return ids


def positive_int_list(text: str, flag: str, maximum: int | None = None) -> list[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]``: comma-separated integers, each at least 1 (and at most ``maximum``
    when given); a ValueError naming ``flag`` otherwise."""
    bound = "positive integers" if maximum is None else f"integers in [1, {maximum}]"
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated {bound}, got {text!r}") from None
    if not values or min(values) < 1 or (maximum is not None and max(values) > maximum):
        raise ValueError(f"{flag}: expected comma-separated {bound}, got {text!r}")
    return values


def check_vocabulary(ids: list[int], vocab_size: int, flag: str) -> None:
    """Raise ValueError naming ``flag`` and the first id outside ``[0, vocab_size)``."""
    for position, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise ValueError(
                f"{flag}: id {token} at position {position} is outside the vocabulary [0, {vocab_size})"
            )
