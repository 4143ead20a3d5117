"""``baton capacity``: the memory ledgers of a checkpoint and how many contexts fit in a budget.

Reads only ``config.json`` (never the weights). When the weights and workspace alone exceed
``--memory-gib`` the answer is still an answer: the command prints that nothing fits (``"nothing_fits":
true`` with ``--json``) and exits 0, so scripts sweeping budgets need not special-case it. Bad input
exits 2 with ``baton capacity: error: ...``.
"""

import argparse
import json
import math
from pathlib import Path

from services.config_flags import add_config_flags
from services.engine.capacity import (
    CapacityLedger,
    ContextFit,
    capacity_ledger,
    fit,
    fit_dict,
    format_bytes,
    ledger_dict,
)
from services.engine.engine_config import MAX_DRAFT_TOKENS, EngineConfig
from services.engine.model.backends import default_kernels
from services.engine.model.config import ModelConfig
from services.engine.model.config_loader import load_model_config
from services.engine.parallel.layout import ParallelLayout

from .arguments import DTYPES

DEFAULT_CONTEXT_LENS = (4096, 32768, 131072)
GIB = 1 << 30
# The EngineConfig fields the ledgers depend on.
CAPACITY_FIELDS = (
    "dtype",
    "block_size",
    "kv_format",
    "batch_invariant",
    "max_num_batched_tokens",
    "max_num_seqs",
    "device",
    "kernels",
    "tp",
    "dcp",
    "ep",
    "draft_model",
    "num_draft_tokens",
)


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "capacity", help="weights, KV and KDA-state ledgers, and how many contexts fit in a memory budget"
    )
    parser.add_argument(
        "--model", required=True, type=Path, help="checkpoint folder (only config.json is read)"
    )
    parser.add_argument("--memory-gib", required=True, type=float, help="device memory budget in GiB")
    parser.add_argument(
        "--context-len",
        action="append",
        metavar="L",
        help="context length in tokens; repeat or give a comma list (default 4096,32768,131072)",
    )
    # The engine's own flags, with defaults for a large GPU deployment (the question this answers).
    add_config_flags(
        parser.add_argument_group("engine"),
        EngineConfig,
        only=CAPACITY_FIELDS,
        defaults={"device": "cuda", "max_num_batched_tokens": 8192, "max_num_seqs": 256},
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (bytes as integers)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not math.isfinite(args.memory_gib) or args.memory_gib <= 0:
        raise ValueError(f"--memory-gib: must be a positive number, got {args.memory_gib:g}")
    for flag in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
    args.kernels = args.kernels or default_kernels(args.device, args.batch_invariant)
    context_lens = parse_context_lens(args.context_len)
    config = load_model_config(args.model)  # the only file read
    ParallelLayout(tp=args.tp, dcp=args.dcp, ep=args.ep).validate(config, args.batch_invariant)  # names --tp
    dtype = DTYPES[args.dtype or config.torch_dtype]
    ledger = _ledger(args, config, dtype, tp=args.tp, dcp=args.dcp, ep=args.ep)
    draft = _draft_ledger(args, config, dtype)
    memory = round(args.memory_gib * GIB)
    rollback = "replay" if args.batch_invariant else "states"  # the engine's --kda-rollback auto
    fits = [fit(ledger, memory, length, draft, args.num_draft_tokens, rollback) for length in context_lens]
    if args.json:
        print(json.dumps(_json_report(args, ledger, memory, fits, draft), indent=2))
    else:
        print("\n".join(_human_report(args, config.layer_types, ledger, memory, fits, draft)))
    return 0


def _draft_ledger(args: argparse.Namespace, target: ModelConfig, dtype) -> CapacityLedger | None:
    """The draft model's ledger under the target's cache settings (``--draft-model``), or None.

    Raises:
        ValueError: a draft without ``--num-draft-tokens`` in 1..16 (or drafts without a draft), a
            parallel layout, or a draft of another family or vocabulary, naming the flag.
    """
    if not args.draft_model and not args.num_draft_tokens:
        return None
    if not args.draft_model or not 1 <= args.num_draft_tokens <= MAX_DRAFT_TOKENS:
        raise ValueError(
            f"--draft-model, --num-draft-tokens: give both (k in 1..{MAX_DRAFT_TOKENS}), got "
            f"{args.draft_model or 'no draft'} with {args.num_draft_tokens} drafts"
        )
    if args.tp * args.dcp * args.ep > 1:
        raise ValueError("--draft-model: speculative decoding runs on one rank for now; drop --tp/--dcp/--ep")
    draft = load_model_config(Path(args.draft_model))
    if draft.family != target.family or draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"--draft-model: a {draft.family} draft with vocab_size {draft.vocab_size} cannot draft for a "
            f"{target.family} target with vocab_size {target.vocab_size}"
        )
    return _ledger(args, draft, dtype)


