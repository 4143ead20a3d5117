"""Capacity planning: what one model costs in memory, and how many contexts fit beside it.

Three ledgers (DESIGN.md section 3 keeps KV and KDA state budgets apart, so they are counted apart):

1. Persistent state: the weights (exact), KV bytes per token (packed MLA blocks) and KDA state bytes
   per request (one state slot).
2. Workspace: an *estimate* of one step's activations (see ``workspace_terms``).
3. Transfer: what prefill writes into decode's memory for one request, ``ceil(L / B)`` packed blocks
   plus one KDA slot.

``fit`` then divides what is left of a memory budget after weights and workspace by one request's
KV blocks plus its KDA slot::

    | weights | workspace | n x (KV blocks of L tokens) | n x KDA slot | free (< one request) |

With speculative decoding (``fit(..., draft=...)``) the draft's weights and workspace join the
target's, and each request also holds the speculative part: the target's KDA rollback slots (``k``
with ``--kda-rollback states``, one checkpoint with ``replay``), the blocks its ``k`` drafted positions
may need past ``L``, and the draft model's own blocks for ``L + k`` tokens and ``1 + k`` slots (its
state and a checkpoint before each of the ``k`` drafts it feeds). The handoff then carries the draft's
prompt rows too (``services/engine/draft_handoff.py``): its ``ceil(L / B)`` blocks and one slot join
the transfer.

With a parallel layout (``tp``, ``dcp``, ``ep``) every figure is one rank's and the budget is one
device's: the weights are a rank's shard (TP and EP split them); TP splits the KDA heads (a rank's
slot holds ``1/tp`` of the state) but not the MLA latent, which every TP rank caches whole; DCP splits
a context's tokens (a rank caches ``ceil(L / dcp)`` of them, in its own whole blocks). A request
occupies every rank, so requests per rank is the group's requests.
"""

from dataclasses import asdict, dataclass

import torch

from kernels.kda.fixed_chunk import CHUNK as CF_BI_CHUNK
from services.engine.cache.layout import (
    KV_FORMATS,
    Layout,
    block_layout,
    slot_layout,
)
from services.engine.checkpoint.loader import meta_model
from services.engine.model.causal_lm import FLOAT32_PARAMETERS
from services.engine.model.config import LAYER_KDA, LAYER_MLA, MLP_DENSE, ModelConfig
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.layout import ParallelLayout


