"""Argument parsing helpers shared by subcommands."""

import argparse

import torch

from services.engine.model.backends import KERNEL_BACKENDS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_engine_kernel_flags(parser: argparse.ArgumentParser) -> None:
    """``--kernels`` and ``--cuda-graphs / --no-cuda-graphs`` (``EngineConfig.kernels``, ``cuda_graphs``)."""
    parser.add_argument(
        "--kernels",
        default=None,
        choices=KERNEL_BACKENDS,
        help="op backends: reference (float32 PyTorch oracle) or triton (default: triton on CUDA, reference "
        "on the CPU; triton on the CPU needs TRITON_INTERPRET=1)",
    )
    parser.add_argument(
        "--cuda-graphs",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="replay CUDA graphs for decode steps (default on; a no-op on the CPU)",
    )


def engine_kernel_args(args: argparse.Namespace) -> list[str]:
    """The kernel flags again, as command-line words for worker processes."""
    words = [] if args.kernels is None else ["--kernels", args.kernels]
    return words + ([] if args.cuda_graphs else ["--no-cuda-graphs"])


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


def check_vocabulary(ids: list[int], vocab_size: int, flag: str) -> None:
    """Raise ValueError naming ``flag`` and the first id outside ``[0, vocab_size)``."""
    for position, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise ValueError(
                f"{flag}: id {token} at position {position} is outside the vocabulary [0, {vocab_size})"
            )
