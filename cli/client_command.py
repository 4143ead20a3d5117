"""``baton client generate``: one request to a router over gRPC, printed as JSON or text."""

import argparse
import json

import grpc

from proto.baton.v1 import generation_pb2, generation_pb2_grpc

from .arguments import parse_token_ids

_REASONS = {
    generation_pb2.FINISH_REASON_STOP: "stop",
    generation_pb2.FINISH_REASON_LENGTH: "length",
    generation_pb2.FINISH_REASON_ABORT: "abort",
}


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("client", help="talk to a running router")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    generate = actions.add_parser("generate", help="stream one generation")
    generate.add_argument("--addr", required=True, help="router HOST:PORT")
    prompt = generate.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="comma-separated token ids")
    prompt.add_argument("--prompt", help="prompt text")
    generate.add_argument("--max-tokens", type=int, default=16)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--logprobs", action="store_true")
    generate.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds (default 120)")
    generate.add_argument("--json", action="store_true", help="print one JSON object")
    generate.set_defaults(run=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    sampling = generation_pb2.SamplingParameters(max_tokens=args.max_tokens, temperature=args.temperature)
    if args.seed is not None:
        sampling.seed = args.seed
    if args.logprobs:
        sampling.logprobs = 0
    request = generation_pb2.GenerateRequest(sampling=sampling)
    if args.prompt_ids is not None:
        request.token_ids.ids.extend(parse_token_ids(args.prompt_ids, "--prompt-ids"))
    else:
        request.text = args.prompt
    tokens, logprobs, text, final = [], [], "", None
    with grpc.insecure_channel(args.addr) as channel:
        try:
            for message in generation_pb2_grpc.GenerationStub(channel).Generate(
                request, timeout=args.timeout
            ):
                tokens += message.token_ids
                logprobs += message.logprobs
                text += message.text
                if not args.json and message.text:
                    print(message.text, end="", flush=True)
                final = message
        except grpc.RpcError as error:
            raise ValueError(f"{error.code().name}: {error.details()}") from None
    result = {
        "token_ids": tokens,
        "logprobs": logprobs if args.logprobs else None,
        "text": text,
        "finish_reason": _REASONS.get(final.finish_reason) if final else None,
        "usage": {
            "prompt": final.usage.prompt_tokens,
            "completion": final.usage.completion_tokens,
            "cached": final.usage.cached_tokens,
        }
        if final
        else None,
        "route": {
            "prefill": final.route.prefill_worker,
            "decode": final.route.decode_worker,
            "transfer_backend": final.route.transfer_backend,
            "transfer_bytes": final.route.transfer_bytes,
        }
        if final
        else None,
    }
    print(json.dumps(result) if args.json else "")
    return 0
