"""Builds the demo model's tokenizer from the corpus's training split.

    python -m tools.demo_model.build_tokenizer OUT_DIR [--vocab-size 12288] [--max-documents N]

Byte-level BPE for the k3 family (Kimi's control tokens and chat template, `common/tokenizer/family.py`),
trained by `common.tokenizer.write_tokenizer` on `corpus.train_documents()` in their fixed order: the
same arguments write byte-identical files. Held-out documents are never read.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys

from common.tokenizer import write_tokenizer
from tools.demo_model import corpus

# 12,288 = 3 x 4096: a multiple of 128, so the embedding and LM-head rows tile evenly on the GPU and
# split evenly over TP degrees up to 8 (and 3); below the ~17,000 distinct word forms of the
# translations, so common words are one token and rare names split, while the embedding stays small
# for a tiny model.
DEMO_VOCAB_SIZE = 12_288
DEMO_FAMILY = "k3"


def build_demo_tokenizer(
    out_dir: pathlib.Path, vocab_size: int = DEMO_VOCAB_SIZE, max_documents: int | None = None
) -> None:
    """Write the demo tokenizer (tokenizer.json, tokenizer_config.json, generation_config.json).

    Args:
        out_dir: folder to write into; created if missing.
        vocab_size: total vocabulary, the family's special tokens included.
        max_documents: train on the first this many training documents only (quick builds and
            tests); None reads them all.

    Raises:
        ValueError: max_documents below 1, or vocab_size too small (see `write_tokenizer`).
        corpus.CorpusNotInstalledError: a corpus package is missing or not at its pinned version.
    """
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents: {max_documents} must be at least 1 (or None for all)")
    documents = itertools.islice(corpus.train_documents(), max_documents)
    write_tokenizer(pathlib.Path(out_dir), DEMO_FAMILY, vocab_size, documents)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo_model.build_tokenizer", description=__doc__)
    parser.add_argument("out_dir", type=pathlib.Path, help="folder for the tokenizer files")
    parser.add_argument("--vocab-size", type=int, default=DEMO_VOCAB_SIZE, help="total vocabulary size")
    parser.add_argument(
        "--max-documents", type=int, default=None, help="train on the first N training documents only"
    )
    args = parser.parse_args(argv)
    try:
        build_demo_tokenizer(args.out_dir, args.vocab_size, args.max_documents)
    except (ValueError, corpus.CorpusNotInstalledError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir}/tokenizer.json, tokenizer_config.json, generation_config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
