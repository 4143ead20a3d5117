"""Parsed OpenAI requests -> the router's ``GenerateRequest``."""

from proto.baton.v1 import generation_pb2

from .schema import ChatRequest, CompletionRequest, Options, Sampling


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
    return message


def completion_to_pb(request: CompletionRequest, request_id: str) -> generation_pb2.GenerateRequest:
    """A completions request: ``prompt`` goes as text or as token ids."""
    message = _common(request.options, request_id)
    message.sampling.CopyFrom(sampling_to_pb(request.sampling, 16))
    if isinstance(request.prompt, str):
        message.text = request.prompt
    else:
        message.token_ids.ids.extend(request.prompt)
    return message


def chat_to_pb(request: ChatRequest, request_id: str, max_model_len: int) -> generation_pb2.GenerateRequest:
    """A chat request: the router applies the chat template. Without ``max_tokens`` the completion may
    run to ``max_model_len`` (OpenAI's default; the engine stops at the model length)."""
    message = _common(request.options, request_id)
    message.sampling.CopyFrom(sampling_to_pb(request.sampling, max_model_len))
    message.chat.add_generation_prompt = True
    message.chat.messages.extend(
        generation_pb2.ChatMessage(role=m.role, content=m.content) for m in request.messages
    )
    return message


def _common(options: Options, request_id: str) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        request_id=request_id,
        model=options.model,
        session_id=options.session_id,
        tenant=options.tenant,
        no_migration=options.no_migration,
    )
