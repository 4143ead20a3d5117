"""Which bytes of which prefill rank go where on which decode rank: the cross-layout handoff plan.

A prefill group (``tp x dcp x pcp x pp`` ranks) writes one request's cache state into a decode
group's reservation (``tp x dcp`` ranks) with no gather on one rank: each prefill rank sends bytes it
holds to the decode ranks that own them. What a rank's pools hold (docs/parallel.md):

- packed blocks (the MLA layers' latent, rope and index-key rows): whole on every TP and PCP rank,
  only the stage's layers under PP; under DCP ``D`` token ``p`` sits on DCP rank ``p % D``, in the
  block of table entry ``p // (D B)`` at row ``(p % (D B)) // D`` (``dcp_shard.py``, ``B`` the pool's
  ``--block-size``; ``D = 1``: ordinary blocks);
- the KDA state slot: TP rank ``t`` holds heads ``[t H/tp, (t+1) H/tp)`` of its stage's KDA layers
  (the conv tail's channels are the q | k | v blocks of those heads), whole on every DCP and PCP rank::

    decode dcp 2, B = 2 (virtual blocks of 4)        prefill, one rank, B = 4
    token      0 1 2 3 | 4 5 6 7                     token   0 1 2 3 | 4 5 6 7
    dcp rank   0 1 0 1 | 0 1 0 1                     block   ids[0]  | ids[1]
    row        0 0 1 1 | 0 0 1 1  (block ids[0] | ids[1] on both decode ranks)

Every byte a decode rank needs is sent by exactly one prefill rank. Among the ranks that hold it (the
stage's TP and PCP replicas) the sender rotates with the decode rank and decode block (block rows) or
the decode rank and layer (state), so the work spreads. A prefill rank gathers its bytes into one
staging buffer (in decode order) and writes contiguous runs of it; runs are coalesced on both sides,
and a run that is a whole field on both sides takes the field's alignment padding along, so equal
layouts move whole blocks and slots.
"""

from collections.abc import Collection
from dataclasses import dataclass

import torch

from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.cache.layout import (
    ALIGNMENT,
    CONV,
    OPEN_COUNT,
    OPEN_DELTA,
    OPEN_G,
    OPEN_K,
    RECURRENT,
    Field,
    Layout,
    block_layout,
    slot_layout,
    stage_layout,
)
from services.engine.engine_config import EngineConfig
from services.engine.model.config import LAYER_KDA, ModelConfig
from services.transfer import BLOCKS, STATE

from .handoff_send import RankSend, SendBuilder
from .layout import ParallelLayout
from .pipeline import stage_layers

_OPEN_ROWS = (OPEN_K, OPEN_G, OPEN_DELTA)


@dataclass(frozen=True)
class HandoffSide:
    """One group's pools as the plan sees them.

    Args:
        parallel: the group's degrees (a decode group: tp, dcp; a prefill group: tp, dcp, pcp, pp).
        block_size: tokens per block of a rank's pool (``--block-size``; a table entry covers
            ``dcp * block_size`` tokens).
        dtype: the model dtype.
        kv_format: ``auto`` or ``fp8``.
        open_chunk_rows: the KDA slot's open-chunk rows (0 in the default numerics, the CF-BI chunk in
            batch-invariant mode).
    """

    parallel: ParallelLayout
    block_size: int
    dtype: torch.dtype
    kv_format: str = "auto"
    open_chunk_rows: int = 0

    @classmethod
    def of_engine(cls, config: EngineConfig, dtype: torch.dtype) -> "HandoffSide":
        """The side an engine's ranks are (``dtype``: its model's), as ``CacheManager.for_model`` lays out
        their pools."""
        return cls(
            config.layout,
            config.block_size,
            dtype,
            config.kv_format,
            FIXED_CHUNK if config.batch_invariant else 0,
        )

    @property
    def tokens_per_block(self) -> int:
        """Tokens one block id covers: ``dcp * block_size``."""
        return self.parallel.dcp * self.block_size

    def rank_layouts(self, config: ModelConfig, rank: int) -> tuple[Layout, Layout]:
        """``(block layout, slot layout)`` of ``rank``'s pools, as ``CacheManager.for_model`` builds them."""
        layers = stage_layers(config.num_hidden_layers, self.parallel.pp, self.parallel.coordinates(rank).pp)
        blocks = block_layout(config, self.block_size, self.dtype, self.kv_format)
        slots = slot_layout(config, self.dtype, self.open_chunk_rows, self.parallel.tp)
        return stage_layout(blocks, layers), stage_layout(slots, layers)


