"""Parse and validate a Hugging Face ``config.json`` into a ``ModelConfig``, before any weight is read."""

import logging
from pathlib import Path
from typing import Any

from common.config_fields import ConfigReader
from common.model_info import model_family, read_config_json
from kernels.rotary.naive import RopeScaling

from .config import (
    LAYER_KDA,
    LAYER_MLA,
    MLP_DENSE,
    MLP_MOE,
    IndexerConfig,
    KdaConfig,
    ModelConfig,
    MoeConfig,
    RopeConfig,
)

log = logging.getLogger(__name__)

# Keys with no effect on the numerics the engine computes; accepted without a warning.
_INERT_KEYS = {
    "architectures",
    "auto_map",
    "transformers_version",
    "initializer_range",
    "use_cache",
    "output_router_logits",
    "router_aux_loss_coef",
    "attention_dropout",
    "pretraining_tp",
    "model_max_length",
    "max_position_embeddings",
    "head_dim",
    "qk_head_dim",
    "ep_size",
    "aux_loss_alpha",
    "seq_aux",
    "pad_token_id",
    "use_bfloat16",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "tokenizer_class",
    "_name_or_path",
    "id2label",
    "label2id",
    "chunk_size_feed_forward",
    "problem_type",
}
# Keys of a section the model may not have (no MoE layer, no KDA layer, layer kinds given twice).
_SECTION_KEYS = {
    "first_k_dense_replace",
    "mlp_layer_types",
    "layer_types",
    "linear_attn_config",
    "linear_head_dim",
    "linear_num_heads",
    "linear_conv_kernel_dim",
    "moe_intermediate_size",
    "n_group",
    "num_expert_group",
    "topk_group",
    "n_routed_experts",
    "num_experts",
    "num_local_experts",
    "n_shared_experts",
    "num_shared_experts",
    "norm_topk_prob",
    "moe_renormalize",
    "num_experts_per_tok",
    "num_experts_per_token",
    "routed_scaling_factor",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
}
_KIMI_LAYER_NAMES = {"linear_attention": LAYER_KDA, "full_attention": LAYER_MLA}
_MLP_NAMES = {"dense": MLP_DENSE, "sparse": MLP_MOE}


def load_model_config(source: str | Path | dict[str, Any]) -> ModelConfig:
    """Parse and validate a model config.

    Args:
        source: a checkpoint folder, a ``config.json`` path, or an already parsed dict.

    Returns:
        The validated ``ModelConfig``.

    Raises:
        FileNotFoundError: the folder has no ``config.json``.
        ConfigError: a field is missing, mistyped, unsupported or inconsistent; the message names it.
    """
    raw, origin = read_config_json(source)
    reader = ConfigReader(raw, origin)
    config = _parse(reader)
    unknown = sorted(set(raw) - reader.consulted - _INERT_KEYS - _SECTION_KEYS)
    if unknown:
        log.warning("%s: keys not used by the engine: %s", origin, ", ".join(unknown))
    return config


