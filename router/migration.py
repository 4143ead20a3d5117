"""A request whose decode worker is lost mid-stream moves to another one, on the same client stream.

    client ◀── t0 … tk ──── router ◀══ decode A   ✗ killed, restarted, or drained past its grace
                              │
                              └─ prompt + t0 … tk (resumed_tokens = k+1) ─▶ reserve ─▶ prefill ─▶ decode B
    client ◀── tk+1 … ───── router ◀══ decode B

The move is an ordinary request through ``Dispatcher.run``: its prompt is the original prompt followed
by every token already passed to the client, its ``max_tokens`` what is left of the original, and its
seeded sampling continues at the position where the first attempt stopped (the sampler draws by
(seed, position)). So the client sees each token once, none missing, and a greedy or seeded stream
goes on with the tokens an undisturbed run would have given: bitwise in batch-invariant mode; in the
default mode a recomputed prefix may round differently, as any prefill does. Stop strings need
nothing here: the router's detokenizer sees one continuous stream; stop token ids and EOS apply to
new tokens only, as before (a streamed token that stopped would have ended the stream).

The final message's usage is the whole request's (original prompt, every generated token), and its
route names the decode worker that finished it. ``GenerateRequest.no_migration`` opts out: the
client then gets UNAVAILABLE, as it would without this module.
"""

import logging

from common.metrics import Metrics
from common.sampling_pb import sampling_from_pb
from proto.baton.v1 import generation_pb2

from .dispatch import DecodeLost, Dispatcher

log = logging.getLogger(__name__)
MIGRATION_OUTCOMES = ("migrated", "failed", "opted_out")


class Migrator:
    """``Dispatcher.run`` with migration; the servicer calls ``run`` as it would the dispatcher's.

    Args:
        dispatcher: the worker flow (reserve, prefill, decode).
        metrics: the router's metrics (``baton_migrations_total{outcome}``).
        max_migrations: moves per request at most; a further loss fails it with UNAVAILABLE.
    """

    def __init__(self, dispatcher: Dispatcher, metrics: Metrics, max_migrations: int = 3):
        if max_migrations < 0:
            raise ValueError(f"max_migrations: must be >= 0, got {max_migrations}")
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.max_migrations = max_migrations

    @property
    def pool(self):
        """The dispatcher's workers (what the servicer reads the loaded adapters from)."""
        return self.dispatcher.pool

    def run(self, request_id: str, prompt_ids: list[int], request, context, route: generation_pb2.Route):
        """Yield one request's messages (as ``Dispatcher.run``), moving it when its decode stream breaks.

        A move counts as ``migrated`` once the new decode worker's first message arrives, ``failed``
        when no worker could take it over (its error reaches the caller), ``opted_out`` when the
        request asked for no migration.
        """
        max_tokens = sampling_from_pb(request.sampling).max_tokens
        streamed: list[int] = []  # tokens already passed to the caller, in order
        attempt, moves, moving = request, 0, False
        answered = False  # a first message (with any prompt log-probs) reached the caller
        while True:
            worker_id = request_id if not moves else f"{request_id}.m{moves}"
            messages = self.dispatcher.run(
                worker_id, prompt_ids + streamed, attempt, context, route, resumed_tokens=len(streamed)
            )
            resumed = len(streamed)
            try:
                for message in messages:
                    if moving:
                        self.metrics.migrations.labels("migrated").inc()
                        moving = False
                    streamed.extend(message.token_ids)
                    answered = True
                    if message.finish_reason and resumed:
                        _whole_usage(message.usage, len(prompt_ids), resumed)
                    yield message
                return
            except DecodeLost as lost:
                if not context.is_active():
                    raise  # the client has gone: nothing to move
                if request.no_migration:
                    self.metrics.migrations.labels("opted_out").inc()
                    raise
                left = max_tokens - len(streamed)
                if moves >= self.max_migrations or left < 1:
                    self.metrics.migrations.labels("failed").inc()
                    raise
                log.warning(
                    "request %s: decode stream lost after %d tokens (%s); moving it",
                    request_id,
                    len(streamed),
                    lost,
                )
            except Exception:
                if moving:
                    self.metrics.migrations.labels("failed").inc()
                raise
            finally:
                messages.close()
            moves, moving = moves + 1, True
            attempt = _rest_of(request, left, keep_prompt_logprobs=not answered)
            route.Clear()  # the next attempt fills in its own workers


def _rest_of(request, max_tokens: int, keep_prompt_logprobs: bool):
    """``request`` with only ``max_tokens`` (>= 1) left to generate; its ``prompt_logprobs`` only while
    the caller has not had them (the next attempt's prompt then is still the request's own)."""
    rest = generation_pb2.GenerateRequest()
    rest.CopyFrom(request)
    rest.sampling.max_tokens = max_tokens
    if not keep_prompt_logprobs:
        rest.ClearField("prompt_logprobs")
    return rest


def _whole_usage(usage: generation_pb2.Usage, prompt_tokens: int, resumed: int) -> None:
    """A resumed attempt's usage (its prompt includes ``resumed`` generated tokens) as the request's."""
    usage.completion_tokens += resumed
    usage.prompt_tokens = prompt_tokens
    usage.cached_tokens = min(usage.cached_tokens, prompt_tokens)
    usage.cached_tokens_host = min(usage.cached_tokens_host, usage.cached_tokens)
