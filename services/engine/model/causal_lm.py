"""The decoder stack and LM head for all three families; parameter names follow transformers."""

import torch
from torch import nn

from kernels.invariant.reproducible_blas import ensure_strict_mkl

from .config import LAYER_KDA, MLP_MOE, ModelConfig
from .forward_batch import ForwardBatch, ModelCache
from .invariant_numerics import InvariantNumerics
from .kda import KimiDeltaAttention
from .mla import MultiLatentAttention
from .moe import DenseMLP, MoE
from .norm import RMSNorm
from .numerics import Numerics
from .rotary import RotaryTables
from .state import ContiguousCache

# Parameters kept in float32 whatever the model dtype (as the reference implementations do).
FLOAT32_PARAMETERS = (
    "mlp.gate.weight",
    "mlp.gate.e_score_correction_bias",
    "forget_gate.dt_bias",
    "indexer.weights_proj.weight",
)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention (KDA or MLA), then MLP (dense or MoE)."""

    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.is_kda = config.layer_types[index] == LAYER_KDA
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = KimiDeltaAttention(config) if self.is_kda else MultiLatentAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.mlp_types[index] == MLP_MOE:
            self.mlp = MoE(config.hidden_size, config.moe)
        else:
            self.mlp = DenseMLP(config.hidden_size, config.intermediate_size)

    def forward(
        self, x, cos, sin, batch: ForwardBatch, cache: ModelCache, layer: int, nx: Numerics
    ) -> torch.Tensor:
        normed = self.input_layernorm(x, nx)
        if self.is_kda:
            attn = self.self_attn(normed, batch, cache, layer, nx)
        else:
            attn = self.self_attn(normed, cos, sin, batch, cache, layer, nx)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x, nx), nx)


class DecoderStack(nn.Module):
    """Embedding, decoder layers and final norm (transformers' ``model.*`` prefix)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """A Kimi-Linear, DeepSeek-V3.2 or K3 causal language model.

    Args:
        config: the validated model config.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryTables(config.rope, config.qk_rope_head_dim) if config.rope else None
        self.numerics: Numerics = Numerics()

    def set_batch_invariant(self, enabled: bool) -> None:
        """Switch between the default numerics and the batch-invariant ones (DESIGN.md section 4).

        Raises:
            RuntimeError: invariant numerics on the CPU, with MKL already running in a non-strict mode.
        """
        if enabled and self.lm_head.weight.device.type == "cpu":
            ensure_strict_mkl()  # at start, not at the first request: refuse before serving anything
        self.numerics = InvariantNumerics() if enabled else Numerics()

    def forward_batch(
        self, batch: ForwardBatch, cache: ModelCache, logit_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the batch's new tokens through the model, writing them into ``cache``.

        Args:
            batch: flattened new tokens of several sequences.
            cache: per-sequence cache, holding each sequence's ``past`` tokens.
            logit_rows: rows whose logits are wanted (e.g. ``batch.last_rows()``); None for all.

        Returns:
            ``[len(logit_rows) or N, vocab_size]`` logits in the model dtype.

        Raises:
            ValueError: an id outside the vocabulary (names the first bad id and its index).
        """
        self._check_ids(batch.input_ids)
        nx = self.numerics
        hidden = self.model.embed_tokens(batch.input_ids)
        cos = sin = None
        if self.rotary is not None:
            cos, sin = self.rotary.cos_sin(batch.positions, hidden.dtype, nx)
        for index, layer in enumerate(self.model.layers):
            hidden = layer(hidden, cos, sin, batch, cache, index, nx)
        if logit_rows is not None:
            hidden = hidden[logit_rows]
        return nx.linear(self.model.norm(hidden, nx), self.lm_head.weight)

    def forward(self, input_ids: torch.Tensor, cache: ContiguousCache | None = None) -> torch.Tensor:
        """Logits for ``B`` sequences' new tokens, continuing ``cache`` (updated in place) when given.

        Args:
            input_ids: ``[B, T]`` token ids, each in ``[0, vocab_size)``.
            cache: the B sequences' previous tokens, or None for fresh sequences.

        Returns:
            ``[B, T, vocab_size]`` logits in the model dtype.
        """
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids: expected shape [batch, tokens] with tokens >= 1, got {list(input_ids.shape)}"
            )
        cache = cache or ContiguousCache(input_ids.shape[0])
        batch = ForwardBatch.build(input_ids.tolist(), cache.num_tokens, input_ids.device)
        logits = self.forward_batch(batch, cache)
        cache.num_tokens = [piece.total for piece in batch.sequences]
        return logits.view(*input_ids.shape, -1)

    def _check_ids(self, input_ids: torch.Tensor) -> None:
        bad = (input_ids < 0) | (input_ids >= self.config.vocab_size)
        if bad.any():
            position = int(bad.nonzero()[0, 0])
            token, vocab = int(input_ids[position]), self.config.vocab_size
            raise ValueError(
                f"input_ids: id {token} at position {position} is outside the vocabulary [0, {vocab})"
            )
