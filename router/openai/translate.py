"""Parsed OpenAI requests -> the router's ``GenerateRequest`` messages, one per choice.

A request with ``P`` prompts and ``n`` samples each becomes ``P * n`` generations, in choice order
(OpenAI's ``index = prompt_index * n + j``); sample ``j`` is seeded with ``seed + j``
(``schema.choice_seed``). Each has its own ``request_id``: ``<id>-<index>`` when there are several.
"""

import dataclasses

from common.sampling_pb import structured_to_pb
from proto.baton.v1 import generation_pb2

from .schema import ChatRequest, CompletionRequest, Options, Sampling, choice_seed


def sampling_to_pb(sampling: Sampling, default_max_tokens: int) -> generation_pb2.SamplingParameters:
    """``Sampling`` -> ``SamplingParameters``; ``max_tokens`` None becomes ``default_max_tokens``."""
    message = generation_pb2.SamplingParameters(
        max_tokens=sampling.max_tokens if sampling.max_tokens is not None else default_max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        stop=sampling.stop,
        stop_token_ids=sampling.stop_token_ids,
        ignore_eos=sampling.ignore_eos,
        logit_bias=dict(sampling.logit_bias),
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
    )
    if sampling.seed is not None:
        message.seed = sampling.seed
    if sampling.logprobs is not None:
        message.logprobs = sampling.logprobs
    structured_to_pb(sampling.structured_output, message)
    return message


def completion_calls(request: CompletionRequest, request_id: str) -> list[generation_pb2.GenerateRequest]:
    """Every choice's generation: each prompt ``n`` times, prompt-major."""
    n = request.options.n
    calls = []
    for p, prompt in enumerate(request.prompts):
        for j in range(n):
            calls.append(completion_to_pb(request, _call_id(request_id, p * n + j, request), prompt, j))
    return calls


def chat_calls(
    request: ChatRequest, request_id: str, max_model_len: int
) -> list[generation_pb2.GenerateRequest]:
    """Every choice's generation: the conversation ``n`` times."""
    return [
        chat_to_pb(request, _call_id(request_id, j, request), max_model_len, j)
        for j in range(request.options.n)
    ]


def completion_to_pb(
    request: CompletionRequest, request_id: str, prompt: str | tuple[int, ...] | None = None, j: int = 0
) -> generation_pb2.GenerateRequest:
    """One generation of a completions request: ``prompt`` (default: the first) as text or token ids,
    sample ``j`` of it."""
    prompt = request.prompts[0] if prompt is None else prompt
    message = _common(request.options, request_id)
    message.sampling.CopyFrom(sampling_to_pb(_sample(request.sampling, j), 16))
    if request.echo and request.sampling.logprobs is not None:
        message.prompt_logprobs = request.sampling.logprobs  # the echoed prompt's, with its top n
    if isinstance(prompt, str):
        message.text = prompt
    else:
        message.token_ids.ids.extend(prompt)
    return message


def chat_to_pb(
    request: ChatRequest, request_id: str, max_model_len: int, j: int = 0
) -> generation_pb2.GenerateRequest:
    """Sample ``j`` of a chat request: the router applies the chat template. Without ``max_tokens`` the
    completion may run to ``max_model_len`` (OpenAI's default; the engine stops at the model length)."""
    message = _common(request.options, request_id)
    message.sampling.CopyFrom(sampling_to_pb(_sample(request.sampling, j), max_model_len))
    chat = message.chat
    chat.add_generation_prompt = True
    for m in request.messages:
        chat.messages.add(
            role=m.role, content=m.content, tool_call_id=m.tool_call_id, name=m.name
        ).tool_calls.extend(
            generation_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in m.tool_calls
        )
    chat.tools.extend(
        generation_pb2.Tool(name=t.name, description=t.description, parameters=t.parameters)
        for t in request.tools
    )
    mode = generation_pb2.ToolChoice.Mode
    if request.named_tool:
        chat.tool_choice.mode, chat.tool_choice.function_name = (
            mode.Value("MODE_FUNCTION"),
            request.tool_choice,
        )
    else:
        chat.tool_choice.mode = mode.Value(f"MODE_{request.tool_choice.upper()}")
    chat.single_tool_call = not request.parallel_tool_calls
    return message


def _sample(sampling: Sampling, j: int) -> Sampling:
    return sampling if j == 0 else dataclasses.replace(sampling, seed=choice_seed(sampling.seed, j))


def _call_id(request_id: str, index: int, request: CompletionRequest | ChatRequest) -> str:
    several = request.options.n > 1 or len(getattr(request, "prompts", ())) > 1
    return f"{request_id}-{index}" if several else request_id


def _common(options: Options, request_id: str) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        request_id=request_id,
        model=options.model,
        session_id=options.session_id,
        tenant=options.tenant,
        no_migration=options.no_migration,
    )
