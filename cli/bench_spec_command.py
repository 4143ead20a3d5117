"""``baton bench spec``: decode tokens/s and TPOT with and without speculative decoding (each ``k``
fixed, and the default adaptive policy), side by side at several batch sizes
(``services/engine/benchmark/spec_bench.py``)."""

import argparse
import json
import tempfile
from pathlib import Path

import torch

from common.tokenizer import Tokenizer
from services.engine.benchmark.spec_bench import (
    SpecBenchRow,
    format_row,
    run_spec_bench,
    spec_arms,
    table_header,
)
from services.engine.checkpoint.init_folder import init_checkpoint
from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.engine_config import KDA_ROLLBACKS, MAX_DRAFT_TOKENS

from .arguments import DTYPES, positive_int_list
from .eval_command import documents, text_windows

RANDOM_NOTE = (
    "random weights: acceptance is meaningless here (a random draft rarely agrees with a random target); "
    "the self-draft rows show the ceiling of drafting k tokens at each batch"
)


def register_spec(kinds: argparse._SubParsersAction) -> None:
    """Add ``spec`` to the ``bench`` subcommands."""
    bench = kinds.add_parser(
        "spec", help="decode tokens/s and TPOT with vs without speculative decoding at batch 1/8/32"
    )
    bench.add_argument("--model", type=Path, help="target checkpoint (default: a random tiny k3 one)")
    bench.add_argument(
        "--draft-model",
        type=Path,
        help="draft checkpoint (default: with --model none; without, a random 2-layer tiny k3 one)",
    )
    bench.add_argument(
        "--num-draft-tokens", default="3", help="comma-separated draft lengths k, 1-16 (default 3)"
    )
    bench.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes (default 1,8,32)")
    bench.add_argument("--decode-tokens", type=int, default=64, help="tokens per request (default 64)")
    bench.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (default 128)")
    bench.add_argument(
        "--text",
        type=Path,
        help="prompts cut from this UTF-8 file (default: the held-out corpus for --model, random ids "
        "for the random checkpoint)",
    )
    bench.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); else seeded")
    bench.add_argument("--repeats", type=int, default=2, help="timed runs per row, best kept (default 2)")
    bench.add_argument(
        "--self-draft",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="also run the target as its own draft (total acceptance: the ceiling; default on)",
    )
    bench.add_argument(
        "--adaptive",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="also run each draft under the default adaptive policy at the largest --num-draft-tokens "
        "(what the default engine does; default on)",
    )
    bench.add_argument(
        "--kda-rollback",
        default="auto",
        help="comma-separated KDA rollbacks to run each fixed-k arm under: states, replay, auto (default "
        "auto: the engine's); 'states,replay' measures both side by side",
    )
    bench.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    bench.add_argument("--dtype", choices=sorted(DTYPES), help="model dtype (default: the checkpoint's)")
    bench.add_argument("--kernels", help="kernel backend (default: the engine's for the device)")
    bench.add_argument("--json", type=Path, help="also write the rows as JSON here")
    bench.set_defaults(run=run_spec)


def run_spec(args: argparse.Namespace) -> int:
    batches = positive_int_list(args.batches, "--batches")
    drafts = positive_int_list(args.num_draft_tokens, "--num-draft-tokens", MAX_DRAFT_TOKENS)
    for flag, value, minimum in (
        ("--decode-tokens", args.decode_tokens, 1),
        ("--prompt-len", args.prompt_len, 2),
    ):
        if value < minimum:
            raise ValueError(f"{flag}: {value} must be at least {minimum}")
    if args.temperature < 0:
        raise ValueError(f"--temperature: {args.temperature} must be >= 0")
    options = {key: value for key, value in (("dtype", args.dtype), ("kernels", args.kernels)) if value}
    rollbacks = tuple(dict.fromkeys(r.strip() for r in args.kda_rollback.split(",")))
    unknown = [r for r in rollbacks if r not in KDA_ROLLBACKS]
    if unknown:
        raise ValueError(
            f"--kda-rollback: {', '.join(unknown)} unknown; give some of {', '.join(KDA_ROLLBACKS)}"
        )
    with tempfile.TemporaryDirectory() as scratch:
        target, draft, note = _checkpoints(args, Path(scratch))
        prompts = _prompts(args, target, max(batches))
        arms = spec_arms(
            str(target), str(draft) if draft else "", drafts, args.self_draft, args.adaptive, rollbacks
        )
        print(table_header(note), flush=True)
        rows: list[SpecBenchRow] = []

        def report(row: SpecBenchRow) -> None:  # each row as it is measured; the JSON rewritten with it
            rows.append(row)
            print(format_row(row), flush=True)
            if args.json:
                table = {"note": note, "rows": [r.as_dict() for r in rows]}
                args.json.write_text(json.dumps(table, indent=2))

        run_spec_bench(
            str(target),
            arms,
            prompts,
            batches,
            args.decode_tokens,
            args.temperature,
            args.device,
            args.repeats,
            on_row=report,
            **options,
        )
    return 0


def _checkpoints(args: argparse.Namespace, scratch: Path) -> tuple[Path, Path | None, str]:
    """The target, the draft (None: self-draft only) and the table's note."""
    if args.model is not None:
        note = f"target {args.model}, draft {args.draft_model or 'none (self-draft only)'}"
        return args.model, args.draft_model, note
    if args.draft_model is not None:
        raise ValueError("--draft-model: needs --model (a draft shares its target's tokenizer)")
    target, draft = scratch / "target", scratch / "draft"
    init_checkpoint(target, "k3", "tiny", seed=0)
    init_checkpoint(draft, "k3", "tiny", seed=1, overrides=with_layers(preset_config("k3", "tiny"), 2))
    return target, draft, RANDOM_NOTE


def _prompts(args: argparse.Namespace, target: Path, count: int) -> list[list[int]]:
    if args.model is None and args.text is None:
        vocab = json.loads((target / "config.json").read_text())["vocab_size"]
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, vocab, (count, args.prompt_len), generator=generator).tolist()
    encode = Tokenizer.from_pretrained(target).encode
    windows = text_windows(documents(args.text), encode, args.prompt_len, count)
    if len(windows) < count:
        raise ValueError(
            f"--batches: the text holds {len(windows)} prompts of {args.prompt_len} tokens, the largest "
            f"batch needs {count}; give a shorter --prompt-len or a longer --text"
        )
    return windows
