"""Runs one scheduled step: builds the step's metadata once, runs the model on the paged cache, samples."""

import itertools

import torch

from services.engine.adapters.registry import AdapterRegistry
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.model.causal_lm import CausalLM
from services.engine.model.step_metadata import SequenceStep, build_step_metadata
from services.engine.parallel.rank_group import RankGroup
from services.engine.parallel.rank_step import RankStep
from services.engine.parallel.split_step import SplitStep

from .cache_manager import CacheManager
from .cuda_graphs import DecodeGraphs
from .request import Request
from .sampling.grammar import apply_grammars
from .sampling.penalties import apply_penalties
from .sampling.sampler import SampleOutput
from .scheduler import SampledToken, SchedulerOutput
from .speculative.acceptance import Verified, verify, verify_greedy


class ModelRunner:
    """Executes ``SchedulerOutput``s for one model on one device.

    Args:
        model: the loaded model (its kernel backends already chosen).
        cache: the pools the scheduler allocated from.
        graphs: captured decode graphs, or None to run every step eagerly.
        ranks: a parallel engine's rank group (rank 0 here): each step is broadcast to its followers
            before the forward; None on one rank.
    """

    def __init__(
        self,
        model: CausalLM,
        cache: CacheManager,
        graphs: DecodeGraphs | None = None,
        adapters: AdapterRegistry | None = None,
        ranks: RankGroup | None = None,
    ):
        self.model = model
        self.ranks = ranks
        self.adapters = adapters
        self.cache = cache
        self.device = cache.blocks.storage.device
        self.paged = PagedModelCache(cache.blocks, cache.slots, model.config, model.dtype)
        self.graphs = graphs
        # captured verify graphs by draft count k (--kda-rollback states; set by the engine after
        # capture): empty, every verify step runs eagerly
        self.verify_graphs: dict[int, DecodeGraphs] = {}
        layout = model.parallel.layout
        # under PCP or PP every rank runs its part of each step
        self.split = SplitStep(model, cache.block_tokens) if layout.pcp * layout.pp > 1 else None

    @torch.no_grad()
    def execute(
        self, output: SchedulerOutput, requests: dict[str, Request]
    ) -> dict[str, SampledToken | Verified]:
        """Run the step's chunks and sample for those that end at their request's last token; verify
        the drafts of verify chunks (``num_draft > 0``: logits of their last ``1 + k`` rows,
        ``acceptance.verify``).

        Returns:
            ``request_id -> SampledToken`` for every plain sampling chunk, ``-> Verified`` for every
            verify chunk.
        """
        chunks = output.chunks
        adapters = [self._adapter_slot(requests[c.request_id]) for c in chunks]
        steps = [
            SequenceStep(
                c.token_ids,
                c.past,
                c.block_table,
                c.slot,
                adapter,
                num_draft=c.num_draft,
                **self._rollback_slots(requests[c.request_id], c.num_draft),
            )
            for c, adapter in zip(chunks, adapters, strict=True)
        ]
        if any(chunk.num_draft for chunk in chunks):
            return self._verify_step(output, requests, steps, adapted=any(adapters))
        sampling = [i for i, chunk in enumerate(chunks) if chunk.samples]
        picked = [requests[chunks[i].request_id] for i in sampling]
        params = [r.params for r in picked]
        positions = [r.sample_position for r in picked]
        # Decode graphs are captured without adapters (a step with an adapted row runs eagerly) and
        # sample every row from its raw logits: rows with logit bias, penalties or a grammar's mask are
        # sampled again from the graph's logits after processing, the others keep the graph's tokens.
        if self.graphs is not None and not any(adapters) and self.graphs.can_replay(steps, len(sampling)):
            result = self.graphs.replay(steps, params, positions)
            processed = [j for j, p in enumerate(params) if p.processes_logits or p.constrained]
            if processed:
                result = self._resampled(result, self.graphs.logits(len(steps)), processed, picked, positions)
        else:
            ends = list(itertools.accumulate(len(step.token_ids) for step in steps))
            logit_rows = [ends[i] - 1 for i in sampling]
            if self.ranks is None:
                logits = self.forward(steps, logit_rows)
            else:  # the followers run the same forward on their shards
                self.ranks.send(RankStep(self.cache.take_state_copies(), tuple(steps), tuple(logit_rows)))
                try:
                    logits = self.forward(steps, logit_rows)
                except Exception as error:  # the followers may wait in a collective this rank left
                    self.ranks.take_down(f"rank 0's forward failed ({error!r})")
            if not sampling:
                return {}
            result = self.model.kernels.sampling.sample(_processed(logits, picked), params, positions)
        return {
            request.request_id: SampledToken(
                token_id=result.token_ids[j], logprob=result.logprobs[j], top_logprobs=result.top_logprobs[j]
            )
            for j, request in enumerate(picked)
        }

    def _resampled(
        self,
        result: SampleOutput,
        logits: torch.Tensor,
        rows: list[int],
        picked: list[Request],
        positions: list[int],
    ) -> SampleOutput:
        """A replayed step's ``result`` with ``rows`` sampled again from their logits rows
        (the graph's static ``logits``, a row per sequence in step order) processed by their requests'
        bias, penalties and grammars: the tokens and log-probs of the eager path, whose forward the
        graph's equals."""
        requests = [picked[j] for j in rows]
        index = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)
        again = self.model.kernels.sampling.sample(
            _processed(logits.index_select(0, index), requests),
            [r.params for r in requests],
            [positions[j] for j in rows],
        )
        merged = SampleOutput(list(result.token_ids), list(result.logprobs), list(result.top_logprobs))
        for k, j in enumerate(rows):
            merged.token_ids[j] = again.token_ids[k]
            merged.logprobs[j] = again.logprobs[k]
            merged.top_logprobs[j] = again.top_logprobs[k]
        return merged

    def _verify_step(
        self, output: SchedulerOutput, requests: dict[str, Request], steps: list[SequenceStep], adapted: bool
    ) -> dict[str, SampledToken | Verified]:
        """A step with verify chunks: one logits row per plain sampling chunk, ``1 + k`` per verify
        chunk; the plain rows are sampled together, the greedy verify chunks' rows verified together,
        each sampled verify chunk's alone. A step of verify chunks only, each ``1 + k`` tokens, replays
        the verify graph of ``k`` when there is one (no adapted rows: graphs are captured without)."""
        ends = list(itertools.accumulate(len(step.token_ids) for step in steps))
        plain = [i for i, chunk in enumerate(output.chunks) if chunk.samples and not chunk.num_draft]
        verifying = [i for i, chunk in enumerate(output.chunks) if chunk.num_draft]
        plain_rows = [ends[i] - 1 for i in plain]
        verify_rows = [list(range(ends[i] - 1 - output.chunks[i].num_draft, ends[i])) for i in verifying]
        rows = plain_rows + [row for rows in verify_rows for row in rows]
        graphs = self.verify_graphs.get(steps[0].num_draft)
        if graphs is not None and not adapted and graphs.can_replay(steps, len(rows)):
            logits = graphs.replay_logits(steps)  # every row, in step order: the verify rows exactly
        else:
            logits = self.forward(steps, rows)
        results: dict[str, SampledToken | Verified] = {}
        if plain:
            picked = [requests[output.chunks[i].request_id] for i in plain]
            sampled = self.model.kernels.sampling.sample(
                _processed(logits[: len(plain)], picked),
                [r.params for r in picked],
                [r.sample_position for r in picked],
            )
            for j, request in enumerate(picked):
                results[request.request_id] = SampledToken(
                    sampled.token_ids[j], sampled.logprobs[j], sampled.top_logprobs[j]
                )
        greedy: list[tuple[Request, torch.Tensor]] = []
        start = len(plain)
        for i, rows in zip(verifying, verify_rows, strict=True):
            request = requests[output.chunks[i].request_id]  # never penalised or constrained: no drafts
            request_logits = logits[start : start + len(rows)]
            start += len(rows)
            if request.params.greedy:  # verified together below: one sampling call for the step
                greedy.append((request, request_logits))
                continue
            results[request.request_id] = verify(
                request_logits,
                output.drafts[request.request_id],
                request.params,
                request.sample_position,
                self.model.kernels.sampling,
            )
        if greedy:
            verified = verify_greedy(
                [rows for _, rows in greedy],
                [output.drafts[request.request_id] for request, _ in greedy],
                [request.params for request, _ in greedy],
                [request.sample_position for request, _ in greedy],
                self.model.kernels.sampling,
            )
            results.update((request.request_id, v) for (request, _), v in zip(greedy, verified, strict=True))
        return results

    def forward(self, steps: list[SequenceStep], logit_rows: list[int]) -> torch.Tensor | None:
        """Build the step's metadata and run the model on the paged cache (no sampling): rank 0's
        eager steps, and every step of a follower rank.

        Returns:
            ``[len(logit_rows), vocab]`` logits (None on a pipeline stage's rank that does not get them).
        """
        if self.split is not None:
            return self.split.forward(steps, logit_rows, self.paged)
        meta = build_step_metadata(
            steps,
            self.cache.block_tokens,
            self.device,
            logit_rows=logit_rows,
            index_topk=self.model.index_topk,
        )
        table = self.adapters.table if self.adapters is not None else None
        return self.model.forward_step(meta, self.paged, table)

    def _rollback_slots(self, request: Request, num_draft: int) -> dict:
        """A verify chunk's KDA rollback slots for its ``SequenceStep``: the checkpoint slot (``replay``)
        or a slot per draft (``states``); none for a plain chunk."""
        if not num_draft:
            return {}
        if self.cache.rollback_mode == "states":
            return {"draft_slots": tuple(request.spec_slots[:num_draft])}
        return {"checkpoint_slot": request.spec_slots[0]}

    def _adapter_slot(self, request: Request) -> int:
        if not request.adapter:
            return 0
        if self.adapters is None:
            raise ValueError(f"adapter: {request.adapter!r} requested but this runner has no adapters")
        return self.adapters.slot(request.adapter)


def _processed(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """The rows to sample from: bias and penalties first, then the grammars' masks (a bias cannot
    bring back a token the grammar forbids)."""
    return apply_grammars(apply_penalties(logits, requests), requests)
