"""A request's engine-side state and the result type handed back to callers."""

import enum
import time
from dataclasses import dataclass, field

from services.engine.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RESERVED = "reserved"  # decode side: room held, prompt state being written by a prefill worker
    RUNNING = "running"
    HELD = "held"  # prefill side: finished, cache kept until its state has been sent
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len
    ABORT = "abort"  # cancelled by the caller


@dataclass
class Request:
    """One generation request as the scheduler sees it.

    ``num_computed`` tokens of ``all_ids`` are in the cache; the rest (the prompt's remainder, or the
    last sampled token) still have to run through the model.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    block_table: list[int] = field(default_factory=list)
    slot: int | None = None
    num_computed: int = 0
    cache_root: bytes = b""  # prefix-cache chain salt: model, adapter, tenant
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered: int = 0  # leading blocks registered in the prefix cache
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    hold_cache: bool = False  # prefill side: keep blocks and slot after finishing, for the handoff
    arrival_time: float = field(default_factory=time.monotonic)
    queue_seconds: float | None = None  # arrival to first scheduled step; None until then

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return self.num_tokens - self.num_computed


@dataclass(frozen=True)
class RequestOutput:
    """What a finished (or streamed) request returns.

    ``logprobs[i]`` is the raw-model log-probability of ``token_ids[i]`` (None when not requested);
    ``top_logprobs[i]`` lists ``(token id, logprob)`` alternatives when requested.
    """

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: str | None
    num_cached_tokens: int = 0
