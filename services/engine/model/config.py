"""The validated model configuration the engine runs on (built by ``config_loader``); its families are
described in ``common/model_info.py``."""

from dataclasses import dataclass

from kernels.rotary.naive import RopeScaling, yarn_mscale

LAYER_KDA = "kda"
LAYER_MLA = "mla"
MLP_DENSE = "dense"
MLP_MOE = "moe"


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of the MLA layers and the indexer (DeepSeek); absent for NoPE families."""

    theta: float
    scaling: RopeScaling | None


@dataclass(frozen=True)
class KdaConfig:
    """Kimi Delta Attention layer sizes."""

    num_heads: int
    head_dim: int
    conv_kernel_size: int


@dataclass(frozen=True)
class IndexerConfig:
    """DSA lightning indexer sizes."""

    n_heads: int
    head_dim: int
    topk: int


@dataclass(frozen=True)
class MoeConfig:
    """Routed experts, shared experts and the router."""

    num_experts: int
    num_experts_per_tok: int
    intermediate_size: int
    num_shared_experts: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs, validated. ``layer_types[i]`` is ``"kda"`` or ``"mla"``,
    ``mlp_types[i]`` is ``"dense"`` or ``"moe"``."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]
    mlp_types: tuple[str, ...]
    rope: RopeConfig | None
    kda: KdaConfig | None
    indexer: IndexerConfig | None
    moe: MoeConfig | None
    num_nextn_predict_layers: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def attention_scale(self) -> float:
        """Softmax scale of the MLA layers (YaRN's mscale squared when ``mscale_all_dim`` is set)."""
        scale = self.qk_head_dim**-0.5
        scaling = self.rope.scaling if self.rope else None
        if scaling is not None and scaling.mscale_all_dim:
            m = yarn_mscale(scaling.factor, scaling.mscale_all_dim)
            scale = scale * m * m
        return scale