def _ledger(args: argparse.Namespace, config: ModelConfig, dtype, **parallel: int) -> CapacityLedger:
    """``config``'s ledger under the command's cache settings (and parallel degrees)."""
    return capacity_ledger(
        config,
        dtype,
        args.block_size,
        args.kv_format,
        args.batch_invariant,
        args.max_num_batched_tokens,
        args.max_num_seqs,
        **parallel,
    )


def parse_context_lens(values: list[str] | None) -> list[int]:
    """``["4096,32768", "128"]`` -> ``[4096, 32768, 128]``; the defaults when None.

    Raises:
        ValueError: an empty entry, a non-integer or a length below 1, naming ``--context-len``.
    """
    if not values:
        return list(DEFAULT_CONTEXT_LENS)
    lengths = []
    for text in values:
        for part in text.split(","):
            try:
                length = int(part.strip())
            except ValueError:
                raise ValueError(f"--context-len: expected integers like 4096,32768, got {text!r}") from None
            if length < 1:
                raise ValueError(f"--context-len: must be >= 1 token, got {length}")
            lengths.append(length)
    return lengths


def _nothing_fits(ledger: CapacityLedger, memory: int, draft: CapacityLedger | None = None) -> str | None:
    """The line saying nothing fits, or None when at least the weights and workspace (the draft's
    too) do."""
    weights, workspace = ledger.weight_bytes, ledger.workspace_bytes
    if draft is not None:
        weights, workspace = weights + draft.weight_bytes, workspace + draft.workspace_bytes
    if weights + workspace < memory:
        return None
    budget = f"exceed --memory-gib ({format_bytes(memory)})"
    if weights >= memory:
        return f"nothing fits: the weights alone ({format_bytes(weights)}) {budget}"
    return f"nothing fits: weights ({format_bytes(weights)}) + workspace ({format_bytes(workspace)}) {budget}"


def _json_report(
    args, ledger: CapacityLedger, memory: int, fits: list[ContextFit], draft: CapacityLedger | None
) -> dict:
    message = _nothing_fits(ledger, memory, draft)
    return {
        "model": str(args.model),
        "memory_bytes": memory,
        "kernels": args.kernels,
        "ledger": ledger_dict(ledger),
        "draft": None
        if draft is None
        else {
            "model": args.draft_model,
            "num_draft_tokens": args.num_draft_tokens,
            "ledger": ledger_dict(draft),
        },
        "fits": [fit_dict(result) for result in fits],
        "nothing_fits": message is not None,
        "message": message,
    }


