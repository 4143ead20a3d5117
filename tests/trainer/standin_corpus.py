"""A stand-in corpus for the training tests (the ``--corpus`` interface): the tiny tokenizers' embedded
text, every fifth document held out."""

from collections.abc import Iterator

from common.tokenizer.corpus import TRAINING_CORPUS


def train_documents() -> Iterator[str]:
    """Four documents in five, in a fixed order."""
    return (text for index, text in enumerate(TRAINING_CORPUS) if index % 5 != 4)


def heldout_documents() -> Iterator[str]:
    """Every fifth document."""
    return (text for index, text in enumerate(TRAINING_CORPUS) if index % 5 == 4)
