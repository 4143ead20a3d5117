"""``baton score``: the log-probs of given tokens after given prompts, from one prefill each
(``LLM.score``), written as a log-prob dump with path ``score``.

Input: a ``baton generate --out`` dump (rescoring what was generated: the scorer experiment,
``baton mismatch --mode scorer score.jsonl generate.jsonl``), or JSONL lines
``{"id": ..., "prompt_ids": [...], "token_ids": [...], "adapter": NAME (optional)}``.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from mismatch import LogprobRecord, read_dump, write_dump
from mismatch.dump import FORMAT_KEY
from services.config_flags import add_config_flags, engine_config
from services.engine import LLM
from services.engine.dump_environment import engine_environment, engine_flags
from services.engine.engine_config import PARALLEL_DEGREES, EngineConfig


@dataclasses.dataclass(frozen=True)
class _Request:
    request_id: str | int
    prompt_ids: list[int]
    token_ids: list[int]
    adapter: str


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "score", help="score given tokens after given prompts (one prefill each), writing a log-prob dump"
    )
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder")
    parser.add_argument(
        "--prompts",
        required=True,
        type=Path,
        help='a `baton generate --out` dump, or JSONL {"id": ..., "prompt_ids": [...], "token_ids": [...]} '
        '(optional "adapter": NAME)',
    )
    parser.add_argument("--out", required=True, type=Path, help="the dump to write (path: score)")
    parser.add_argument(
        "--adapter",
        default="",
        help="LoRA adapter (loaded with --adapters NAME=FOLDER) where a line names none",
    )
    # One rank: the scorer's private prefill runs outside the engine's steps (docs/parallel.md).
    add_config_flags(parser.add_argument_group("engine"), EngineConfig, exclude=("model", *PARALLEL_DEGREES))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    requests = _read_requests(args.prompts, args.adapter)
    options = dataclasses.asdict(engine_config(args))
    llm = LLM(options.pop("model"), **options)
    logprobs = llm.score(
        [r.prompt_ids for r in requests], [r.token_ids for r in requests], [r.adapter for r in requests]
    )
    records = (
        LogprobRecord.from_values(
            r.request_id,
            "score",
            r.token_ids,
            values,  # float32 values (the sampler's raw_logprobs), stored as their bits
            "float32",
            prompt_ids=r.prompt_ids,
            extra={"adapter": r.adapter} if r.adapter else {},
        )
        for r, values in zip(requests, logprobs, strict=True)
    )
    write_dump(args.out, engine_environment(llm, engine_flags(llm)), records)
    print(f"wrote {len(requests)} scored requests to {args.out}", file=sys.stderr)
    return 0


def _read_requests(path: Path, default_adapter: str) -> list[_Request]:
    if not path.is_file():
        raise FileNotFoundError(f"--prompts: {path} not found")
    lines = path.read_text().splitlines()
    if lines and FORMAT_KEY in lines[0]:
        requests = []
        for record in read_dump(path).records:
            if not record.prompt_ids:
                raise ValueError(f"--prompts: {path.name}: request {record.request_id!r} has no prompt_ids")
            adapter = record.extra.get("adapter", default_adapter)
            requests.append(
                _Request(record.request_id, list(record.prompt_ids), list(record.token_ids), adapter)
            )
        return _nonempty(requests, path)
    requests = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--prompts: {path.name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected an object")
        for key, minimum in (("prompt_ids", 1), ("token_ids", 0)):
            ids = record.get(key)
            if not (
                isinstance(ids, list)
                and len(ids) >= minimum
                and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
            ):
                what = "a non-empty list" if minimum else "a list"
                raise ValueError(f"{where}: {key} must be {what} of integers")
        adapter = record.get("adapter", default_adapter)
        if not isinstance(adapter, str):
            raise ValueError(f"{where}: adapter must be a string (an adapter's name)")
        request_id = record.get("id", number)
        requests.append(_Request(request_id, record["prompt_ids"], record["token_ids"], adapter))
    return _nonempty(requests, path)


def _nonempty(requests: list[_Request], path: Path) -> list[_Request]:
    if not requests:
        raise ValueError(f"--prompts: {path} holds no requests")
    return requests