@dataclass(frozen=True)
class CapacityLedger:
    """Persistent and per-step memory of one model under one cache configuration (bytes are exact
    integers except ``workspace``, which is an estimate).

    Attributes:
        family, dtype: model family and parameter / activation dtype name.
        block_size, kv_format, batch_invariant: the cache configuration the figures are for.
        max_num_batched_tokens, max_num_seqs: the step budget the workspace is estimated for.
        num_parameters: parameters of the served model (tied embeddings counted once).
        weight_bytes: sum of ``numel * itemsize`` over parameters in their load dtypes.
        float32_weight_bytes: the part of ``weight_bytes`` kept in float32 (router, biases).
        mla_layers, kda_layers: how many layers of each kind.
        kv_block_bytes: one packed block (``block_size`` tokens of every MLA layer), 0 without MLA.
        kv_by_kind: ``(kind, bytes per token summed over MLA layers)``, unpadded.
        kda_slot_bytes: one request's KDA state slot, 0 without KDA layers.
        kda_by_kind: ``(kind, bytes per request summed over KDA layers)``, unpadded.
        workspace: ``(term, bytes)`` of the step estimate (``workspace_terms``).
        tp, dcp, ep: the layout the per-rank figures are for (``num_parameters``, ``weight_bytes``,
            ``kda_slot_bytes``, ``kv_blocks``).
    """

    family: str
    dtype: str
    block_size: int
    kv_format: str
    batch_invariant: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    num_parameters: int
    weight_bytes: int
    float32_weight_bytes: int
    mla_layers: int
    kda_layers: int
    kv_block_bytes: int
    kv_by_kind: tuple[tuple[str, int], ...]
    kda_slot_bytes: int
    kda_by_kind: tuple[tuple[str, int], ...]
    workspace: tuple[tuple[str, int], ...]
    tp: int = 1
    dcp: int = 1
    ep: int = 1

    @property
    def kv_bytes_per_token(self) -> float:
        """Block bytes / block size (an integer whenever the block has no alignment padding): one
        rank's bytes per token it caches (a context's token, over DCP, is cached by one rank)."""
        return self.kv_block_bytes / self.block_size

    @property
    def workspace_bytes(self) -> int:
        return sum(size for _, size in self.workspace)

    def kv_blocks(self, context_len: int) -> int:
        """One rank's blocks for a context of ``context_len`` tokens, ``ceil(ceil(L / dcp) / B)`` (0 for
        a model without MLA layers)."""
        tokens = -(-context_len // self.dcp)
        return -(-tokens // self.block_size) if self.kv_block_bytes else 0

    def transfer_bytes(self, context_len: int) -> int:
        """Bytes prefill writes into decode's memory for one request: its blocks plus its KDA slot."""
        return self.kv_blocks(context_len) * self.kv_block_bytes + self.kda_slot_bytes


@dataclass(frozen=True)
class ContextFit:
    """How many requests of ``context_len`` tokens fit in ``memory_bytes``.

    ``requests`` is 0 and ``limiting`` is ``"weights"`` (or ``"workspace"``) when those alone leave
    no room. Otherwise ``limiting`` is the state kind taking the larger share of each request's bytes
    (``"kv"`` or ``"kda_state"``): shrinking it admits the most extra requests. ``kv_blocks`` and
    ``kda_slots`` are the pool sizes to configure for ``requests`` concurrent contexts. With a draft,
    ``weight_bytes`` and ``workspace_bytes`` are both models' (``draft_weight_bytes`` the draft's part)
    and ``spec_bytes_per_request`` is what speculation adds to each request (the module docstring);
    ``kv_*`` and ``kda_*`` stay the target's; ``draft_transfer_bytes`` is the draft's part of
    ``transfer_bytes`` (its prompt blocks and one slot; 0 without a draft).
    """

    context_len: int
    memory_bytes: int
    weight_bytes: int
    workspace_bytes: int
    kv_blocks_per_request: int
    kv_bytes_per_request: int
    kda_bytes_per_request: int
    requests: int
    kv_blocks: int
    kv_bytes: int
    kda_slots: int
    kda_bytes: int
    free_bytes: int
    limiting: str
    draft_weight_bytes: int = 0
    spec_bytes_per_request: int = 0
    spec_bytes: int = 0
    draft_transfer_bytes: int = 0

    @property
    def transfer_bytes(self) -> int:
        """What one request's handoff writes: the target's blocks and slot, and the draft's."""
        return self.kv_bytes_per_request + self.kda_bytes_per_request + self.draft_transfer_bytes

    def fraction(self, part: str) -> float:
        """Share of ``memory_bytes`` taken by ``weight``, ``workspace``, ``kv``, ``kda``, ``spec`` or ``free``
        (``free`` is negative when weights and workspace overflow the memory)."""
        return getattr(self, f"{part}_bytes") / self.memory_bytes


def capacity_ledger(
    config: ModelConfig,
    dtype: torch.dtype,
    block_size: int,
    kv_format: str,
    batch_invariant: bool,
    max_num_batched_tokens: int,
    max_num_seqs: int = 256,
    tp: int = 1,
    dcp: int = 1,
    ep: int = 1,
) -> CapacityLedger:
    """Build the ledger of ``config`` served in ``dtype``, one rank's figures under ``tp`` x ``dcp``;
    reads no weights.

    Args:
        config: the validated model config.
        dtype: parameter, activation and (``kv_format="auto"``) KV dtype.
        block_size: tokens per packed block.
        kv_format: ``"auto"`` stores KV in ``dtype``; ``"fp8"`` packs latents and index keys in FP8
            (``block_layout``: 656 + 132 bytes per token and MLA layer at DeepSeek-V3.2's sizes).
        batch_invariant: slots also keep the CF-BI open-chunk rows (``C = 16``).
        max_num_batched_tokens: tokens in one step, for the workspace estimate.
        max_num_seqs: requests in one step; bounds the logits rows of the workspace.
        tp, dcp, ep: tensor-, decode-context- and expert-parallel degrees (the module docstring says
            what each splits); ``tp`` must divide the KDA heads.

    Raises:
        ValueError: a non-positive size, an unknown ``kv_format`` or a ``tp`` that does not divide the
            KDA heads, naming the argument.
    """
    for name, value in (
        ("block_size", block_size),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
        ("tp", tp),
        ("dcp", dcp),
        ("ep", ep),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format: {kv_format!r} is not supported (choose from {', '.join(KV_FORMATS)})")
    rank = ParallelContext(ParallelLayout(tp=tp, dcp=dcp, ep=ep))  # rank 0: shards are even
    num_parameters, weight_bytes, float32_bytes = weight_footprint(config, dtype, rank)
    mla_layers = config.layer_types.count(LAYER_MLA)
    kda_layers = config.layer_types.count(LAYER_KDA)
    block = block_layout(config, block_size, dtype, kv_format)
    if config.kda is not None and config.kda.num_heads % tp:
        raise ValueError(f"tp: {tp} does not divide the {config.kda.num_heads} KDA heads; pick a divisor")
    slot = slot_layout(config, dtype, CF_BI_CHUNK if batch_invariant else 0, tp)
    return CapacityLedger(
        family=config.family,
        dtype=str(dtype).removeprefix("torch."),
        block_size=block_size,
        kv_format=kv_format,
        batch_invariant=batch_invariant,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        num_parameters=num_parameters,
        weight_bytes=weight_bytes,
        float32_weight_bytes=float32_bytes,
        mla_layers=mla_layers,
        kda_layers=kda_layers,
        # Empty layouts still report one aligned unit; a model without the layer kind stores nothing.
        kv_block_bytes=block.nbytes if mla_layers else 0,
        kv_by_kind=_by_kind(block, per=block_size) if mla_layers else (),
        kda_slot_bytes=slot.nbytes if kda_layers else 0,
        kda_by_kind=_by_kind(slot, per=1) if kda_layers else (),
        workspace=workspace_terms(config, dtype, max_num_batched_tokens, max_num_seqs),
        tp=tp,
        dcp=dcp,
        ep=ep,
    )


def fit(
    ledger: CapacityLedger,
    memory_bytes: int,
    context_len: int,
    draft: CapacityLedger | None = None,
    num_draft_tokens: int = 0,
    rollback: str = "states",
) -> ContextFit:
    """Concurrent requests of ``context_len`` tokens that fit in ``memory_bytes`` beside the weights
    and workspace, each holding ``ceil(context_len / block_size)`` whole blocks and one KDA slot (and,
    with a ``draft`` model drafting ``num_draft_tokens``, the speculative part: module docstring;
    ``rollback`` is ``EngineConfig.rollback``).

    Raises:
        ValueError: ``memory_bytes`` or ``context_len`` below 1, or ``num_draft_tokens`` below 1 with a
            draft, naming it.
    """
    if memory_bytes < 1:
        raise ValueError(f"memory_bytes: must be positive, got {memory_bytes}")
    if context_len < 1:
        raise ValueError(f"context_len: must be >= 1, got {context_len}")
    if draft is not None and num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens: must be >= 1 with a draft, got {num_draft_tokens}")
    blocks = ledger.kv_blocks(context_len)
    kv, kda = blocks * ledger.kv_block_bytes, ledger.kda_slot_bytes
    weights, workspace, spec = ledger.weight_bytes, ledger.workspace_bytes, 0
    if draft is not None:
        weights += draft.weight_bytes
        workspace += draft.workspace_bytes
        drafted = context_len + num_draft_tokens
        rollback_slots = num_draft_tokens if rollback == "states" else 1
        spec = (
            rollback_slots * ledger.kda_slot_bytes
            + (ledger.kv_blocks(drafted) - blocks) * ledger.kv_block_bytes
            + draft.kv_blocks(drafted) * draft.kv_block_bytes
            + (1 + num_draft_tokens) * draft.kda_slot_bytes
        )
    room = memory_bytes - weights - workspace
    if room <= 0:
        requests = 0
        limiting = "weights" if weights >= memory_bytes else "workspace"
    else:
        requests = room // (kv + kda + spec)
        limiting = "kv" if kv >= kda else "kda_state"
    return ContextFit(
        context_len=context_len,
        memory_bytes=memory_bytes,
        weight_bytes=weights,
        workspace_bytes=workspace,
        kv_blocks_per_request=blocks,
        kv_bytes_per_request=kv,
        kda_bytes_per_request=kda,
        requests=requests,
        kv_blocks=requests * blocks,
        kv_bytes=requests * kv,
        kda_slots=requests if kda else 0,
        kda_bytes=requests * kda,
        free_bytes=room - requests * (kv + kda + spec),
        limiting=limiting,
        draft_weight_bytes=draft.weight_bytes if draft is not None else 0,
        spec_bytes_per_request=spec,
        spec_bytes=requests * spec,
        draft_transfer_bytes=draft.transfer_bytes(context_len) if draft is not None else 0,
    )


def weight_footprint(
    config: ModelConfig, dtype: torch.dtype, parallel: ParallelContext | None = None
) -> tuple[int, int, int]:
    """``(parameters, bytes, float32 bytes)`` of ``CausalLM(config, parallel)`` (one rank's shard; the
    whole model without ``parallel``) loaded in ``dtype``, counted on the meta device
    (``FLOAT32_PARAMETERS`` stay float32, as the loader keeps them)."""
    model = meta_model(config, parallel)
    count = total = in_float32 = 0
    for name, param in model.named_parameters():  # shared (tied) parameters are listed once
        count += param.numel()
        if name.endswith(FLOAT32_PARAMETERS):
            in_float32 += param.numel() * 4
        else:
            total += param.numel() * dtype.itemsize
    return count, total + in_float32, in_float32


def workspace_terms(
    config: ModelConfig, dtype: torch.dtype, max_num_batched_tokens: int, max_num_seqs: int
) -> tuple[tuple[str, int], ...]:
    """An ESTIMATE of one step's peak activations, as ``(term, bytes)``; ``T = max_num_batched_tokens``,
    ``b = dtype.itemsize``, ``D = hidden_size``.

    - ``hidden states``: ``3 T D b`` (the residual stream, the normed sublayer input, its output).
    - ``largest projection``: ``T W b`` for the widest projection output any layer makes: MLA query
      ``H (dn + dr)``, compressed KV ``Dc + dr``, expanded K/V ``H (dn + dv)``, indexer query
      ``Hi Di``, KDA fused q/k/v ``3 Hk dk``, dense or shared-expert gate + up ``2 I``.
    - ``MoE routed experts``: ``T k (2 D + 3 I) b`` for the ``T k`` routed token copies (gathered
      input, gate + up output, SiLU product, expert output), plus float32 router scores ``T E 4``.
    - ``logits``: ``R V (b + 4)`` for ``R = min(max_num_seqs, T)`` sampled rows (model dtype, then
      the sampler's float32 copy).

    Not counted: attention score tiles (fused kernels tile them; DSA reads only ``topk`` keys), the
    allocator's fragmentation, CUDA context and graphs, communication buffers. Keep a margin.
    """
    tokens, width, itemsize = max_num_batched_tokens, config.hidden_size, dtype.itemsize
    heads = config.num_attention_heads
    widths = {
        "MLA query": heads * config.qk_head_dim,
        "MLA compressed KV": config.kv_lora_rank + config.qk_rope_head_dim,
        "MLA expanded K/V": heads * (config.qk_nope_head_dim + config.v_head_dim),
    }
    if config.indexer is not None:
        widths["indexer query"] = config.indexer.n_heads * config.indexer.head_dim
    if config.kda is not None:
        widths["KDA q/k/v"] = 3 * config.kda.num_heads * config.kda.head_dim
    if MLP_DENSE in config.mlp_types:
        widths["dense MLP gate+up"] = 2 * config.intermediate_size
    if config.moe is not None and config.moe.num_shared_experts:
        widths["shared experts gate+up"] = 2 * config.moe.intermediate_size * config.moe.num_shared_experts
    widest = max(widths, key=widths.get)
    terms = [
        ("hidden states", 3 * tokens * width * itemsize),
        (f"largest projection ({widest})", tokens * widths[widest] * itemsize),
    ]
    if config.moe is not None:
        moe = config.moe
        routed = tokens * moe.num_experts_per_tok * (2 * width + 3 * moe.intermediate_size) * itemsize
        terms.append(("MoE routed experts", routed + tokens * moe.num_experts * 4))
    rows = min(max_num_seqs, tokens)
    terms.append((f"logits ({rows} rows)", rows * config.vocab_size * (itemsize + 4)))
    return tuple(terms)


def _by_kind(layout: Layout, per: int) -> tuple[tuple[str, int], ...]:
    totals: dict[str, int] = {}
    for field in layout.fields:
        totals[field.kind] = totals.get(field.kind, 0) + field.nbytes // per
    return tuple(totals.items())


def format_bytes(size: float) -> str:
    """``656 B``, ``3.50 KiB``, ``12.5 MiB``, ``131 GiB``: about three significant figures from KiB up."""
    if abs(size) < 1024:
        return f"{size:g} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if abs(size) < 1024 or unit == "TiB":
            break
    decimals = 2 if abs(size) < 10 else 1 if abs(size) < 100 else 0
    return f"{size:.{decimals}f} {unit}"


def ledger_dict(ledger: CapacityLedger) -> dict:
    """The ledger as plain JSON-ready values (pairs as objects, derived totals added)."""
    out = asdict(ledger)
    for key in ("kv_by_kind", "kda_by_kind", "workspace"):
        out[key] = dict(getattr(ledger, key))
    per_token = ledger.kv_bytes_per_token
    out["kv_bytes_per_token"] = int(per_token) if per_token.is_integer() else per_token
    out["workspace_bytes"] = ledger.workspace_bytes
    out["workspace_is_estimate"] = True
    return out


def fit_dict(result: ContextFit) -> dict:
    """The fit as plain JSON-ready values, with the transfer bytes and each part's memory fraction."""
    out = asdict(result)
    out["transfer_bytes"] = result.transfer_bytes
    parts = ("weight", "workspace", "kv", "kda", "spec", "free")
    out["fractions"] = {part: result.fraction(part) for part in parts}
    return out
