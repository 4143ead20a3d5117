"""Runs one scheduled step: builds the flattened batch, runs the model on the paged cache, samples."""

import torch

from services.engine.cache.paged_cache import PagedModelCache, SequenceCacheRef
from services.engine.model.causal_lm import CausalLM
from services.engine.model.forward_batch import ForwardBatch
from services.engine.sampling import sample

from .cache_manager import CacheManager
from .request import Request
from .scheduler import SampledToken, SchedulerOutput


class ModelRunner:
    """Executes ``SchedulerOutput``s for one model on one device.

    Args:
        model: the loaded model.
        cache: the pools the scheduler allocated from.
    """

    def __init__(self, model: CausalLM, cache: CacheManager):
        self.model = model
        self.cache = cache
        self.device = cache.blocks.storage.device
        self.dtype = model.lm_head.weight.dtype

    @torch.no_grad()
    def execute(self, output: SchedulerOutput, requests: dict[str, Request]) -> dict[str, SampledToken]:
        """Run the step's chunks and sample for those that end at their request's last token.

        Returns:
            ``request_id -> SampledToken`` for every sampling chunk.
        """
        chunks = output.chunks
        batch = ForwardBatch.build([list(c.token_ids) for c in chunks], [c.past for c in chunks], self.device)
        refs = [SequenceCacheRef(c.block_table, c.slot, c.past) for c in chunks]
        paged = PagedModelCache(self.cache.blocks, self.cache.slots, refs, self.model.config, self.dtype)
        sampling = [i for i, chunk in enumerate(chunks) if chunk.samples]
        logits = self.model.forward_batch(batch, paged, batch.last_rows()[sampling])
        if not sampling:
            return {}
        picked = [requests[chunks[i].request_id] for i in sampling]
        result = sample(logits, [r.params for r in picked], [r.sample_position for r in picked])
        return {
            request.request_id: SampledToken(
                token_id=result.token_ids[j], logprob=result.logprobs[j], top_logprobs=result.top_logprobs[j]
            )
            for j, request in enumerate(picked)
        }
