"""``baton eval``: held-out evaluation of a checkpoint (and its draft) on real text, through the engine.

The text (``tools/demo_model/corpus.py``'s held-out documents, or ``--text FILE``) is tokenized with
the checkpoint's tokenizer and cut into windows of ``--seq-len`` tokens (a window never spans two
documents; a document's tail shorter than a window is left out). Reported, as a table and ``--json``:

- perplexity: ``exp(-mean log-prob)`` of every window token after its first, the log-probs from
  ``LLM.score`` (what serving computes), for the checkpoint and for ``--draft``;
- served vs offline: greedy continuations of the first windows' first ``--prompt-len`` tokens through
  ``LLM.generate`` (the engine's ``--kernels``) against greedy generation on the ``reference`` kernels
  (token agreement), and the served log-probs against the reference engine's one-prefill scoring of
  the same served tokens (``LLM.score``: max absolute difference);
- FP8 KV: the windows run with FP8 and with model-dtype blocks (``measure_kv_format``): log-prob
  error at each real next token, and the DSA indexer's top-k overlap (windows longer than
  ``index_topk`` only: shorter ones select every key);
- the draft's accepted length: the same greedy continuations through the engine speculating with
  ``--draft`` at each of ``--draft-tokens`` (default 1-7) draft tokens: drafts accepted per verify,
  and whether the tokens stayed the plain engine's (greedy speculation must not change them).
"""

import argparse
import dataclasses
import itertools
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

from common.sampling_params import SamplingParams
from services.config_flags import add_config_flags, engine_config
from services.engine import LLM
from services.engine.benchmark.kv_format_bench import measure_kv_format
from services.engine.engine_config import MAX_DRAFT_TOKENS, PARALLEL_DEGREES, EngineConfig
from tools.demo_model import corpus

from .arguments import positive_int_list

