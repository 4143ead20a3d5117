"""``LLM``: the offline Python API over one engine (generate a list of prompts to completion)."""

from dataclasses import dataclass, field

from common.sampling_params import SamplingParams
from common.stop_strings import stop_cut
from common.tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerNotFoundError
from services.engine.model.causal_lm import CausalLM

from .engine_config import EngineConfig
from .engine_core import EngineCore
from .request import FinishReason, Request, RequestOutput
from .scoring import ScoreItem, score_tokens
from .speculative.proposal import DraftProposer

Prompt = str | list[int] | dict


@dataclass
class _Stream:
    """Text decoded so far for one request, for stop strings and the final ``text``."""

    detokenizer: IncrementalDetokenizer | None
    text: str = ""
    stopped_by_string: bool = False
    consumed: int = field(default=0)


class LLM:
    """Generate with a Baton engine in-process.

    Args:
        model: checkpoint folder.
        device: ``cpu`` or ``cuda``.
        batch_invariant: bitwise-reproducible numerics whatever the batch.
        prebuilt: a model already on ``device`` (``build_random_model``); ``model`` then only names it.
        redis_url: the Redis of the L3 below the engine's own host tier (``redis_l3_gib``).
        proposer: speculative decoding's drafts (``EngineCore``'s ``proposer``); None: the draft model
            of ``draft_model``, if given.
        **engine_options: other ``EngineConfig`` fields (``max_num_seqs``, ``max_num_batched_tokens``,
            ``block_size``, ``num_blocks``, ``max_model_len``, ``dtype``).
    """

    def __init__(
        self,
        model: str,
        device: str = "cpu",
        batch_invariant: bool = False,
        prebuilt: CausalLM | None = None,
        redis_url: str = "",
        proposer: DraftProposer | None = None,
        **engine_options,
    ):
        self.config = EngineConfig(
            model=str(model), device=device, batch_invariant=batch_invariant, **engine_options
        )
        self.engine = EngineCore(self.config, prebuilt, redis_url=redis_url, proposer=proposer)
        self.tokenizer: Tokenizer | None = None
        if prebuilt is None:
            try:
                self.tokenizer = Tokenizer.from_pretrained(model)
            except TokenizerNotFoundError:
                pass

    def close(self) -> None:
        """Stop the engine's follower ranks (a parallel engine); idempotent, a no-op on one rank."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        params: SamplingParams | list[SamplingParams] | None = None,
        tenant: str = "",
        adapter: str | list[str] = "",
    ) -> list[RequestOutput]:
        """Run every prompt to completion.

        Args:
            prompts: text (needs the checkpoint's tokenizer), a list of token ids, or a dict with
                ``prompt`` or ``prompt_ids``; or a list of these.
            params: one ``SamplingParams`` for all, or one per prompt (default: ``SamplingParams()``).
            tenant: prefix-cache isolation: requests share cached prefixes only within a tenant.
            adapter: a loaded LoRA adapter's name for all prompts, or one per prompt ("": the base
                model); see ``load_adapter``.

        Returns:
            One ``RequestOutput`` per prompt, in order.

        Raises:
            ValueError: a malformed prompt or parameter, naming it; nothing is queued then.
        """
        batch = [prompts] if isinstance(prompts, (str, dict)) or _is_ids(prompts) else list(prompts)
        per_prompt = params if isinstance(params, list) else [params or SamplingParams()] * len(batch)
        if len(per_prompt) != len(batch):
            raise ValueError(f"params: {len(per_prompt)} given for {len(batch)} prompts")
        adapters = adapter if isinstance(adapter, list) else [adapter] * len(batch)
        if len(adapters) != len(batch):
            raise ValueError(f"adapter: {len(adapters)} given for {len(batch)} prompts")
        encoded = [self._encode(prompt, index) for index, prompt in enumerate(batch)]
        requests = []
        try:
            for index, (ids, sampling, name) in enumerate(zip(encoded, per_prompt, adapters, strict=True)):
                try:
                    requests.append(self.engine.add_request(ids, sampling, tenant=tenant, adapter=name))
                except ValueError as error:
                    raise ValueError(f"prompts[{index}].{error}") from None
        except ValueError:
            for request in requests:
                self.engine.abort(request.request_id)
            raise
        streams = {r.request_id: _Stream(self._detokenizer()) for r in requests}
        while self.engine.has_unfinished:
            self.engine.step()
            self._apply_stop_strings(requests, streams)
        return [self._output(request, streams[request.request_id]) for request in requests]

    def score(
        self, prompts: list[list[int]], continuations: list[list[int]], adapter: str | list[str] = ""
    ) -> list[list[float]]:
        """The log-probs of given continuations, from one prefill of prompt + continuation each
        (``services/engine/scoring.py``); no token is generated and the serving pools are not touched.

        Args:
            prompts: token ids of each context (at least one each).
            continuations: the tokens to score after each prompt (may be empty).
            adapter: a loaded adapter's name for all, or one per prompt ("": the base model).

        Returns:
            Per prompt, its continuation's log-probs: Python floats holding float32 values, the
            sampler's (``raw_logprobs``). In batch-invariant mode each has the bits the engine reports
            when it generates that token after that prompt.

        Raises:
            ValueError: mismatched lengths, an empty prompt, a sequence over ``max_model_len``, a token
                outside the vocabulary or an adapter not loaded, naming it.
        """
        if self.config.world_size > 1:
            raise ValueError(
                f"score: runs on one rank for now (its prefill is not an engine step that the "
                f"{self.config.world_size} ranks share); score with --tp 1"
            )
        adapters = adapter if isinstance(adapter, list) else [adapter] * len(prompts)
        if not len(prompts) == len(continuations) == len(adapters):
            raise ValueError(
                f"continuations, adapter: {len(continuations)} and {len(adapters)} given for "
                f"{len(prompts)} prompts"
            )
        items = []
        for index, (prompt, tokens, name) in enumerate(zip(prompts, continuations, adapters, strict=True)):
            if not prompt:
                raise ValueError(f"prompts[{index}]: needs at least one token")
            if len(prompt) + len(tokens) > self.config.max_model_len:
                raise ValueError(
                    f"prompts[{index}]: {len(prompt) + len(tokens)} tokens exceed max_model_len "
                    f"{self.config.max_model_len}"
                )
            items.append(ScoreItem(tuple(prompt), tuple(tokens), self.engine.adapters.slot(name)))
        table = self.engine.adapters.table
        return score_tokens(self.engine.model, items, table, self.config.max_num_batched_tokens)

    def load_adapter(self, name: str, folder: str) -> None:
        """Load a PEFT LoRA folder (``adapter_config.json`` + ``adapter_model.safetensors``) as ``name``."""
        self.engine.load_adapter(name, folder)

    def unload_adapter(self, name: str) -> None:
        """Unload ``name`` (refused while a request uses it)."""
        self.engine.unload_adapter(name)

    def _encode(self, prompt: Prompt, index: int) -> list[int]:
        if isinstance(prompt, dict):
            if "prompt_ids" in prompt:
                prompt = prompt["prompt_ids"]
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError(f"prompts[{index}]: needs 'prompt' or 'prompt_ids'")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    f"prompts[{index}]: text needs a tokenizer, and {self.config.model} has none"
                )
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        if not _is_ids(prompt):
            raise ValueError(f"prompts[{index}]: expected text or a list of token ids")
        return list(prompt)

    def _detokenizer(self) -> IncrementalDetokenizer | None:
        return IncrementalDetokenizer(self.tokenizer, skip_special_tokens=True) if self.tokenizer else None

    def _apply_stop_strings(self, requests: list[Request], streams: dict[str, _Stream]) -> None:
        for request in requests:
            stream = streams[request.request_id]
            if stream.detokenizer is None or stream.stopped_by_string:
                continue
            for token in request.output_ids[stream.consumed :]:
                stream.text += stream.detokenizer.push(token)
            stream.consumed = len(request.output_ids)
            end = stop_cut(stream.text, request.params.stop, request.params.include_stop_str_in_output)
            if end is not None:
                stream.text = stream.text[:end]
                stream.stopped_by_string = True
                if request.finish_reason is None:
                    self.engine.abort(request.request_id)
                request.finish_reason = FinishReason.STOP

    def _output(self, request: Request, stream: _Stream) -> RequestOutput:
        if stream.detokenizer is not None and not stream.stopped_by_string:
            stream.text += stream.detokenizer.flush()
        wants_logprobs = request.params.logprobs is not None
        return RequestOutput(
            request_id=request.request_id,
            prompt_ids=request.prompt_ids,
            token_ids=list(request.output_ids),
            text=stream.text,
            logprobs=list(request.logprobs) if wants_logprobs else None,
            top_logprobs=list(request.top_logprobs) if wants_logprobs and request.params.logprobs else None,
            finish_reason=request.finish_reason.value if request.finish_reason else None,
            num_cached_tokens=request.num_cached_tokens,
            num_cached_tokens_host=request.num_cached_tokens_host,
            num_draft_tokens=request.num_draft_tokens,
            num_accepted_draft_tokens=request.num_accepted_draft_tokens,
        )


def _is_ids(value) -> bool:
    """A non-empty list of ints (one tokenized prompt; an empty list is an empty batch)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(token, int) and not isinstance(token, bool) for token in value)
    )
