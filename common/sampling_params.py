"""Per-request sampling parameters (field names and defaults as in vLLM's `SamplingParams`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from common.structured_output import StructuredOutput

# Temperatures below this are treated as greedy, as in vLLM: dividing logits by a tiny temperature
# overflows float32 and the resulting distribution is an argmax anyway.
GREEDY_TEMPERATURE_EPS = 1e-5
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries in one request's logit_bias (OpenAI's limit)
LOGIT_BIAS_LIMIT = 100.0  # |bias| at most this (OpenAI's range)
PENALTY_LIMIT = 2.0  # |presence_penalty|, |frequency_penalty| at most this (OpenAI's range)
_SEED_LIMIT = 2**63


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next tokens of one request, and when to stop.

    Attributes:
        max_tokens: most tokens to generate (>= 1).
        temperature: logits are divided by it; 0 (or anything below `GREEDY_TEMPERATURE_EPS`)
            means greedy, in which case top_k, top_p and min_p are ignored.
        top_k: keep only the k most likely tokens (ties at the k-th value are all kept); 0 = off.
        top_p: keep the smallest set of most likely tokens whose probability sums to >= top_p.
        min_p: drop tokens whose probability is below ``min_p * max_prob``; 0 = off.
        seed: makes sampling reproducible: the token at position p depends only on the request's
            logits row, these params, the seed and p. None = fresh randomness at every step.
        stop: strings that end generation when they appear in the output text.
        stop_token_ids: token ids that end generation (in addition to EOS unless `ignore_eos`).
        ignore_eos: keep generating past the EOS token.
        logprobs: None = no logprobs; 0 = logprob of the sampled token; n > 0 = also the n most
            likely tokens. Logprobs are of the model's distribution after `logit_bias` and the
            penalties (vLLM v0's "processed" logprobs) and before temperature, top-k, top-p, min-p;
            without bias and penalties that is the raw model distribution.
        include_stop_str_in_output: keep the matched stop string at the end of the output text.
        logit_bias: ``(token id, bias)`` pairs (a dict is accepted and stored sorted by id); the
            bias is added to that token's logit before sampling. Ids must be in the model's
            vocabulary (the engine checks), biases in [-100, 100], at most 300 entries.
        presence_penalty: in [-2, 2]; subtracted from the logit of every token that appears in the
            generated output so far (positive: fewer repeats). 0 = off.
        frequency_penalty: in [-2, 2]; ``frequency_penalty * count`` is subtracted, ``count`` the
            token's occurrences in the generated output so far. 0 = off.
        repetition_penalty: > 0; the logit of every token that appears in the prompt or the output
            is divided by it when positive and multiplied by it when negative (> 1: fewer repeats).
            1 = off.
        structured_output: None, or what the output must match (``common/structured_output.py``):
            each step samples only tokens its grammar allows, EOS only where it accepts, and the
            request stops when the grammar can go no further. Logprobs are then of the masked
            distribution. Such requests do not draft.

    Bias and penalties are applied in vLLM's order: bias, repetition, frequency, presence
    (``kernels.logit_penalties``). A migrated request's resumed tokens count as output.
    Lists given for `stop` and `stop_token_ids` are stored as tuples, so params are hashable.
    Invalid values raise ValueError with a message that starts with the field name.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    structured_output: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            raise ValueError(f"stop: must be a sequence of strings, not one string, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens!r}")
        if not _is_real(self.temperature) or not self.temperature >= 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature!r}")
        if not math.isfinite(self.temperature):
            raise ValueError(f"temperature: must be finite, got {self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k: must be >= 0 (0 = off), got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p: must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < _SEED_LIMIT):
            raise ValueError(f"seed: must be an integer in [0, 2**63) or None, got {self.seed!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop: stop strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids: must be non-negative integers, got {t!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: must be a bool, got {self.ignore_eos!r}")
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise ValueError(f"logprobs: must be between 0 and {MAX_LOGPROBS} or None, got {self.logprobs!r}")
        if not isinstance(self.include_stop_str_in_output, bool):
            raise ValueError(
                f"include_stop_str_in_output: must be a bool, got {self.include_stop_str_in_output!r}"
            )
        object.__setattr__(self, "logit_bias", _checked_logit_bias(self.logit_bias))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
                raise ValueError(f"{name}: must be a number in [-2, 2] (0 = off), got {value!r}")
        penalty = self.repetition_penalty
        if not _is_real(penalty) or not math.isfinite(penalty) or not penalty > 0:
            raise ValueError(f"repetition_penalty: must be a finite number > 0 (1 = off), got {penalty!r}")
        constraint = self.structured_output
        if constraint is not None and not isinstance(constraint, StructuredOutput):
            raise ValueError(
                f"structured_output: must be a StructuredOutput or None, got {type(constraint).__name__}"
            )

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax of the logits (no randomness)."""
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def constrained(self) -> bool:
        """True when a grammar masks the logits before sampling (``structured_output``)."""
        return self.structured_output is not None

    @property
    def processes_logits(self) -> bool:
        """True when `logit_bias` or a penalty changes the logits before sampling."""
        return (
            bool(self.logit_bias)
            or bool(self.presence_penalty)
            or bool(self.frequency_penalty)
            or (self.repetition_penalty != 1.0)
        )


def _checked_logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted ``(id, bias)`` pairs; ValueError naming ``logit_bias`` otherwise."""
    if isinstance(value, Mapping):
        value = tuple(value.items())
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise ValueError(f"logit_bias: must be a mapping of token id to bias, got {value!r}")
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias: {len(value)} entries, more than the limit of {MAX_LOGIT_BIAS}")
    pairs = []
    for pair in value:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"logit_bias: entries must be (token id, bias) pairs, got {pair!r}")
        token, bias = pair
        if not _is_int(token) or token < 0:
            raise ValueError(f"logit_bias: keys must be token ids (integers >= 0), got {token!r}")
        if not _is_real(bias) or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            raise ValueError(f"logit_bias: bias of token {token} must be in [-100, 100], got {bias!r}")
        pairs.append((token, float(bias)))
    pairs.sort()
    if any(a[0] == b[0] for a, b in zip(pairs[:-1], pairs[1:], strict=True)):
        raise ValueError("logit_bias: a token id appears twice")
    return tuple(pairs)