def _parse(r: ConfigReader) -> ModelConfig:
    family = model_family(r)
    if r.has("quantization_config"):
        r.value("quantization_config")
        raise r.error(
            "quantization_config", "quantized checkpoints are not supported yet; give bf16/fp32 weights"
        )
    r.choice("hidden_act", ("silu",), "silu")
    if r.boolean("attention_bias", False):
        raise r.error("attention_bias", "true is not supported (MLA projections have no bias)")
    if r.boolean("mlp_bias", False):
        raise r.error("mlp_bias", "true is not supported")
    r.choice("scoring_func", ("sigmoid",), "sigmoid")
    r.choice("topk_method", ("noaux_tc",), "noaux_tc")
    r.choice("moe_layer_freq", (1,), 1)

    is_deepseek = family == "deepseek_v32"

    num_layers = r.integer("num_hidden_layers")
    heads = r.integer("num_attention_heads")
    kv_heads = r.integer("num_key_value_heads", heads)
    if kv_heads != heads:
        raise r.error(
            "num_key_value_heads", f"must equal num_attention_heads ({heads}) for MLA, got {kv_heads}"
        )
    q_lora_rank = r.integer("q_lora_rank", None)
    if is_deepseek and q_lora_rank is None:
        raise r.error("q_lora_rank", "required for deepseek_v32 (its indexer reads the compressed query)")
    nope_dim = r.integer("qk_nope_head_dim")
    rope_dim = r.integer("qk_rope_head_dim")
    if rope_dim % 2:
        raise r.error("qk_rope_head_dim", f"must be even, got {rope_dim}")

    layer_types = _deepseek_layer_types(num_layers) if is_deepseek else _kimi_layer_types(r, num_layers)
    kda = _kda_config(r) if LAYER_KDA in layer_types else None
    rope = _rope_config(r) if is_deepseek else None
    indexer = _indexer_config(r, rope_dim if rope else 0) if family != "kimi_linear" else None
    mlp_types = _mlp_types(r, num_layers, default_dense=3 if is_deepseek else 1)
    moe = _moe_config(r, is_deepseek) if MLP_MOE in mlp_types else None
    eos = r.value("eos_token_id", [])
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in eos_ids):
        raise r.error("eos_token_id", f"must be an integer or a list of integers, got {eos!r}")
    dtype = r.value("dtype", r.value("torch_dtype", "bfloat16"))
    if dtype not in ("float32", "bfloat16", "float16"):
        raise r.error("torch_dtype", f"{dtype!r} is not supported (float32, bfloat16, float16)")
    return ModelConfig(
        family=family,
        vocab_size=r.integer("vocab_size"),
        hidden_size=r.integer("hidden_size"),
        intermediate_size=r.integer("intermediate_size"),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=r.integer("kv_lora_rank"),
        qk_nope_head_dim=nope_dim,
        qk_rope_head_dim=rope_dim,
        v_head_dim=r.integer("v_head_dim"),
        rms_norm_eps=r.number("rms_norm_eps", 1e-6 if is_deepseek else 1e-5),
        tie_word_embeddings=r.boolean("tie_word_embeddings", False),
        layer_types=layer_types,
        mlp_types=mlp_types,
        rope=rope,
        kda=kda,
        indexer=indexer,
        moe=moe,
        num_nextn_predict_layers=r.integer("num_nextn_predict_layers", 0, minimum=0),
        bos_token_id=r.integer("bos_token_id", None, minimum=0),
        eos_token_ids=eos_ids,
        torch_dtype=dtype,
    )


def _deepseek_layer_types(num_layers: int) -> tuple[str, ...]:
    return (LAYER_MLA,) * num_layers


def _kimi_layer_types(r: ConfigReader, num_layers: int) -> tuple[str, ...]:
    """Layer kinds from ``layer_types`` or from ``linear_attn_config`` (1-indexed lists); both must agree."""
    from_list = None
    if r.has("layer_types"):
        names = r.value("layer_types")
        if not isinstance(names, list) or len(names) != num_layers:
            raise r.error("layer_types", f"must list one type per layer ({num_layers})")
        bad = [n for n in names if n not in _KIMI_LAYER_NAMES]
        if bad:
            raise r.error("layer_types", f"unknown layer type {bad[0]!r} (linear_attention, full_attention)")
        from_list = tuple(_KIMI_LAYER_NAMES[n] for n in names)
    linear = r.value("linear_attn_config", {})
    from_linear = None
    if "kda_layers" in linear or "full_attn_layers" in linear:
        kda_layers, mla_layers = linear.get("kda_layers", []), linear.get("full_attn_layers", [])
        kinds: list[str | None] = [None] * num_layers
        for field, indices, kind in (
            ("kda_layers", kda_layers, LAYER_KDA),
            ("full_attn_layers", mla_layers, LAYER_MLA),
        ):
            for index in indices:
                if not isinstance(index, int) or not 1 <= index <= num_layers:
                    raise r.error(f"linear_attn_config.{field}", f"layer {index!r} outside 1..{num_layers}")
                if kinds[index - 1] is not None:
                    raise r.error(f"linear_attn_config.{field}", f"layer {index} listed twice")
                kinds[index - 1] = kind
        if None in kinds:
            missing = kinds.index(None) + 1
            raise r.error(
                "linear_attn_config", f"layer {missing} is in neither kda_layers nor full_attn_layers"
            )
        from_linear = tuple(kinds)
    if from_list and from_linear and from_list != from_linear:
        raise r.error("layer_types", "disagrees with linear_attn_config.kda_layers/full_attn_layers")
    if not (from_list or from_linear):
        raise r.error(
            "layer_types", "missing: give layer_types or linear_attn_config.kda_layers/full_attn_layers"
        )
    return from_list or from_linear


