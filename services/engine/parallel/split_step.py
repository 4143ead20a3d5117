"""An engine step on a rank of a PCP or PP layout: how every rank (rank 0 included) runs the step rank 0
broadcast, and how the logits reach rank 0, which samples.

- PCP (``pp = 1``): a step with several new tokens for some sequence (a prefill chunk, or a chunk beside
  decodes) is split over the PCP ranks (``pcp_prefill.pcp_forward_step``: zigzag pieces, the MLA rows
  and KDA state exchanged, the logits gathered to every PCP rank). A decode step (one new token per
  sequence) runs whole on every PCP rank: each holds the full cache, the zigzag would put every token on
  PCP rank 0 anyway (its first chunk) and the others would only join the exchanges, so the replicated
  forward costs no collective on the latency path and leaves the same cache on every rank.
- PP: every step goes through the stages (``PipelineStage.step``, each stage's PCP ranks splitting it
  when ``pcp > 1``). Rank 0 is stage 0 (``layout.py``'s rank order), so the last stage's rank of rank
  0's ``pp_group`` sends the logits back to it. One step is in flight at a time: the stages do not
  overlap across engine steps (the engine samples each step before scheduling the next).
- DCP inside either: each PCP rank's or stage's DCP group holds its shard of the cache and runs DCP
  attention (``pcp_cache``: gathered rows kept by DCP owner); a decode step replicated over the PCP
  ranks is a DCP decode on each.
"""

import torch
import torch.distributed as dist

from services.engine.model.causal_lm import CausalLM
from services.engine.model.layer_cache import ModelCache
from services.engine.model.step_metadata import SequenceStep, build_step_metadata

from .pcp_prefill import pcp_forward_step
from .pipeline import PipelineStage


class SplitStep:
    """Runs each engine step of one PCP / PP rank.

    Args:
        model: this rank's model (under PP: its stage's modules only).
        block_size: tokens a block id covers (``CacheManager.block_tokens``: under DCP the virtual
            ``dcp * B``, so the steps' metadata is DCP's).
    """

    def __init__(self, model: CausalLM, block_size: int):
        self.model, self.block_size = model, block_size
        self.parallel = model.parallel
        self.stage = PipelineStage.build(model, self.parallel) if self.parallel.layout.pp > 1 else None

    def forward(
        self, steps: list[SequenceStep], logit_rows: list[int], cache: ModelCache
    ) -> torch.Tensor | None:
        """Run the step on this rank, writing its layers' rows into ``cache``.

        Returns:
            ``[len(logit_rows), vocab]`` logits on rank 0 (and on the other ranks that compute them);
            None on a PP rank that does not.
        """
        if self.stage is None:
            if all(len(step.token_ids) == 1 for step in steps):  # decode: replicated (module docstring)
                device = self.model.device
                meta = build_step_metadata(steps, self.block_size, device, logit_rows, self.model.index_topk)
                return self.model.forward_step(meta, cache)
            return pcp_forward_step(self.model, steps, self.block_size, cache, self.parallel, logit_rows)
        logits = self.stage.step(steps, self.block_size, cache, logit_rows)
        return self._to_rank_0(logits, len(logit_rows))

    def _to_rank_0(self, logits: torch.Tensor | None, rows: int) -> torch.Tensor | None:
        """The last stage's logits, sent to rank 0 by the last stage's rank of rank 0's ``pp_group``."""
        group = self.parallel.pp_group
        ranks = dist.get_process_group_ranks(group)
        if ranks[0] != 0 or rows == 0:
            return logits
        if self.parallel.rank == 0:
            vocab, dtype, device = self.model.config.vocab_size, self.model.dtype, self.model.device
            received = torch.empty(rows, vocab, dtype=dtype, device=device)
            dist.recv(received, ranks[-1], group=group)
            return received
        if self.stage.is_last:
            dist.send(logits.contiguous(), 0, group=group)
        return logits
