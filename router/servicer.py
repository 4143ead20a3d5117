"""The public ``Generation`` servicer: validate, tokenize, run through the workers, detokenize."""

import secrets
import time

from common.limits import FieldError, check_prompt_bytes, check_prompt_tokens, utf8_bytes
from common.metrics import Metrics
from common.model_info import ModelInfo
from common.rpc.errors import status_for
from common.sampling_pb import sampling_from_pb
from common.stop_strings import stop_cut
from common.tokenizer import IncrementalDetokenizer, Tokenizer
from common.tool_calls import has_tool_calls, tool_call_format
from common.tool_calls.call_grammar import forced_call_grammar
from proto.baton.v1 import generation_pb2, generation_pb2_grpc

from .admission import Admission
from .chat_tools import template_messages, template_parameters, template_tools
from .dispatch import Dispatcher, time_left
from .tenant_rate_limit import RateLimited, TenantRateLimit
from .tool_call_stream import ToolCallStream
from .validation import check_generate, check_tokenize

_DEADLINE_SLACK_S = 0.05


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    """Args: the served model's id and ``ModelInfo`` (family, vocabulary size), its tokenizer (or None),
    the dispatcher (workers), the longest request, the process's metrics (TTFT, TPOT, ITL, E2E, outcomes,
    tokens), the admission control (bounded queue), the SLO targets a request must meet to count as
    goodput, and the per-tenant request rate limit (None: none)."""

    def __init__(
        self,
        model_id: str,
        config: ModelInfo,
        tokenizer: Tokenizer | None,
        dispatcher: Dispatcher,
        max_model_len: int,
        metrics: Metrics,
        admission: Admission,
        slo_ttft_s: float = 2.0,
        slo_tpot_s: float = 0.1,
        rate_limit: TenantRateLimit | None = None,
    ):
        self.metrics = metrics
        self.rate_limit = rate_limit
        self.slo_ttft_s = slo_ttft_s
        self.slo_tpot_s = slo_tpot_s
        self.admission = admission
        self.model_id = model_id
        self.config = config
        self.tokenizer = tokenizer
        self.dispatcher = dispatcher
        self.max_model_len = max_model_len
        self.max_token_bytes = tokenizer.max_token_bytes if tokenizer is not None else None

    def Generate(self, request, context):
        started = time.monotonic()
        last_token_at, first_token_at, tokens, status = None, None, 0, "error"
        admitted = ended = False
        try:
            # before the queue: a request that breaks a limit neither waits nor holds a seat
            check_generate(request, self.config.vocab_size, self.max_token_bytes, self.max_model_len)
            if self.rate_limit is not None:
                self._within_rate(request.tenant)
            self.admission.enter(time_left(context))
            self.metrics.queue_time.observe(time.monotonic() - started)
            admitted = True
            for message in self._generate(request, context):
                if message.token_ids:
                    now = time.monotonic()
                    if first_token_at is None:
                        first_token_at = now
                        self.metrics.ttft.observe(now - started)
                    else:
                        self.metrics.itl.observe(now - last_token_at)
                    last_token_at, tokens = now, tokens + len(message.token_ids)
                if message.finish_reason:
                    status = generation_pb2.FinishReason.Name(message.finish_reason).removeprefix(
                        "FINISH_REASON_"
                    )
                    status = "STOP" if status == "TOOL_CALLS" else status  # a stop, for the metrics
                    ended = True
                    self._count(message)
                yield message
        except Exception as error:
            status = status_for(error).name
            raise
        finally:
            if admitted:
                self.admission.leave()
            if not ended and not context.is_active():
                # The client left (or its deadline passed) first: whatever error that caused in the
                # workers (a cancelled prefill reads as UNAVAILABLE) is not a failure of the service.
                status = "DEADLINE_EXCEEDED" if _deadline_passed(context) else "CANCELLED"
            self.metrics.requests.labels(status.lower()).inc()
            if first_token_at is not None:
                self.metrics.e2e.observe(last_token_at - started)
                tpot = (last_token_at - first_token_at) / (tokens - 1) if tokens > 1 else 0.0
                if tokens > 1:
                    self.metrics.tpot.observe(tpot)
                if (
                    status in ("STOP", "LENGTH")
                    and first_token_at - started <= self.slo_ttft_s
                    and tpot <= self.slo_tpot_s
                ):
                    self.metrics.slo_met.inc()

    def _within_rate(self, tenant: str) -> None:
        """Take the request from its tenant's bucket, or refuse it (RateLimited, counted)."""
        try:
            self.rate_limit.check(tenant)
        except RateLimited:
            self.metrics.router_rate_limited.inc()
            raise

    def _count(self, final) -> None:
        self.metrics.prompt_tokens.inc(final.usage.prompt_tokens)
        self.metrics.generation_tokens.inc(final.usage.completion_tokens)
        self.metrics.cached_tokens.inc(final.usage.cached_tokens)

    def _generate(self, request, context):
        self._resolve_adapter(request)
        calls = self._tool_call_stream(request.chat) if request.WhichOneof("prompt") == "chat" else None
        if calls is not None and calls.forced:
            self._constrain_forced_call(request)
        prompt_ids = self._prompt_ids(request)
        params = sampling_from_pb(request.sampling)  # validated here, before any worker is involved
        # The client's request_id is only a label, echoed back: workers key the request by an id of
        # our own, so one client can neither collide with nor reach (Release, abort) another's request.
        request_id = secrets.token_hex(16)
        label = request.request_id or request_id
        detokenizer = None
        if self.tokenizer is not None:  # with tool calls, their marker tokens stay in the text to parse
            markers = tool_call_format(self.config.family).markers if calls is not None else ()
            keep = frozenset(i for i in map(self.tokenizer.token_to_id, markers) if i is not None)
            detokenizer = IncrementalDetokenizer(
                self.tokenizer, skip_special_tokens=True, keep_token_ids=keep
            )
        text, stops, generated, route = "", tuple(params.stop), 0, generation_pb2.Route()
        messages = self.dispatcher.run(request_id, prompt_ids, request, context, route)
        try:
            for message in messages:
                message.request_id = label
                generated += len(message.token_ids)
                if detokenizer is not None:
                    piece = "".join(detokenizer.push(token) for token in message.token_ids)
                    if message.finish_reason:
                        piece += detokenizer.flush()
                    hit = stop_cut(text + piece, stops)
                    if hit is not None:  # a stop string: end here (closing the stream stops decode)
                        piece = (text + piece)[len(text) : hit]
                        message.finish_reason = generation_pb2.FINISH_REASON_STOP
                        message.route.CopyFrom(route)
                        message.usage.prompt_tokens = len(prompt_ids)
                        message.usage.completion_tokens = generated
                    text += piece  # stop strings are searched in the raw text, markers included
                    if calls is not None:
                        piece, deltas = calls.feed(piece, final=bool(message.finish_reason))
                        message.tool_calls.extend(deltas)
                        if message.finish_reason == generation_pb2.FINISH_REASON_STOP and calls.called:
                            message.finish_reason = generation_pb2.FINISH_REASON_TOOL_CALLS
                    message.text = piece
                    if hit is not None:
                        yield message
                        return
                yield message
        finally:
            messages.close()

    def _constrain_forced_call(self, request) -> None:
        """A forced ``tool_choice`` (required or named): the call's arguments must follow the function's
        parameters schema, so the request's structured output becomes the call's grammar
        (``common/tool_calls/call_grammar.py``; the prompt already ends with the call's opening)."""
        if request.sampling.HasField("structured_output"):
            raise FieldError(
                "sampling.structured_output",
                "a forced chat.tool_choice constrains the output to the call; leave structured output out",
            )
        if self.tokenizer is None:
            raise FieldError("chat.tool_choice", "forcing a call needs the model's tokenizer")
        chat = request.chat
        named = chat.tool_choice.mode == generation_pb2.ToolChoice.MODE_FUNCTION
        grammar = forced_call_grammar(
            tool_call_format(self.config.family),
            template_parameters(chat),
            chat.tool_choice.function_name if named else None,
            self.tokenizer.token_to_id,
        )
        request.sampling.structured_output.grammar = grammar

    def _tool_call_stream(self, chat) -> ToolCallStream | None:
        """The parser of a chat with tools (None without tools, or with ``MODE_NONE``). A family without
        a tool-call parser refuses ``chat.tools``."""
        if not chat.tools:
            return None
        if not has_tool_calls(self.config.family):
            raise FieldError("chat.tools", f"model family {self.config.family!r} has no tool-call parser")
        if chat.tool_choice.mode == generation_pb2.ToolChoice.MODE_NONE:
            return None
        return ToolCallStream(tool_call_format(self.config.family), chat.tool_choice, chat.single_tool_call)

    def Tokenize(self, request, context):
        if self.tokenizer is None:
            raise ValueError("text: this model has no tokenizer; send token ids")
        check_tokenize(request)
        if request.WhichOneof("input") == "chat":
            chat = request.chat
            ids = self.tokenizer.encode(self._chat_text(chat, chat.add_generation_prompt))
        else:
            ids = self.tokenizer.encode(request.text, add_special_tokens=True)
        return generation_pb2.TokenizeResponse(token_ids=ids)

    def ListModels(self, request, context):
        base = dict(family=self.config.family, max_model_len=self.max_model_len)
        models = [generation_pb2.ModelInfo(id=self.model_id, **base)]
        models += [
            generation_pb2.ModelInfo(id=name, parent=self.model_id, **base)
            for name in sorted(self.dispatcher.pool.adapters())
        ]
        return generation_pb2.ListModelsResponse(models=models)

    def _resolve_adapter(self, request) -> None:
        """Check ``model`` and ``adapter``; a ``model`` naming a loaded LoRA adapter (the OpenAI front's
        way to pick one) selects it. Known adapters: those the workers' load feeds report, so one
        loaded a moment ago may be unknown until the worker's next update."""
        names_base = not request.model or request.model == self.model_id
        if names_base and not request.adapter:
            return  # the base model: no adapter to look up
        loaded = self.dispatcher.pool.adapters()
        if not names_base:
            if request.model not in loaded:
                served = ", ".join([self.model_id, *sorted(loaded)])
                raise ValueError(f"model: {request.model!r} is not served here (serving {served})")
            if request.adapter and request.adapter != request.model:
                raise ValueError(f"adapter: {request.adapter!r} contradicts model {request.model!r}")
            request.adapter = request.model
        if request.adapter and request.adapter not in loaded:
            names = ", ".join(sorted(loaded)) or "none"
            raise ValueError(f"adapter: {request.adapter!r} is not loaded on any worker (loaded: {names})")

    def _chat_text(self, chat, add_generation_prompt: bool) -> str:
        """The chat rendered with its tools; with a forced ``tool_choice`` the generation prompt goes on
        with the opening of a call (``ToolCallStream.prefix``)."""
        text = self.tokenizer.apply_chat_template(
            template_messages(chat), template_tools(chat), add_generation_prompt=add_generation_prompt
        )
        calls = self._tool_call_stream(chat)
        return text + calls.prefix if calls is not None and add_generation_prompt else text

    def _prompt_ids(self, request) -> list[int]:
        kind = request.WhichOneof("prompt")
        if kind is None:
            raise ValueError("prompt: give text, token_ids or chat")
        if kind == "token_ids":
            check_prompt_tokens(len(request.token_ids.ids), "token_ids", self.max_model_len)
            ids = list(request.token_ids.ids)
            for position, token in enumerate(ids):
                if token >= self.config.vocab_size:
                    raise ValueError(
                        f"token_ids: id {token} at position {position} is outside the vocabulary "
                        f"[0, {self.config.vocab_size})"
                    )
        elif self.tokenizer is None:
            raise ValueError(f"{kind}: this model has no tokenizer; send token_ids")
        elif kind == "text":
            ids = self.tokenizer.encode(request.text, add_special_tokens=True)
        else:  # rendered, then bounded by its bytes before the (costlier) tokenization
            text = self._chat_text(request.chat, add_generation_prompt=True)
            check_prompt_bytes(utf8_bytes(text, "chat"), "chat", self.max_token_bytes, self.max_model_len)
            ids = self.tokenizer.encode(text)
        if not ids:
            raise ValueError(f"{kind}: the prompt is empty")
        check_prompt_tokens(len(ids), kind, self.max_model_len)
        return ids


def _deadline_passed(context) -> bool:
    """The call ended at its deadline: the client's own timer may cancel it a moment before ours."""
    remaining = context.time_remaining()
    return remaining is not None and remaining <= _DEADLINE_SLACK_S
