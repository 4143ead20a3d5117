"""``baton train``: pretrain a model from a size preset on a corpus, or distill a draft from a trained
target, in resumable segments (``trainer/pretrain.py``, ``docs/training.md``)."""

import argparse

from trainer.pretrain import run_from_args
from trainer.pretrain_settings import add_pretrain_flags


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "train",
        help="pretrain a preset model (or distill a draft: --distill-from); rerun to continue a stopped run",
    )
    add_pretrain_flags(parser)
    parser.set_defaults(run=run_from_args)
