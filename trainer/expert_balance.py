"""Auxiliary-loss-free MoE load balancing for pretraining: each router's selection bias moved after a step.

The loss gives ``e_score_correction_bias`` no gradient (it only ranks experts, ``docs/trainer.md``), so
without this a freshly initialised MoE tends to route most tokens to a few experts. As in DeepSeek-V3,
after every optimizer step each MoE layer's bias is nudged by ``rate`` against its experts' load::

    bias_e -= rate * sign(count_e - mean(count))     (count_e: tokens routed to expert e this step)

so an overloaded expert ranks a little lower next step and an idle one a little higher; the routing
weights themselves are unchanged (the bias only ranks). Counts are taken from the training forward
only (gradients enabled), not from evaluations.
"""

import torch

from services.engine.model.causal_lm import CausalLM
from services.engine.model.moe import Router


class ExpertBalance:
    """Counts each router's choices during training forwards and moves its bias after a step.

    Args:
        model: the model being trained.
        rate: the bias step per optimizer step (DeepSeek-V3 uses 1e-3); 0 leaves the biases alone.
    """

    def __init__(self, model: CausalLM, rate: float):
        self.rate = rate
        self.routers = [module for module in model.modules() if isinstance(module, Router)]
        self.counts: dict[int, torch.Tensor] = {}
        for index, router in enumerate(self.routers):
            router.register_forward_hook(self._counter(index))

    def _counter(self, index: int):
        def count(router: Router, inputs, outputs) -> None:
            if not torch.is_grad_enabled():
                return
            expert_ids = outputs[1].reshape(-1).long()
            counted = torch.bincount(expert_ids, minlength=router.spec.num_experts)
            self.counts[index] = self.counts.get(index, 0) + counted

        return count

    @torch.no_grad()
    def step(self) -> None:
        """Move every router's bias by its counts since the last call, then clear the counts."""
        for index, counted in self.counts.items():
            load = counted.float()
            bias = self.routers[index].e_score_correction_bias
            bias -= self.rate * torch.sign(load - load.mean()).to(bias.device)
        self.counts.clear()