NO_DRAFT = "no --draft given"


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "eval", help="held-out perplexity, served vs offline agreement, FP8 KV error and DSA overlap on text"
    )
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder (with its tokenizer)")
    parser.add_argument(
        "--draft", type=Path, help="draft checkpoint folder: its perplexity on the same windows"
    )
    parser.add_argument(
        "--text", type=Path, help="a UTF-8 text file, one document (default: held-out corpus)"
    )
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per window (default 512)")
    parser.add_argument("--max-windows", type=int, default=32, help="windows scored at most (default 32)")
    parser.add_argument(
        "--kv-windows", type=int, default=4, help="of those, windows run twice for FP8 KV (default 4)"
    )
    parser.add_argument(
        "--prompts", type=int, default=4, help="served-vs-offline prompts, from the first windows (default 4)"
    )
    parser.add_argument("--prompt-len", type=int, default=32, help="tokens per such prompt (default 32)")
    parser.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    parser.add_argument(
        "--draft-tokens",
        default="1,2,3,4,5,6,7",
        help="draft lengths k for the accepted length (default 1-7)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    # One rank (LLM.score); the FP8 comparison runs both KV formats, so the format is not a flag; the
    # draft is --draft, speculated with at each --draft-tokens (always k: a fixed policy).
    add_config_flags(
        parser.add_argument_group("engine"),
        EngineConfig,
        exclude=("model", "kv_format", "draft_model", "num_draft_tokens", "spec_policy", *PARALLEL_DEGREES),
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    _check_counts(args)
    options = dataclasses.asdict(engine_config(args))
    model = options.pop("model")
    if args.seq_len > options["max_model_len"]:
        raise ValueError(f"--seq-len: {args.seq_len} exceeds --max-model-len {options['max_model_len']}")
    served = LLM(model, **options)
    if served.tokenizer is None:
        raise ValueError(f"--model: {model} has no tokenizer (eval tokenizes text)")
    windows = text_windows(documents(args.text), served.tokenizer.encode, args.seq_len, args.max_windows)
    results = {
        "model": str(model),
        "text": str(args.text) if args.text else "heldout_documents()",
        "seq_len": args.seq_len,
        "windows": len(windows),
        "scored_tokens": len(windows) * (args.seq_len - 1),
        "perplexity": {"model": perplexity(served, windows)},
    }
    if args.draft is not None:
        results["perplexity"]["draft"] = perplexity(_draft(args.draft, served, options), windows)
    reference = (
        served
        if served.config.kernel_backend == "reference"
        else LLM(model, **options | {"kernels": "reference"})
    )
    prompts = [window[: args.prompt_len] for window in windows[: args.prompts]]
    results["served_vs_offline"] = served_vs_offline(served, reference, prompts, args.max_tokens)
    report = measure_kv_format(served.engine.model, windows[: args.kv_windows])
    results["kv_fp8"] = dataclasses.asdict(report)
    results["dsa_overlap"] = _dsa_overlap(
        report.indexer_overlap, args.seq_len, served.engine.model.index_topk
    )
    results["draft_acceptance"] = (
        draft_acceptance(served, model, args.draft, prompts, args.max_tokens, _draft_lengths(args), options)
        if args.draft is not None
        else NO_DRAFT
    )
    _print_table(results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def perplexity(llm: LLM, windows: list[list[int]]) -> float:
    """``exp(-mean log-prob)`` over every window token after the first, from ``LLM.score``."""
    logprobs = llm.score([w[:1] for w in windows], [w[1:] for w in windows])
    values = [value for row in logprobs for value in row]
    return math.exp(-sum(values) / len(values))


def draft_acceptance(
    served: LLM,
    model: str,
    draft: Path,
    prompts: list[list[int]],
    max_tokens: int,
    lengths: list[int],
    options: dict,
) -> dict:
    """Greedy continuations of ``prompts`` through the engine speculating with ``draft`` at each draft
    length ``k`` in ``lengths``.

    Returns:
        ``str(k) -> {"accepted_per_verify", "verifies", "same_tokens"}``: drafts accepted per verify
        step, how many verifies that is over, and whether every token equals ``served``'s plain
        greedy continuation.
    """
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    plain = [o.token_ids for o in served.generate(prompts, params)]
    results = {}
    for k in lengths:
        spec = {"draft_model": str(draft), "num_draft_tokens": k, "spec_policy": "fixed"}  # k every step
        speculating = LLM(model, **options | spec)
        tokens = [o.token_ids for o in speculating.generate(prompts, params)]
        counts = speculating.engine.spec_counters.counts()
        results[str(k)] = {
            "accepted_per_verify": counts.mean_accepted,
            "verifies": counts.verifies,
            "same_tokens": tokens == plain,
        }
    return results


def served_vs_offline(served: LLM, reference: LLM, prompts: list[list[int]], max_tokens: int) -> dict:
    """Greedy continuations of ``prompts`` on ``served`` against ``reference`` (see the module docstring).

    Returns:
        ``kernels`` (served, reference), ``tokens``, ``token_agreement`` (positions where the two greedy
        continuations agree, over all served positions), ``identical_prefix_mean`` (mean length of the
        agreeing prefix) and ``max_logprob_diff`` (served log-probs against the reference's one-prefill
        scoring of the served tokens).
    """
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0, ignore_eos=True)
    ours = served.generate(prompts, params)
    theirs = reference.generate(prompts, params)
    rescored = reference.score(prompts, [o.token_ids for o in ours])
    agree = prefix = tokens = 0
    diff = 0.0
    for mine, other, offline in zip(ours, theirs, rescored, strict=True):
        same = [a == b for a, b in zip(mine.token_ids, other.token_ids, strict=True)]
        agree += sum(same)
        prefix += next((i for i, s in enumerate(same) if not s), len(same))
        tokens += len(mine.token_ids)
        diff = max([diff, *(abs(a - b) for a, b in zip(mine.logprobs, offline, strict=True))])
    return {
        "kernels": [served.config.kernel_backend, reference.config.kernel_backend],
        "tokens": tokens,
        "token_agreement": agree / tokens,
        "identical_prefix_mean": prefix / len(prompts),
        "max_logprob_diff": diff,
    }


def _check_counts(args: argparse.Namespace) -> None:
    for flag, value, minimum in (
        ("--seq-len", args.seq_len, 2),
        ("--max-windows", args.max_windows, 1),
        ("--kv-windows", args.kv_windows, 1),
        ("--prompts", args.prompts, 1),
        ("--prompt-len", args.prompt_len, 1),
        ("--max-tokens", args.max_tokens, 1),
    ):
        if value < minimum:
            raise ValueError(f"{flag}: {value} must be at least {minimum}")
    if args.prompt_len >= args.seq_len:
        raise ValueError(f"--prompt-len: {args.prompt_len} must be below --seq-len {args.seq_len}")
    if args.text is not None and not args.text.is_file():
        raise FileNotFoundError(f"--text: {args.text} not found")
    if args.draft is not None and not args.draft.is_dir():
        raise FileNotFoundError(f"--draft: {args.draft} is not a checkpoint folder")
    _draft_lengths(args)


def _draft_lengths(args: argparse.Namespace) -> list[int]:
    return positive_int_list(args.draft_tokens, "--draft-tokens", MAX_DRAFT_TOKENS)


def documents(text: Path | None) -> Iterator[str]:
    """``text``'s one document, or the held-out corpus's documents when ``text`` is None."""
    if text is not None:
        yield text.read_text(encoding="utf-8")
        return
    try:
        yield from corpus.heldout_documents()
    except corpus.CorpusNotInstalledError as error:
        raise ValueError(f"--text: none given and the held-out corpus is not installed ({error})") from None


def text_windows(documents: Iterable[str], encode, seq_len: int, limit: int) -> list[list[int]]:
    """Up to ``limit`` windows of ``seq_len`` tokens, each within one document, in document order."""
    windows = list(itertools.islice(_cut(documents, encode, seq_len), limit))
    if not windows:
        raise ValueError(f"--seq-len: no document holds {seq_len} tokens; give a shorter --seq-len")
    return windows


def _cut(documents: Iterable[str], encode, seq_len: int) -> Iterator[list[int]]:
    for document in documents:
        ids = encode(document)
        for start in range(0, len(ids) - seq_len + 1, seq_len):
            yield ids[start : start + seq_len]


def _draft(folder: Path, served: LLM, options: dict) -> LLM:
    draft = LLM(str(folder), **options)
    if draft.engine.model.config.vocab_size != served.engine.model.config.vocab_size:
        raise ValueError(
            f"--draft: vocabulary {draft.engine.model.config.vocab_size} differs from the model's "
            f"{served.engine.model.config.vocab_size} (a draft shares its target's tokenizer)"
        )
    return draft


def _dsa_overlap(overlap: float | None, seq_len: int, topk: int | None) -> float | str:
    """The FP8-vs-auto top-k overlap, or why there is none worth reporting."""
    if overlap is None:
        return "no DSA indexer"
    if seq_len <= topk:
        return f"--seq-len {seq_len} <= index_topk {topk}: every key is selected"
    return overlap


def _acceptance_rows(acceptance: dict | str) -> list[tuple[str, str]]:
    if isinstance(acceptance, str):
        return [("draft accepted per verify", acceptance)]
    return [
        (
            f"draft accepted per verify (k={k})",
            f"{row['accepted_per_verify']:.2f} over {row['verifies']} verifies"
            + ("" if row["same_tokens"] else "; TOKENS DIFFER from plain greedy"),
        )
        for k, row in acceptance.items()
    ]


def _print_table(results: dict) -> None:
    comparison, kv = results["served_vs_offline"], results["kv_fp8"]
    rows = [
        ("windows x seq_len", f"{results['windows']} x {results['seq_len']} ({results['text']})"),
        *((f"perplexity ({name})", f"{value:.4f}") for name, value in results["perplexity"].items()),
        ("served vs offline kernels", " vs ".join(comparison["kernels"])),
        ("greedy token agreement", f"{comparison['token_agreement']:.4f} of {comparison['tokens']} tokens"),
        ("identical prefix (mean)", f"{comparison['identical_prefix_mean']:.1f} tokens"),
        ("served vs offline max |dlogprob|", f"{comparison['max_logprob_diff']:.3e}"),
        (
            "FP8 KV |dlogprob| mean / max",
            f"{kv['next_token_logprob_abs_diff_mean']:.3e} / "
            f"{kv['next_token_logprob_abs_diff_max']:.3e} ({kv['tokens']} tokens)",
        ),
        ("FP8 KV argmax agreement", f"{kv['argmax_agreement']:.4f}"),
        ("DSA top-k overlap (FP8 vs auto)", _number(results["dsa_overlap"])),
        *_acceptance_rows(results["draft_acceptance"]),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def _number(value: float | str) -> str:
    return f"{value:.4f}" if isinstance(value, float) else value