def _human_report(
    args,
    layer_types,
    ledger: CapacityLedger,
    memory: int,
    fits: list[ContextFit],
    draft: CapacityLedger | None = None,
) -> list[str]:
    b = format_bytes
    lines = [
        f"{ledger.family} at {args.model}: {len(layer_types)} layers ({ledger.kda_layers} KDA,"
        f" {ledger.mla_layers} MLA), {ledger.dtype}, block {ledger.block_size} tokens,"
        f" KV format {ledger.kv_format}{', batch-invariant' if ledger.batch_invariant else ''},"
        f" kernels {args.kernels},"
        f" --memory-gib {args.memory_gib:g} ({b(memory)})",
    ]
    if ledger.tp * ledger.dcp * ledger.ep > 1:
        lines.append(
            f"--tp {ledger.tp} --dcp {ledger.dcp} --ep {ledger.ep}: {ledger.tp * ledger.dcp} ranks; weights,"
            " KV and KDA figures are one rank's (TP and EP split the weights, TP the KDA heads, DCP a"
            " context's tokens; the MLA latent is whole on every TP rank), the budget one device's"
        )
    lines += ["", "Persistent state"]
    kv_parts = " + ".join(f"{kind} {b(size)}" for kind, size in ledger.kv_by_kind) or "no MLA layers"
    kda_parts = " + ".join(f"{kind} {b(size)}" for kind, size in ledger.kda_by_kind) or "no KDA layers"
    lines += _table(
        [
            (
                "weights",
                b(ledger.weight_bytes),
                f"{ledger.num_parameters:,} parameters, float32 part {b(ledger.float32_weight_bytes)}",
            ),
            ("KV per token", b(ledger.kv_bytes_per_token), f"{ledger.mla_layers} MLA layer(s): {kv_parts}"),
            ("KV per block", b(ledger.kv_block_bytes), f"{ledger.block_size} tokens, 64-byte aligned fields"),
            (
                "KDA state per request" + (f" (1/{ledger.tp} of the heads)" if ledger.tp > 1 else ""),
                b(ledger.kda_slot_bytes),
                f"{ledger.kda_layers} KDA layer(s): {kda_parts}",
            ),
        ],
        align="<><",
    )
    lines += [
        "",
        f"Workspace per step (ESTIMATE: {ledger.max_num_batched_tokens} tokens, up to"
        f" {ledger.max_num_seqs} sequences; attention tiles and allocator slack not counted)",
    ]
    lines += _table(
        [(term, b(size)) for term, size in ledger.workspace] + [("total", b(ledger.workspace_bytes))]
    )
    if draft is not None:
        lines += _speculative_lines(args, ledger, draft, fits)
    with_draft = " + the draft's blocks and slot" if draft is not None else ""
    lines += ["", f"Transfer per request (prefill -> decode: packed blocks + one KDA slot{with_draft})"]
    rows = [("context", "blocks", "KV", "KDA slot", *(("draft",) if draft else ()), "total")]
    for r in fits:
        rows.append(
            (
                f"{r.context_len:,}",
                f"{r.kv_blocks_per_request:,}",
                b(r.kv_bytes_per_request),
                b(r.kda_bytes_per_request),
                *((b(r.draft_transfer_bytes),) if draft else ()),
                b(r.transfer_bytes),
            )
        )
    lines += _table(rows, align=">" * len(rows[0]), header=True)
    weights, workspace = fits[0].weight_bytes, fits[0].workspace_bytes  # the draft's included
    lines += [
        "",
        f"Fit in {b(memory)} (weights {b(weights)} {_pct(weights, memory)},"
        f" workspace {b(workspace)} {_pct(workspace, memory)})",
    ]
    message = _nothing_fits(ledger, memory, draft)
    if message:
        return [*lines, f"  {message}"]
    rows = [
        (
            "context",
            "requests",
            "KV blocks",
            "KV",
            "KV %",
            "KDA slots",
            "KDA state",
            "KDA %",
            "speculative",
            "free",
            "limiting",
        )
    ]
    for r in fits:
        rows.append(
            (
                f"{r.context_len:,}",
                f"{r.requests:,}",
                f"{r.kv_blocks:,}",
                b(r.kv_bytes),
                _pct(r.kv_bytes, memory),
                f"{r.kda_slots:,}",
                b(r.kda_bytes),
                _pct(r.kda_bytes, memory),
                b(r.spec_bytes),
                b(r.free_bytes),
                r.limiting,
            )
        )
    return lines + _table(rows, align=">>>>>>>>>><", header=True)


def _speculative_lines(
    args, ledger: CapacityLedger, draft: CapacityLedger, fits: list[ContextFit]
) -> list[str]:
    b = format_bytes
    lines = [
        "",
        f"Speculative decoding (--draft-model {args.draft_model}, --num-draft-tokens "
        f"{args.num_draft_tokens}): draft weights {b(draft.weight_bytes)} ({draft.num_parameters:,} "
        f"parameters), workspace {b(draft.workspace_bytes)}; per request: the target's checkpoint slot "
        f"{b(ledger.kda_slot_bytes)}, the draft's KV {b(draft.kv_bytes_per_token)}/token and two slots of "
        f"{b(draft.kda_slot_bytes)}",
    ]
    rows = [("context", "speculative per request")]
    rows += [(f"{r.context_len:,}", b(r.spec_bytes_per_request)) for r in fits]
    return lines + _table(rows, align=">>", header=True)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%"


def _table(rows: list[tuple[str, ...]], align: str | None = None, header: bool = False) -> list[str]:
    """Two-space indented columns; ``align`` has one ``<`` or ``>`` per column (first left by default)."""
    align = align or "<" + ">" * (len(rows[0]) - 1)
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    out = []
    for index, row in enumerate(rows):
        cells = [f"{cell:{a}{w}}" for cell, a, w in zip(row, align, widths, strict=True)]
        out.append(("  " + "   ".join(cells)).rstrip())
        if header and index == 0:
            out.append("  " + "   ".join("-" * w for w in widths))
    return out
