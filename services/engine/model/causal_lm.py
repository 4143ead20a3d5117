"""The decoder stack and LM head for all three families; parameter names follow transformers."""

import torch
from torch import nn

from .config import LAYER_KDA, MLP_MOE, ModelConfig
from .kda import KimiDeltaAttention
from .mla import MultiLatentAttention
from .moe import DenseMLP, MoE
from .norm import RMSNorm
from .rotary import RotaryTables
from .state import SequenceState

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

    def forward(self, x, cos, sin, cache, past_tokens: int):
        normed = self.input_layernorm(x)
        if self.is_kda:
            attn, cache = self.self_attn(normed, cache)
        else:
            attn, cache = self.self_attn(normed, cos, sin, cache, past_tokens)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), cache


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

    def forward(self, input_ids: torch.Tensor, state: SequenceState | None = None) -> torch.Tensor:
        """Logits for new tokens, continuing ``state`` (updated in place) when given.

        Args:
            input_ids: ``[B, T]`` token ids, each in ``[0, vocab_size)``.
            state: cache of the previous tokens of these B sequences, or None for a fresh sequence.

        Returns:
            ``[B, T, vocab_size]`` logits in the model dtype.

        Raises:
            ValueError: an id outside the vocabulary (names the first bad id and its index).
        """
        self._check_ids(input_ids)
        past = state.num_tokens if state else 0
        positions = torch.arange(past, past + input_ids.shape[1], device=input_ids.device).expand_as(
            input_ids
        )
        hidden = self.model.embed_tokens(input_ids)
        cos = sin = None
        if self.rotary is not None:
            cos, sin = self.rotary.cos_sin(positions, hidden.dtype)
        for index, layer in enumerate(self.model.layers):
            cache = state.layers.get(index) if state else None
            hidden, cache = layer(hidden, cos, sin, cache, past)
            if state is not None:
                state.layers[index] = cache
        if state is not None:
            state.num_tokens += input_ids.shape[1]
        return self.lm_head(self.model.norm(hidden))

    def _check_ids(self, input_ids: torch.Tensor) -> None:
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids: expected shape [batch, tokens] with tokens >= 1, got {list(input_ids.shape)}"
            )
        bad = (input_ids < 0) | (input_ids >= self.config.vocab_size)
        if bad.any():
            where = bad.nonzero()[0].tolist()
            token, vocab = int(input_ids[tuple(where)]), self.config.vocab_size
            raise ValueError(
                f"input_ids: id {token} at position {where[-1]} is outside the vocabulary [0, {vocab})"
            )
