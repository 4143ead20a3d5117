"""The peer an engine benchmark row is read against: transformers' own model class on the same
checkpoint (``KimiLinearForCausalLM``; it runs fla-core's KDA kernels when fla is installed and the
device is a GPU), decoding greedily from the same prompts."""

import json
import time
from pathlib import Path

import torch


class PeerModel:
    """A loaded transformers model and how to time its decoding.

    Build with ``PeerModel.load``; ``why_not`` says why there is none for a checkpoint and device.
    """

    name = "transformers KimiLinearForCausalLM"

    def __init__(self, model: torch.nn.Module, device: str):
        self.model, self.device = model, device

    @staticmethod
    def why_not(model_dir: str, device: str) -> str:
        """Empty when a peer can run, else the reason."""
        config = Path(model_dir) / "config.json"
        if not config.is_file():
            return "none (no checkpoint on disk: real-shape presets are built in memory)"
        raw = json.loads(config.read_text())
        if raw.get("model_type") != "kimi_linear" or "index_n_heads" in raw:
            return "none (transformers has a class for kimi_linear only, not the K3 hybrid or this family)"
        if not device.startswith("cuda"):
            return "none (the peer runs fla-core's Triton kernels: CUDA only)"
        return ""

    @classmethod
    def load(cls, model_dir: str, device: str) -> "PeerModel | None":
        if cls.why_not(model_dir, device):
            return None
        from transformers import KimiLinearForCausalLM  # the peer only: not needed to serve

        raw = json.loads((Path(model_dir) / "config.json").read_text())
        dtype = getattr(torch, raw.get("torch_dtype", "bfloat16"))
        model = KimiLinearForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        return cls(model, device)

    def decode_tokens_per_s(self, prompts: list[list[int]], decode_tokens: int) -> float | None:
        """Greedy decode rate with the model's own cache (decode time = full generate - prefill);
        None when the peer fails at this size (its error is printed)."""
        ids = torch.tensor(prompts, device=self.device)
        try:
            self._generate_seconds(ids, decode_tokens + 1)  # untimed: fla's kernels autotune per shape
            prefill = self._generate_seconds(ids, 1)
            total = self._generate_seconds(ids, decode_tokens + 1)
        except (RuntimeError, ValueError) as error:  # e.g. out of memory at batch 32
            print(f"peer failed at batch {len(prompts)} x {len(prompts[0])}: {error}")
            return None
        return len(prompts) * decode_tokens / max(total - prefill, 1e-9)

    @torch.no_grad()
    def _generate_seconds(self, ids: torch.Tensor, new_tokens: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
        torch.cuda.synchronize()
        return time.perf_counter() - start