@dataclass(frozen=True)
class HandoffRequestRows:
    """Where one request's state is on the prefill group and goes on the decode group.

    ``num_tokens`` cached tokens; block ids are table entries (each covering ``tokens_per_block`` of
    its side), the same on every rank of a group, as is the slot. ``decode_held_tokens``: the leading
    tokens the decode group already holds (its own prefix hit, whole decode blocks): their block rows
    are not sent.
    """

    num_tokens: int
    prefill_block_ids: tuple[int, ...]
    prefill_slot: int
    decode_block_ids: tuple[int, ...]
    decode_slot: int
    decode_held_tokens: int = 0


def check_mappable(config: ModelConfig, prefill: HandoffSide, decode: HandoffSide) -> None:
    """Refuse a pair of groups the plan cannot map (at Reserve, before any prefill work).

    Raises:
        ValueError: naming the field: a decode group with ``pp`` or ``pcp`` above 1, a different dtype,
            KV format or numerics (open-chunk rows), a block size below 1, or a ``tp`` that does not
            divide the KDA heads.
    """
    for name in ("pp", "pcp"):
        degree = getattr(decode.parallel, name)
        if degree > 1:
            raise ValueError(
                f"decode --{name} {degree}: a handoff target is a tp x dcp group; "
                f"serve decode with --{name} 1"
            )
    for name, what in (("dtype", "dtype"), ("kv_format", "kv_format"), ("open_chunk_rows", "numerics")):
        theirs, ours = getattr(decode, name), getattr(prefill, name)
        if theirs != ours:
            raise ValueError(
                f"reservation.layout.{what}: decode group has {theirs}, prefill group has {ours} "
                f"({name}); run both with the same setting"
            )
    for role, side in (("prefill", prefill), ("decode", decode)):
        if side.block_size < 1:
            raise ValueError(f"{role} --block-size {side.block_size}: must be at least 1")
        if (
            config.kda is not None
            and LAYER_KDA in config.layer_types
            and config.kda.num_heads % side.parallel.tp
        ):
            raise ValueError(
                f"{role} --tp {side.parallel.tp}: does not divide the {config.kda.num_heads} KDA heads; "
                f"pick a divisor of {config.kda.num_heads}"
            )
        stage_layers(config.num_hidden_layers, side.parallel.pp, 0)  # --pp beyond the layers


