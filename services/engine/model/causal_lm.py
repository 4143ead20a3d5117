"""The decoder stack and LM head for all three families; parameter names follow transformers."""

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from kernels.invariant.reproducible_blas import ensure_strict_mkl
from services.engine.adapters.step_lora import StepLora
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.dcp_kernels import dcp_kernel_set

from .backends import KernelSet, build_kernels
from .config import LAYER_KDA, MLP_MOE, ModelConfig
from .invariant_numerics import InvariantNumerics
from .kda import KimiDeltaAttention
from .layer_cache import ModelCache
from .mla import MultiLatentAttention
from .moe import DenseMLP, MoE
from .norm import RMSNorm
from .numerics import Numerics
from .rotary import RotaryTables
from .step_metadata import StepMetadata, build_step_metadata

if TYPE_CHECKING:
    from services.engine.adapters.lora_adapter import LoraAdapter

# Parameters kept in float32 whatever the model dtype (as the reference implementations do).
FLOAT32_PARAMETERS = (
    "mlp.gate.weight",
    "mlp.gate.e_score_correction_bias",
    "forget_gate.dt_bias",
    "indexer.weights_proj.weight",
)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention (KDA or MLA), then MLP (dense or MoE)."""

    def __init__(self, config: ModelConfig, index: int, parallel: ParallelContext):
        super().__init__()
        self.is_kda = config.layer_types[index] == LAYER_KDA
        self.is_moe = config.mlp_types[index] == MLP_MOE
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        attention = KimiDeltaAttention if self.is_kda else MultiLatentAttention
        self.self_attn = attention(config, parallel)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if self.is_moe:
            self.mlp = MoE(config.hidden_size, config.moe, parallel)
        else:
            self.mlp = DenseMLP(config.hidden_size, config.intermediate_size, parallel)

    def forward(
        self,
        x,
        cos,
        sin,
        meta: StepMetadata,
        cache: ModelCache,
        layer: int,
        nx: Numerics,
        ops: KernelSet,
        lora: StepLora | None = None,
    ) -> torch.Tensor:
        normed = self.input_layernorm(x, nx)
        if self.is_kda:
            attn = self.self_attn(normed, meta, cache, layer, nx, ops, lora)
        else:
            attn = self.self_attn(normed, cos, sin, meta, cache, layer, nx, ops, lora)
        x = x + attn
        normed = self.post_attention_layernorm(x, nx)
        return x + (self.mlp(normed, nx, ops, lora) if self.is_moe else self.mlp(normed, nx, lora))


class DecoderStack(nn.Module):
    """Embedding, decoder layers and final norm (transformers' ``model.*`` prefix)."""

    def __init__(self, config: ModelConfig, parallel: ParallelContext):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, parallel) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """A Kimi-Linear, DeepSeek-V3.2 or K3 causal language model.

    Under a parallel context each rank holds its TP shard of the attention heads and MLPs and its EP
    shard of the routed experts (``services.engine.parallel``); the embedding, the final norm and the
    LM head are whole on every rank, so every rank computes the full logits. Every rank of a group
    must run the same steps (the layers' reductions are collective).

    Args:
        config: the validated model config.
        parallel: this rank's context (validated against ``config`` by the caller:
            ``ParallelLayout.validate``); None is one process.
    """

    def __init__(self, config: ModelConfig, parallel: ParallelContext | None = None):
        super().__init__()
        self.config = config
        self.parallel = parallel or ParallelContext.single()
        self.model = DecoderStack(config, self.parallel)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryTables(config.rope, config.qk_rope_head_dim) if config.rope else None
        self.numerics: Numerics = Numerics()
        # With dcp > 1 attention and the indexer read and write only this rank's shard of the MLA cache.
        self.kernels: KernelSet = dcp_kernel_set(
            build_kernels("reference", self.numerics, "cpu"), self.parallel, batch_invariant=False
        )

    def set_kernels(self, name: str, kv_format: str = "auto") -> None:
        """Choose the op families' backend by name (``check_kernels`` validates it first)."""
        device = str(self.device)
        if self.numerics.batch_invariant:  # the name picks the invariant numerics' own kernels
            self.numerics = InvariantNumerics(device_kernels="triton" if name == "triton" else "torch")
        kernels = build_kernels(name, self.numerics, device, kv_format)
        self.kernels = dcp_kernel_set(kernels, self.parallel, self.numerics.batch_invariant)

    def set_batch_invariant(self, enabled: bool) -> None:
        """Switch between the default numerics and the batch-invariant ones (DESIGN.md section 4).

        The invariant numerics run on the ``reference`` backend (their own kernels: ``set_kernels``
        picks the torch or the Triton ones).

        Raises:
            RuntimeError: invariant numerics on the CPU, with MKL already running in a non-strict mode.
            ValueError: the model's widths do not split into the invariant row-parallel segments, or
                the model runs as a rank of a DCP group (``ParallelLayout.validate``).
        """
        if enabled:
            self.parallel.layout.validate(self.config, batch_invariant=True)
        if enabled and self.device.type == "cpu":
            ensure_strict_mkl()  # at start, not at the first request: refuse before serving anything
        numerics = InvariantNumerics() if enabled else Numerics()
        kernels = build_kernels("reference", numerics, str(self.device))
        self.kernels = dcp_kernel_set(kernels, self.parallel, numerics.batch_invariant)
        self.numerics = numerics

    @property
    def device(self) -> torch.device:
        """Where the parameters live (any one of them: a pipeline stage holds only some modules)."""
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (that of the logits and of the cache rows): the layer norms' (a pipeline
        stage may hold neither the embedding nor the LM head)."""
        held = (layer for layer in self.model.layers if isinstance(layer, DecoderLayer))
        return next(held).input_layernorm.weight.dtype

    def forward_step(
        self, meta: StepMetadata, cache: ModelCache, adapters: "Mapping[int, LoraAdapter] | None" = None
    ) -> torch.Tensor:
        """Run one step's new tokens through the model, writing them into ``cache``.

        Reads no device value back on the fast path (the id check is the caller's, before the step:
        ``check_ids``), so a CUDA graph can capture it.

        Args:
            meta: the step (its ``input_ids``, positions, block tables, slots).
            cache: the model cache.
            adapters: adapter slot -> adapter for every nonzero slot in ``meta.seq_adapters_host``
                (``AdapterRegistry.table``); each row's adapter is applied by the merge contract
                (``services.engine.adapters.merge``). Rows of slot 0 get the base model's bits.

        Returns:
            ``[R, vocab_size]`` logits of ``meta.logit_rows`` in the model dtype.
        """
        nx, ops = self.numerics, self.kernels
        lora = None
        if any(meta.seq_adapters_host):
            layout = self.parallel.layout
            if layout.tp > 1 or layout.ep > 1:
                raise ValueError(f"adapters: LoRA runs only at --tp 1 --ep 1, this rank is in {layout}")
            device = meta.input_ids.device
            # The segmented Triton kernel where library products are allowed (default numerics, GPU).
            segmented = device.type == "cuda" and not nx.batch_invariant
            lora = StepLora.build(
                meta.seq_adapters_host, meta.query_start_loc_host, adapters or {}, device, segmented
            )
        hidden = self.model.embed_tokens(meta.input_ids)
        cos = sin = None
        if self.rotary is not None:
            cos, sin = self.rotary.cos_sin(meta.positions, hidden.dtype, nx)
        for index, layer in enumerate(self.model.layers):
            hidden = layer(hidden, cos, sin, meta, cache, index, nx, ops, lora)
        hidden = hidden[meta.logit_rows]
        return nx.linear(self.model.norm(hidden, nx), self.lm_head.weight)

    def forward(
        self, input_ids: torch.Tensor, cache=None, adapter: "LoraAdapter | None" = None
    ) -> torch.Tensor:
        """Logits for ``B`` sequences' new tokens, continuing ``cache`` (updated in place) when given.

        Args:
            input_ids: ``[B, T]`` token ids, each in ``[0, vocab_size)``.
            cache: a ``ContiguousCache`` holding the B sequences' previous tokens, or None.
            adapter: a LoRA adapter applied to every sequence (``load_lora_adapter`` on this model), or
                None; the same merge contract as serving, so served-with-adapter logprobs equal these.

        Returns:
            ``[B, T, vocab_size]`` logits in the model dtype.
        """
        # Imported here: the cache package imports the model's config, so a module-level import cycles.
        from services.engine.cache.contiguous_cache import ContiguousCache

        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids: expected shape [batch, tokens] with tokens >= 1, got {list(input_ids.shape)}"
            )
        self.check_ids(input_ids.reshape(-1))
        if cache is None:
            weight = self.lm_head.weight
            cache = ContiguousCache(
                input_ids.shape[0],
                self.config,
                weight.dtype,
                weight.device,
                self.numerics.batch_invariant,
                self.parallel.tp,
            )
        new_tokens = input_ids.tolist()
        steps = cache.steps(new_tokens)
        if adapter is not None:
            steps = [dataclasses.replace(step, adapter=1) for step in steps]
        meta = build_step_metadata(
            steps,
            cache.block_size,
            input_ids.device,
            logit_rows=list(range(input_ids.numel())),
            index_topk=self.index_topk,
        )
        logits = self.forward_step(meta, cache, None if adapter is None else {1: adapter})
        cache.advance(new_tokens)
        return logits.view(*input_ids.shape, -1)

    @property
    def index_topk(self) -> int:
        """The DSA budget steps record (0 without an indexer)."""
        return self.config.indexer.topk if self.config.indexer else 0

    def check_ids(self, input_ids: torch.Tensor) -> None:
        """Raise ValueError naming the first id of ``input_ids [N]`` outside the vocabulary, and its index."""
        bad = (input_ids < 0) | (input_ids >= self.config.vocab_size)
        if bad.any():
            position = int(bad.nonzero()[0, 0])
            token, vocab = int(input_ids[position]), self.config.vocab_size
            raise ValueError(
                f"input_ids: id {token} at position {position} is outside the vocabulary [0, {vocab})"
            )
