"""A LoRA adapter resolved against one model: each pair attached to the module it adapts, shapes checked.

PEFT names modules as the transformers model does; ``NameMapper`` (the checkpoint loader's) turns
``<module>.weight`` into Baton's parameter, so the hub spellings work too (Kimi's
``block_sparse_moe.experts.<e>.w1/w3/w2``, DeepSeek's ``mlp.experts.<e>.gate_proj/up_proj/down_proj``,
the forget gate's ``self_attn.f_a_proj``). Adaptable:

- every ``nn.Linear`` inside the decoder layers that the layers compute as a product: MLA's
  ``q_proj`` / ``q_a_proj`` / ``q_b_proj`` / ``kv_a_proj_with_mqa`` / ``o_proj``, the DSA indexer's
  ``wq_b`` / ``wk`` / ``weights_proj``, KDA's ``q/k/v_proj``, ``b_proj``, ``g_a/g_b_proj``,
  ``f_a/f_b_proj``, ``o_proj``, dense and shared-expert ``gate/up/down_proj``;
- each routed expert's gate, up and down projection.

Refused, naming the module: ``kv_b_proj`` (its weight is absorbed into the attention kernels, not
applied as a product), the router, the short convolution, embeddings and the LM head.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from services.engine.checkpoint.tensor_names import NameMapper

from .merge import scaling_of
from .peft_format import AdapterError, PeftLora, read_peft_lora

_NOT_A_PRODUCT = ("kv_b_proj",)
EXPERT_PARTS = ("gate", "up", "down")


@dataclass(frozen=True)
class LoraPair:
    """One adapted projection: ``a [r, K]``, ``b [M, r]`` float32 on the model's device, and its scaling."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """An adapter ready to serve on one model.

    Attributes:
        name: the name requests use.
        path: the folder it was read from.
        digest: identifies the folder's contents.
        linears: adapted ``nn.Linear`` module -> its pair.
        experts: ``Experts`` module -> expert id -> ``"gate" | "up" | "down"`` -> pair.
        modules: the adapted modules' Baton names (for listings and errors).
    """

    name: str
    path: str
    digest: str
    linears: dict[nn.Module, LoraPair] = field(default_factory=dict)
    experts: dict[nn.Module, dict[int, dict[str, LoraPair]]] = field(default_factory=dict)
    modules: tuple[str, ...] = ()

    @property
    def cache_salt(self) -> str:
        """What salts the prefix-cache chain: the name and the contents, so a different adapter loaded
        later under the same name never reuses the first one's cached blocks."""
        return f"{self.name}@{self.digest}"


def load_lora_adapter(name: str, folder: str | Path, model: nn.Module) -> LoraAdapter:
    """Read a PEFT LoRA folder and attach its pairs to ``model``'s modules (a ``CausalLM``).

    Raises:
        AdapterError: a bad folder (see ``read_peft_lora``), a module the model lacks or that cannot be
            adapted, or a tensor whose shape does not fit, each named.
    """
    peft = read_peft_lora(folder)
    parameters = dict(model.named_parameters())
    mapper = NameMapper(model.config, set(parameters))
    device = model.lm_head.weight.device
    adapter = LoraAdapter(name=name, path=str(folder), digest=peft.digest)
    names = []
    for module_name, (a, b) in sorted(peft.pairs.items()):
        rank, alpha = peft.rank_and_alpha(module_name)
        tensor = f"base_model.model.{module_name}.lora_A.weight"
        if a.shape[0] != rank or b.shape[1] != rank:
            raise AdapterError(
                f"{tensor}: rank {a.shape[0]} (lora_B rank {b.shape[1]}) does not match r={rank} "
                "of adapter_config.json"
            )
        pair = LoraPair(
            a.to(device=device, dtype=torch.float32),
            b.to(device=device, dtype=torch.float32),
            scaling_of(alpha, rank, peft.use_rslora),
        )
        names.append(_attach(adapter, model, mapper, module_name, pair, tensor))
    return LoraAdapter(
        name=name,
        path=str(folder),
        digest=peft.digest,
        linears=adapter.linears,
        experts=adapter.experts,
        modules=tuple(names),
    )


def _attach(
    adapter: LoraAdapter, model, mapper: NameMapper, module_name: str, pair: LoraPair, tensor: str
) -> str:
    target = mapper.resolve(module_name + ".weight")
    if target is None:
        raise AdapterError(f"{tensor}: the model has no module {module_name!r} to adapt")
    if target.expert is not None:
        experts_name = target.parameter.rsplit(".", 1)[0]
        experts = model.get_submodule(experts_name)
        hidden, inter = experts.down_proj.shape[1], experts.down_proj.shape[2]
        if target.parameter.endswith("down_proj"):
            part, shape_in, shape_out = "down", inter, hidden
        else:
            part, shape_in, shape_out = ("gate" if target.rows[0] == 0 else "up"), hidden, inter
        _check_shapes(pair, shape_in, shape_out, tensor)
        adapter.experts.setdefault(experts, {}).setdefault(target.expert, {})[part] = pair
        return f"{experts_name}[{target.expert}].{part}"
    path = target.parameter.removesuffix(".weight")
    module = model.get_submodule(path) if target.parameter.endswith(".weight") else None
    leaf = path.rsplit(".", 1)[-1]
    if (
        target.rows is not None
        or not isinstance(module, nn.Linear)
        or not path.startswith("model.layers.")
        or leaf in _NOT_A_PRODUCT
    ):
        raise AdapterError(
            f"{tensor}: module {module_name!r} ({target.describe()}) cannot be adapted: LoRA applies to "
            "the layers' linear projections and the experts (not kv_b_proj, the router, the short "
            "convolution, embeddings or the LM head)"
        )
    _check_shapes(pair, module.in_features, module.out_features, tensor)
    adapter.linears[module] = pair
    return path


def _check_shapes(pair: LoraPair, in_features: int, out_features: int, tensor: str) -> None:
    if pair.a.shape[1] != in_features:
        raise AdapterError(
            f"{tensor}: shape {list(pair.a.shape)} does not fit the base module: expected "
            f"[r, {in_features}] (in_features {in_features})"
        )
    b_name = tensor.replace("lora_A", "lora_B")
    if pair.b.shape[0] != out_features:
        raise AdapterError(
            f"{b_name}: shape {list(pair.b.shape)} does not fit the base module: expected "
            f"[{out_features}, r] (out_features {out_features})"
        )


__all__ = ["EXPERT_PARTS", "AdapterError", "LoraAdapter", "LoraPair", "PeftLora", "load_lora_adapter"]