def plan_handoff(
    config: ModelConfig,
    prefill: HandoffSide,
    decode: HandoffSide,
    rows: HandoffRequestRows,
    senders: Collection[int] | None = None,
) -> dict[int, RankSend]:
    """The prefill ranks' sends for one request: an entry for each rank of ``senders`` (default: every
    rank of the prefill group; a rank planning only its own part passes ``[rank]``).

    Over all the group's ranks, every byte of the request's rows (tokens ``decode_held_tokens ..
    num_tokens - 1`` of each block field) and of its slot's fields, on every decode rank, is written
    exactly once; beyond them only alignment padding after a field that is copied whole. The plan is a
    pure function of its arguments, so each rank may compute its own part.

    Raises:
        ValueError: ``check_mappable``'s errors, no tokens, too few block ids on a side, or a sender outside
            the group (naming the field).
    """
    check_mappable(config, prefill, decode)
    if rows.num_tokens < 1:
        raise ValueError(f"num_tokens: a handoff moves at least one cached token, got {rows.num_tokens}")
    held = rows.decode_held_tokens
    if held < 0 or held % decode.tokens_per_block or held >= rows.num_tokens:
        raise ValueError(
            f"decode_held_tokens: {held} is not whole decode blocks of {decode.tokens_per_block} tokens "
            f"below num_tokens {rows.num_tokens}"
        )
    for role, side, ids in (
        ("prefill", prefill, rows.prefill_block_ids),
        ("decode", decode, rows.decode_block_ids),
    ):
        needed = -(-rows.num_tokens // side.tokens_per_block)
        if len(ids) < needed:
            raise ValueError(
                f"{role}_block_ids: {len(ids)} blocks for {rows.num_tokens} tokens of "
                f"{side.tokens_per_block} per block; need {needed}"
            )
    ranks = range(prefill.parallel.world_size)
    if senders is not None and not set(senders) <= set(ranks):
        raise ValueError(f"senders: {sorted(senders)} are not all ranks of the prefill group ({ranks})")
    copies = SendBuilder(ranks if senders is None else senders)
    _plan_blocks(config, prefill, decode, rows, copies)
    _plan_state(config, prefill, decode, rows, copies)
    return {rank: copies.rank_send(rank) for rank in sorted(copies.senders)}


def landing_spans(
    config: ModelConfig,
    decode: HandoffSide,
    decode_rank: int,
    num_tokens: int,
    block_ids: tuple[int, ...],
    slot: int,
    held_tokens: int = 0,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The bytes of decode rank ``decode_rank`` that a handoff of ``num_tokens`` cached tokens into
    ``block_ids`` / ``slot`` fills with state, seen from the decode side alone: per region, ``(offsets,
    nbytes)`` int64 runs. Over every prefill group, these are exactly the ``hashed`` bytes of
    ``plan_handoff``'s sends into that rank (every field's rows of the rank's tokens after
    ``held_tokens``, and every slot field whole, without padding), so the decode side checks a parallel
    handoff's checksum without knowing the prefill group."""
    blocks, slots = decode.rank_layouts(config, decode_rank)
    spans = {}
    tokens = torch.arange(
        held_tokens + decode.parallel.coordinates(decode_rank).dcp, num_tokens, decode.parallel.dcp
    )
    if blocks.fields and len(tokens):
        table = torch.tensor(block_ids, dtype=torch.int64)[tokens // decode.tokens_per_block]
        row_of = (tokens % decode.tokens_per_block) // decode.parallel.dcp
        offsets, nbytes = [], []
        for field in blocks.fields:
            row = field.nbytes // field.shape[0]
            offsets.append(table * blocks.nbytes + field.offset + row_of * row)
            nbytes.append(torch.full_like(tokens, row))
        spans[BLOCKS] = (torch.cat(offsets), torch.cat(nbytes))
    if slots.fields:
        offsets = torch.tensor([slot * slots.nbytes + field.offset for field in slots.fields])
        spans[STATE] = (offsets, torch.tensor([field.nbytes for field in slots.fields]))
    return spans


def _plan_blocks(
    config: ModelConfig,
    prefill: HandoffSide,
    decode: HandoffSide,
    rows: HandoffRequestRows,
    copies: SendBuilder,
) -> None:
    """Each decode rank's block rows of the request, from a replica of the stage holding the layer."""
    source = prefill.parallel
    stage_blocks = [prefill.rank_layouts(config, stage * source.stage_size)[0] for stage in range(source.pp)]
    for decode_rank in range(decode.parallel.world_size):
        layout = decode.rank_layouts(config, decode_rank)[0]
        first = rows.decode_held_tokens + decode.parallel.coordinates(decode_rank).dcp  # held: whole blocks
        tokens = torch.arange(first, rows.num_tokens, decode.parallel.dcp)
        if not layout.fields or not len(tokens):
            continue
        sender, src_block, src_row, dst_block, dst_row, count = _token_runs(
            tokens, decode_rank, prefill, decode, rows
        )
        for run_sender in sender.unique().tolist():
            mine = sender == run_sender
            runs = (src_block[mine], src_row[mine], dst_block[mine], dst_row[mine], count[mine])
            for stage, source_layout in enumerate(stage_blocks):
                _add_block_rows(
                    copies, run_sender + stage * source.stage_size, decode_rank, source_layout, layout, runs
                )


def _add_block_rows(
    copies: SendBuilder, sender: int, decode_rank: int, source: Layout, target: Layout, runs: tuple
) -> None:
    """The copies of ``runs`` (one sender's, ``_token_runs``' columns) for the fields both layouts hold."""
    if sender not in copies.senders:
        return
    src_block, src_row, dst_block, dst_row, count = runs
    for field in target.fields:
        if not source.has(field.layer, field.kind):
            continue
        source_field = source.field(field.layer, field.kind)
        row = field.nbytes // field.shape[0]
        whole = (count == field.shape[0]) & (count == source_field.shape[0]) & (src_row == 0) & (dst_row == 0)
        copies.add(
            sender,
            BLOCKS,
            decode_rank,
            src_block * source.nbytes + source_field.offset + src_row * row,
            dst_block * target.nbytes + field.offset + dst_row * row,
            torch.where(whole, _aligned(field.nbytes), count * row),
            count * row,
        )


def _token_runs(
    tokens: torch.Tensor,
    decode_rank: int,
    prefill: HandoffSide,
    decode: HandoffSide,
    rows: HandoffRequestRows,
) -> tuple[torch.Tensor, ...]:
    """One decode rank's ``tokens`` (increasing) in runs that are consecutive rows on both sides and come
    from one sender: ``(sender, source block, source row, decode block, decode row, tokens)`` per run,
    int64 ``[R]``; the sender is its rank in stage 0 (the same place in every stage)."""
    source = prefill.parallel
    table_index = tokens // decode.tokens_per_block
    dst_block = torch.tensor(rows.decode_block_ids, dtype=torch.int64)[table_index]
    dst_row = (tokens % decode.tokens_per_block) // decode.parallel.dcp
    src_block = torch.tensor(rows.prefill_block_ids, dtype=torch.int64)[tokens // prefill.tokens_per_block]
    src_row = (tokens % prefill.tokens_per_block) // source.dcp
    # the stage's ranks holding the token: its DCP owner's TP x PCP replicas, rotating per decode block
    replica = (decode_rank + table_index) % (source.tp * source.pcp)
    sender = replica % source.tp + source.tp * (tokens % source.dcp + source.dcp * (replica // source.tp))
    joins = (
        (sender[1:] == sender[:-1])
        & (src_block[1:] == src_block[:-1])
        & (src_row[1:] == src_row[:-1] + 1)
        & (dst_block[1:] == dst_block[:-1])
        & (dst_row[1:] == dst_row[:-1] + 1)
    )
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.nonzero(~joins)[:, 0] + 1])
    count = torch.diff(starts, append=torch.tensor([len(tokens)]))
    return sender[starts], src_block[starts], src_row[starts], dst_block[starts], dst_row[starts], count


def _plan_state(
    config: ModelConfig,
    prefill: HandoffSide,
    decode: HandoffSide,
    rows: HandoffRequestRows,
    copies: SendBuilder,
) -> None:
    """Each decode rank's slot: per KDA layer, its heads from the prefill TP ranks holding them (a
    replica of each, rotating per decode rank and layer); the open-row count whole."""
    if config.kda is None:
        return
    source = prefill.parallel
    src_heads = config.kda.num_heads // source.tp
    dst_heads = config.kda.num_heads // decode.parallel.tp
    stage_slots = [prefill.rank_layouts(config, stage * source.stage_size)[1] for stage in range(source.pp)]
    for decode_rank in range(decode.parallel.world_size):
        layout = decode.rank_layouts(config, decode_rank)[1]
        first = decode.parallel.coordinates(decode_rank).tp * dst_heads  # the decode rank's first head
        ordinal = {layer: index for index, layer in enumerate(sorted({f.layer for f in layout.fields}))}
        for stage, source_layout in enumerate(stage_slots):
            for field in layout.fields:
                if not source_layout.has(field.layer, field.kind):
                    continue
                source_field = source_layout.field(field.layer, field.kind)
                replica = (decode_rank + ordinal[field.layer]) % (source.dcp * source.pcp)
                src_base = rows.prefill_slot * source_layout.nbytes + source_field.offset
                dst_base = rows.decode_slot * layout.nbytes + field.offset
                for tp, src, dst, nbytes in _head_pieces(field, first, dst_heads, src_heads):
                    sender = source.rank_of(tp, replica % source.dcp, replica // source.dcp, stage)
                    hashed = nbytes.clamp(max=field.nbytes)  # a whole field: not its padding
                    copies.add(sender, STATE, decode_rank, src + src_base, dst + dst_base, nbytes, hashed)


def _head_pieces(
    field: Field, first: int, dst_heads: int, src_heads: int
) -> list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The pieces of a decode slot field holding heads ``[first, first + dst_heads)``, from source fields
    of ``src_heads`` heads per TP rank: ``(source TP rank, source offsets, decode offsets, bytes)``, offsets
    inside the fields. A field is ``outer`` blocks of ``[heads, per-head bytes]`` (the recurrent state 1,
    the conv tail's q | k | v 3, the open rows one per row); the open-row count goes whole.
    """
    whole = torch.tensor([_aligned(field.nbytes)])
    zero = torch.zeros(1, dtype=torch.int64)
    if field.kind == OPEN_COUNT:
        return [(first // src_heads, zero, zero, whole)]
    outer = {RECURRENT: 1, CONV: 3}.get(field.kind) or (field.shape[0] if field.kind in _OPEN_ROWS else 0)
    if not outer:
        raise ValueError(
            f"slot field {field.kind!r} of layer {field.layer}: the handoff plan cannot split it by head"
        )
    if dst_heads == src_heads:
        return [(first // src_heads, zero, zero, whole)]
    per_head = field.nbytes // (outer * dst_heads)
    block = torch.arange(outer)
    pieces = []
    for tp in range(first // src_heads, -(-(first + dst_heads) // src_heads)):
        low, high = max(first, tp * src_heads), min(first + dst_heads, (tp + 1) * src_heads)
        src = (block * src_heads + low - tp * src_heads) * per_head
        dst = (block * dst_heads + low - first) * per_head
        pieces.append((tp, src, dst, torch.full_like(src, (high - low) * per_head)))
    return pieces


def _aligned(nbytes: int) -> int:
    """A field's bytes with its alignment padding (``_pack`` places the next field there)."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT
