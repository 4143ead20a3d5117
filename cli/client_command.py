"""``baton client generate``: one request to a router through the SDK, printed as JSON or text."""

import argparse
import json

from sdk import BatonError, Client, Completion

from .arguments import parse_token_ids
from .tls_flags import add_client_tls_flags, client_tls_from
from .token_file import read_token_file


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("client", help="talk to a running router")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    generate = actions.add_parser("generate", help="stream one generation")
    generate.add_argument("--addr", required=True, help="router HOST:PORT")
    generate.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="the router's bearer token: the first field of the file's first line that is not blank "
        "or a # comment (for a router with --auth-token-file)",
    )
    prompt = generate.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="comma-separated token ids")
    prompt.add_argument("--prompt", help="prompt text")
    generate.add_argument("--chat", action="store_true", help="send --prompt as one user message of a chat")
    generate.add_argument("--max-tokens", type=int, default=16)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)"
    )
    generate.add_argument("--logprobs", action="store_true", help="return each token's logprob")
    generate.add_argument(
        "--top-logprobs",
        type=int,
        default=None,
        metavar="N",
        help="also the top N per token (implies --logprobs)",
    )
    generate.add_argument("--session-id", default="", help="affinity key: a session's turns share workers")
    generate.add_argument("--tenant", default="", help="prefix-cache isolation key")
    generate.add_argument("--adapter", default="", help="a LoRA adapter loaded on the workers")
    generate.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds (default 120)")
    generate.add_argument("--json", action="store_true", help="print one JSON object")
    add_client_tls_flags(generate)
    generate.set_defaults(run=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    token = read_token_file(args.token_file)
    tls = client_tls_from(args)
    options = dict(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        stop=args.stop,
        logprobs=_logprobs(args),
        session_id=args.session_id,
        tenant=args.tenant,
        adapter=args.adapter,
    )
    if args.prompt_ids is not None:
        if args.chat:
            raise ValueError("--chat: needs --prompt (a text message), not --prompt-ids")
        options["prompt_ids"] = parse_token_ids(args.prompt_ids, "--prompt-ids")
    elif args.chat:
        options["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        options["prompt"] = args.prompt
    chunks = []
    secure = {} if tls is None else vars(tls)  # root_certificates, client_cert, client_key
    with Client(args.addr, timeout_s=args.timeout, token=token, **secure) as client:
        try:
            for chunk in client.generate_stream(**options):
                chunks.append(chunk)
                if not args.json and chunk.text:
                    print(chunk.text, end="", flush=True)
        except BatonError as error:
            # main() prints a ValueError as one line and exits 2: "CODE: details", no traceback.
            raise ValueError(" ".join(str(error).split())) from None
    completion = Completion.from_chunks(chunks, logprobs=options["logprobs"])
    print(json.dumps(_as_json(completion)) if args.json else "")
    return 0


def _logprobs(args: argparse.Namespace) -> int | None:
    if args.top_logprobs is not None:
        if args.top_logprobs < 0:
            raise ValueError(f"--top-logprobs: expected N >= 0, got {args.top_logprobs}")
        return args.top_logprobs
    return 0 if args.logprobs else None


def _as_json(completion: Completion) -> dict:
    """The command's output object; ``top_logprobs`` ([[[id, logprob], ...], ...]) only when asked."""
    usage, route = completion.usage, completion.route
    result = {
        "token_ids": list(completion.token_ids),
        "logprobs": list(completion.logprobs) if completion.logprobs is not None else None,
        "text": completion.text,
        "finish_reason": completion.finish_reason,
        "usage": {
            "prompt": usage.prompt_tokens,
            "completion": usage.completion_tokens,
            "cached": usage.cached_tokens,
            "cached_host": usage.cached_tokens_host,
            "drafted": usage.draft_tokens,
            "accepted_drafts": usage.accepted_draft_tokens,
        }
        if usage
        else None,
        "route": {
            "prefill": route.prefill_worker,
            "decode": route.decode_worker,
            "transfer_backend": route.transfer_backend,
            "transfer_bytes": route.transfer_bytes,
        }
        if route
        else None,
    }
    if completion.top_logprobs is not None:
        result["top_logprobs"] = [[list(pair) for pair in token] for token in completion.top_logprobs]
    return result