def _kda_config(r: ConfigReader) -> KdaConfig:
    linear = r.value("linear_attn_config", {})

    def pick(inner: str, flat: str) -> int:
        value = linear.get(inner, r.value(flat, None))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise r.error(
                f"linear_attn_config.{inner}", f"missing or not a positive integer (or give {flat})"
            )
        return value

    kernel = pick("short_conv_kernel_size", "linear_conv_kernel_dim")
    if kernel < 2:
        raise r.error("linear_attn_config.short_conv_kernel_size", f"must be >= 2, got {kernel}")
    return KdaConfig(
        num_heads=pick("num_heads", "linear_num_heads"),
        head_dim=pick("head_dim", "linear_head_dim"),
        conv_kernel_size=kernel,
    )


def _rope_config(r: ConfigReader) -> RopeConfig:
    """RoPE from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (older files)."""
    params = r.value("rope_parameters", None)
    field = "rope_parameters"
    if params is None:
        params = dict(r.value("rope_scaling", None) or {}, rope_theta=r.value("rope_theta", 10000.0))
        field = "rope_scaling"
    if not isinstance(params, dict):
        raise r.error(field, "must be an object")
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", r.value("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise r.error(f"{field}.rope_theta", f"must be a positive number, got {theta!r}")
    if rope_type == "default":
        return RopeConfig(theta=float(theta), scaling=None)
    if rope_type != "yarn":
        raise r.error(f"{field}.rope_type", f"{rope_type!r} is not supported (default, yarn)")
    for key in ("factor", "original_max_position_embeddings"):
        if not isinstance(params.get(key), (int, float)):
            raise r.error(f"{field}.{key}", "required for yarn")
    scaling = RopeScaling(
        factor=float(params["factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )
    return RopeConfig(theta=float(theta), scaling=scaling)


def _indexer_config(r: ConfigReader, rope_dim: int) -> IndexerConfig:
    head_dim = r.integer("index_head_dim")
    if head_dim < rope_dim:
        raise r.error("index_head_dim", f"must be >= qk_rope_head_dim ({rope_dim}), got {head_dim}")
    return IndexerConfig(n_heads=r.integer("index_n_heads"), head_dim=head_dim, topk=r.integer("index_topk"))


def _mlp_types(r: ConfigReader, num_layers: int, default_dense: int) -> tuple[str, ...]:
    if r.has("mlp_layer_types"):
        names = r.value("mlp_layer_types")
        if not isinstance(names, list) or len(names) != num_layers or any(n not in _MLP_NAMES for n in names):
            raise r.error("mlp_layer_types", f"must list 'dense' or 'sparse' for each of {num_layers} layers")
        return tuple(_MLP_NAMES[n] for n in names)
    dense = min(r.integer("first_k_dense_replace", default_dense, minimum=0), num_layers)
    return (MLP_DENSE,) * dense + (MLP_MOE,) * (num_layers - dense)


def _moe_config(r: ConfigReader, is_deepseek: bool) -> MoeConfig:
    expert_keys = (
        ("n_routed_experts", "num_local_experts") if is_deepseek else ("num_experts", "num_local_experts")
    )
    experts = r.integer(expert_keys[0], aliases=expert_keys[1:])
    per_tok = r.integer("num_experts_per_tok", aliases=("num_experts_per_token",))
    n_group = r.integer("n_group", 1, aliases=("num_expert_group",))
    topk_group = r.integer("topk_group", 1)
    if experts % n_group:
        raise r.error("n_group", f"must divide the number of experts ({experts}), got {n_group}")
    if experts // n_group < 2:
        raise r.error(
            "n_group", f"each group needs at least 2 experts ({experts} experts / {n_group} groups)"
        )
    if topk_group > n_group:
        raise r.error("topk_group", f"must be <= n_group ({n_group}), got {topk_group}")
    if per_tok > topk_group * (experts // n_group):
        raise r.error("num_experts_per_tok", f"{per_tok} exceeds the experts in {topk_group} kept group(s)")
    return MoeConfig(
        num_experts=experts,
        num_experts_per_tok=per_tok,
        intermediate_size=r.integer("moe_intermediate_size"),
        num_shared_experts=r.integer("n_shared_experts", 1, minimum=0, aliases=("num_shared_experts",)),
        n_group=n_group,
        topk_group=topk_group,
        norm_topk_prob=r.boolean("norm_topk_prob", True, aliases=("moe_renormalize",)),
        routed_scaling_factor=r.number("routed_scaling_factor", 1.0),
    )
