"""``baton generate``: run prompts through the in-process engine (``services.engine.LLM``).

One prompt (``--prompt`` / ``--prompt-ids``) prints its text and token ids; a JSONL file of prompts
(``--prompts IN.jsonl --out OUT.jsonl``) writes a log-prob dump (``mismatch/dump.py``): the environment
fingerprint, then one record per input line, in input order, which ``baton mismatch`` compares.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from mismatch import LogprobRecord, write_dump
from mismatch.environment import Environment
from services.config_flags import add_config_flags, engine_config
from services.engine import LLM, SamplingParams
from services.engine.dump_environment import engine_environment, engine_flags
from services.engine.engine_config import EngineConfig
from services.engine.model.config_loader import load_model_config

from .arguments import check_vocabulary, parse_token_ids


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("generate", help="generate with the engine, from one prompt or a JSONL file")
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (needs the folder's tokenizer)")
    prompt.add_argument("--prompt-ids", help="comma-separated prompt token ids")
    prompt.add_argument(
        "--prompts",
        type=Path,
        help='JSONL: {"id": ..., "prompt_ids": [...]} or {"id": ..., "prompt": "..."}, '
        'optionally "adapter": NAME (overrides --adapter for that line)',
    )
    parser.add_argument("--out", type=Path, help="JSONL results (required with --prompts)")
    parser.add_argument(
        "--chat", action="store_true", help="wrap --prompt as a user message in the chat template"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    parser.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    parser.add_argument(
        "--presence-penalty", type=float, default=0.0, help="subtracted once per output token (0: off)"
    )
    parser.add_argument(
        "--frequency-penalty", type=float, default=0.0, help="subtracted per occurrence (default 0: off)"
    )
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="divides the logits of prompt and generated tokens (default 1: off)",
    )
    parser.add_argument(
        "--logit-bias", default="", help="ID:BIAS,...: added to those tokens' logits (bias in [-100, 100])"
    )
    parser.add_argument("--logprobs", action="store_true", help="include the logprob of each generated token")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    parser.add_argument(
        "--adapter", default="", help="LoRA adapter (loaded with --adapters NAME=FOLDER) for every prompt"
    )
    add_config_flags(parser.add_argument_group("engine"), EngineConfig, exclude=("model",))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.prompts is not None and args.out is None:
        raise ValueError("--out: required with --prompts")
    ids, prompts, adapters = _read_prompts(args)
    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            logprobs=0 if args.logprobs else None,
            ignore_eos=args.ignore_eos,
            presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty,
            repetition_penalty=args.repetition_penalty,
            logit_bias=_logit_bias(args.logit_bias),
        )
    except ValueError as error:  # "max_tokens: ..." -> "--max-tokens: ..."
        field, _, message = str(error).partition(":")
        raise ValueError(f"--{field.replace('_', '-')}:{message}") from None
    options = dataclasses.asdict(engine_config(args))
    with LLM(options.pop("model"), **options) as llm:  # with --tp etc.: its follower ranks stop at the end
        return _generate(args, llm, ids, prompts, adapters, params)


def _logit_bias(text: str) -> dict[int, float]:
    """``--logit-bias 5:2.5,7:-100`` -> ``{5: 2.5, 7: -100.0}``; ValueError naming ``logit_bias``."""
    bias = {}
    for item in filter(None, text.split(",")):
        token, sep, value = item.partition(":")
        try:
            if not sep:
                raise ValueError(item)
            bias[int(token)] = float(value)
        except ValueError:
            raise ValueError(f"logit_bias: expected ID:BIAS pairs joined by commas, got {item!r}") from None
    return bias


def _generate(args: argparse.Namespace, llm: LLM, ids: list, prompts: list, adapters: list, params) -> int:
    if args.chat:
        if llm.tokenizer is None or args.prompt is None:
            raise ValueError("--chat: needs --prompt and a checkpoint with a tokenizer")
        prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])]
    outputs = llm.generate(prompts, params, adapter=adapters)
    if args.prompts is None:
        output = outputs[0]
        print(output.text)
        print(
            f"[{len(output.prompt_ids)} prompt tokens, {len(output.token_ids)} generated, "
            f"finish={output.finish_reason}] ids: {','.join(map(str, output.token_ids))}"
        )
        return 0
    records = (
        LogprobRecord.from_values(
            request_id,
            "generate",
            output.token_ids,
            output.logprobs,  # float32 values (the sampler's log_softmax), stored as their bits
            "float32",
            prompt_ids=output.prompt_ids,
            extra={
                "text": output.text,
                "finish_reason": output.finish_reason,
                "num_cached_tokens": output.num_cached_tokens,
                **({"adapter": adapter} if adapter else {}),
            },
        )
        for request_id, output, adapter in zip(ids, outputs, adapters, strict=True)
    )
    write_dump(args.out, _environment(llm, params), records)
    print(f"wrote {len(outputs)} results to {args.out}", file=sys.stderr)
    return 0


def _read_prompts(args: argparse.Namespace) -> tuple[list, list, list[str]]:
    """``(ids, prompts, adapter names)``, one each per prompt."""
    if args.prompt is not None:
        return [None], [args.prompt], [args.adapter]
    if args.prompt_ids is not None:
        ids = parse_token_ids(args.prompt_ids, "--prompt-ids")
        check_vocabulary(ids, load_model_config(args.model).vocab_size, "--prompt-ids")
        return [None], [ids], [args.adapter]
    if not args.prompts.is_file():
        raise FileNotFoundError(f"--prompts: {args.prompts} not found")
    ids, prompts, adapters = [], [], []
    for number, line in enumerate(args.prompts.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"--prompts: {args.prompts.name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict) or ("prompt" in record) == ("prompt_ids" in record):
            raise ValueError(f"{where}: needs exactly one of 'prompt' or 'prompt_ids'")
        prompt = record.get("prompt", record.get("prompt_ids"))
        if "prompt_ids" in record and not (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            raise ValueError(f"{where}: prompt_ids must be a non-empty list of integers")
        if "prompt" in record and not isinstance(prompt, str):
            raise ValueError(f"{where}: prompt must be a string")
        adapter = record.get("adapter", args.adapter)
        if not isinstance(adapter, str):
            raise ValueError(f"{where}: adapter must be a string (an adapter's name)")
        ids.append(record.get("id", number))
        prompts.append(prompt)
        adapters.append(adapter)
    if not prompts:
        raise ValueError(f"--prompts: {args.prompts} holds no prompts")
    return ids, prompts, adapters


def _environment(llm: LLM, params: SamplingParams) -> Environment:
    """The fingerprint of this run: the engine's resolved settings, the sampling parameters."""
    flags = engine_flags(llm)
    flags.update(
        {
            f"sampling.{name}": getattr(params, name)
            for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "ignore_eos")
        }
    )
    return engine_environment(llm, flags)
