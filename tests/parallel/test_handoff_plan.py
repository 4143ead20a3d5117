"""The cross-layout handoff plan, run by its CPU reference, against an independent sharding of one
global cache image: every decode rank ends bitwise with the rows and state heads it owns, nothing else
changes (alignment padding inside the request's blocks and slot aside), each byte is written once, and
each prefill rank stages each of its bytes once (never more than it holds)."""

from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch

from services.engine.cache.layout import (
    CONV,
    OPEN_COUNT,
    RECURRENT,
    block_layout,
    slot_layout,
    stage_layout,
)
from services.engine.cache_manager import CacheManager
from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.engine_config import EngineConfig
from services.engine.model.config import ModelConfig
from services.engine.model.config_loader import load_model_config
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.handoff_plan import (
    HandoffRequestRows,
    HandoffSide,
    check_mappable,
    landing_spans,
    plan_handoff,
)
from services.engine.parallel.handoff_send import apply_plan_reference
from services.engine.parallel.layout import ParallelLayout
from services.engine.parallel.pipeline import stage_layers
from services.transfer import BLOCKS, STATE

# 8 layers: MLA at 3 and 7 (one per stage under --pp 2), KDA elsewhere; 4 KDA heads of 16.
CONFIG = load_model_config(with_layers(preset_config("k3", "tiny"), 8))
_SIX_HEADS = with_layers(preset_config("k3", "tiny"), 8)
_SIX_HEADS["linear_attn_config"] = {**_SIX_HEADS["linear_attn_config"], "num_heads": 6}
SIX_HEADS = load_model_config(_SIX_HEADS)  # TP 2 and 3 split its KDA heads 3 + 3 and 2 + 2 + 2
DTYPE = torch.bfloat16
NUM_BLOCKS, NUM_SLOTS = 24, 3


@dataclass(frozen=True)
class Case:
    prefill: ParallelLayout
    prefill_block: int
    decode: ParallelLayout
    decode_block: int
    num_tokens: int
    kv_format: str = "auto"
    open_rows: int = 0
    config: ModelConfig = CONFIG
    decode_held: int = 0  # leading tokens the decode group holds already: their rows stay untouched


CASES = {
    "pcp2-to-dcp2": Case(ParallelLayout(pcp=2), 4, ParallelLayout(dcp=2), 4, 21),
    "pp2xpcp2-to-tp2xdcp2": Case(ParallelLayout(pcp=2, pp=2), 8, ParallelLayout(tp=2, dcp=2), 4, 37),
    "tp2-to-tp1": Case(ParallelLayout(tp=2), 4, ParallelLayout(), 4, 13),
    "tp1-to-tp2": Case(ParallelLayout(), 4, ParallelLayout(tp=2), 8, 13),
    "pp2-to-dcp4-partial": Case(ParallelLayout(pp=2), 4, ParallelLayout(dcp=4), 2, 19),
    "tp4xdcp2-to-tp2": Case(ParallelLayout(tp=4, dcp=2), 2, ParallelLayout(tp=2), 4, 11),
    "same-layout": Case(ParallelLayout(), 3, ParallelLayout(), 3, 11),  # rope rows of 48 bytes: padding
    "fp8-pcp2-to-tp2": Case(ParallelLayout(pcp=2), 4, ParallelLayout(tp=2), 4, 15, kv_format="fp8"),
    "six-heads-tp2-to-tp3": Case(ParallelLayout(tp=2), 4, ParallelLayout(tp=3), 4, 10, config=SIX_HEADS),
    "invariant-six-heads-tp3-to-tp2": Case(
        ParallelLayout(tp=3), 4, ParallelLayout(tp=2), 4, 7, open_rows=16, config=SIX_HEADS
    ),
    "invariant-tp2xpcp2-to-tp4": Case(
        ParallelLayout(tp=2, pcp=2), 4, ParallelLayout(tp=4), 4, 9, open_rows=16
    ),
    "decode-holds-a-block-pcp2-to-dcp2": Case(
        ParallelLayout(pcp=2), 4, ParallelLayout(dcp=2), 4, 21, decode_held=8
    ),
    "decode-holds-two-blocks-same-layout": Case(ParallelLayout(), 3, ParallelLayout(), 3, 11, decode_held=6),
}


def sides(case: Case) -> tuple[HandoffSide, HandoffSide]:
    def side(parallel, block):
        return HandoffSide(parallel, block, DTYPE, case.kv_format, case.open_rows)

    return side(case.prefill, case.prefill_block), side(case.decode, case.decode_block)


def request_rows(case: Case) -> HandoffRequestRows:
    """Scattered, non-adjacent block ids so that coalescing across blocks cannot hide a bug."""
    prefill = -(-case.num_tokens // (case.prefill.dcp * case.prefill_block))
    decode = -(-case.num_tokens // (case.decode.dcp * case.decode_block))
    return HandoffRequestRows(
        case.num_tokens,
        tuple(range(NUM_BLOCKS - 2, NUM_BLOCKS - 2 - 2 * prefill, -2)),
        2,
        tuple(range(1, 1 + 3 * decode, 3)),
        1,
        case.decode_held,
    )


def rank_layouts(case: Case, parallel: ParallelLayout, block_size: int, rank: int):
    """A rank's (block, slot) layouts, built here from the cache layout functions as the pools are."""
    config = case.config
    layers = stage_layers(config.num_hidden_layers, parallel.pp, parallel.coordinates(rank).pp)
    blocks = block_layout(config, block_size, DTYPE, case.kv_format)
    slots = slot_layout(config, DTYPE, case.open_rows, parallel.tp)
    return stage_layout(blocks, layers), stage_layout(slots, layers)


class GlobalCache:
    """One request's cache on one rank (no parallelism), as random bytes per field: each token's
    block row, and each KDA field as ``[blocks, heads, per-head bytes]`` (``blocks``: the conv tail's
    q | k | v, the open rows, or 1 for the recurrent state) or whole (the open-row count)."""

    def __init__(self, case: Case, generator: torch.Generator):
        self.case = case
        self.rows, self.state = {}, {}
        heads = case.config.kda.num_heads
        for field in block_layout(case.config, 1, DTYPE, case.kv_format).fields:
            shape = (case.num_tokens, field.nbytes)
            self.rows[field.layer, field.kind] = torch.randint(
                0, 256, shape, dtype=torch.uint8, generator=generator
            )
        for field in slot_layout(case.config, DTYPE, case.open_rows).fields:
            if field.kind == OPEN_COUNT:
                shape = (field.nbytes,)
            else:
                outer = 1 if field.kind == RECURRENT else 3 if field.kind == CONV else field.shape[0]
                shape = (outer, heads, field.nbytes // (outer * heads))
            self.state[field.layer, field.kind] = torch.randint(
                0, 256, shape, dtype=torch.uint8, generator=generator
            )

    def write_rank(
        self, parallel: ParallelLayout, block_size: int, rank: int, pools, block_ids, slot, first_token=0
    ) -> None:
        """What ``rank`` of a group holds of this cache, written into its pools ``(blocks, state)``: the
        block rows of tokens from ``first_token`` (a multiple of the group's block) on, the state whole."""
        coords = parallel.coordinates(rank)
        block_fields, slot_fields = rank_layouts(self.case, parallel, block_size, rank)
        blocks, state = pools
        span = parallel.dcp * block_size  # tokens per block id
        for field in block_fields.fields:
            row_bytes = field.nbytes // block_size
            for token in range(first_token + coords.dcp, self.case.num_tokens, parallel.dcp):
                start = field.offset + (token % span) // parallel.dcp * row_bytes
                blocks[block_ids[token // span], start : start + row_bytes] = self.rows[
                    field.layer, field.kind
                ][token]
        heads = self.case.config.kda.num_heads // parallel.tp
        for field in slot_fields.fields:
            value = self.state[field.layer, field.kind]
            if field.kind != OPEN_COUNT:
                value = value[:, coords.tp * heads : (coords.tp + 1) * heads]
            state[slot, field.offset : field.offset + field.nbytes] = value.flatten()


def random_pools(case: Case, parallel: ParallelLayout, block_size: int, generator) -> dict:
    pools = {}
    for rank in range(parallel.world_size):
        blocks, slots = rank_layouts(case, parallel, block_size, rank)
        pools[rank] = (
            torch.randint(0, 256, (NUM_BLOCKS, blocks.nbytes), dtype=torch.uint8, generator=generator),
            torch.randint(0, 256, (NUM_SLOTS, slots.nbytes), dtype=torch.uint8, generator=generator),
        )
    return pools


def padding(layout, rows: int, ids) -> torch.Tensor:
    """``[rows, layout.nbytes]`` bool: the bytes of rows ``ids`` that no field holds."""
    free = torch.ones(layout.nbytes, dtype=torch.bool)
    for field in layout.fields:
        free[field.offset : field.offset + field.nbytes] = False
    mask = torch.zeros(rows, layout.nbytes, dtype=torch.bool)
    mask[list(ids)] = free
    return mask


def run_case(case: Case):
    """Plan and apply ``case``; returns the plan after checking every decode rank's pools."""
    generator = torch.Generator().manual_seed(0)
    prefill, decode = sides(case)
    rows = request_rows(case)
    cache = GlobalCache(case, generator)
    prefill_pools = random_pools(case, case.prefill, case.prefill_block, generator)
    for rank, pools in prefill_pools.items():
        cache.write_rank(
            case.prefill, case.prefill_block, rank, pools, rows.prefill_block_ids, rows.prefill_slot
        )
    decode_pools = random_pools(case, case.decode, case.decode_block, generator)
    expected = {rank: tuple(pool.clone() for pool in pools) for rank, pools in decode_pools.items()}
    for rank, pools in expected.items():  # the rows decode holds stay as they were: never written
        cache.write_rank(
            case.decode,
            case.decode_block,
            rank,
            pools,
            rows.decode_block_ids,
            rows.decode_slot,
            case.decode_held,
        )

    plan = plan_handoff(case.config, prefill, decode, rows)
    apply_plan_reference(plan, prefill_pools, decode_pools)

    for rank in decode_pools:
        block_fields, slot_fields = rank_layouts(case, case.decode, case.decode_block, rank)
        may_differ = (
            padding(block_fields, NUM_BLOCKS, rows.decode_block_ids),
            padding(slot_fields, NUM_SLOTS, [rows.decode_slot]),
        )
        for region, got, want, free in zip(
            (BLOCKS, STATE), decode_pools[rank], expected[rank], may_differ, strict=True
        ):
            assert torch.equal(got[~free], want[~free]), f"decode rank {rank}, {region}"
    assert_written_once(plan)
    assert_hashed_bytes_are_the_landing_spans(case, plan, rows, decode)
    for rank, send in plan.items():  # each byte staged once: never more than the rank holds
        block_bytes, slot_bytes = (pool.shape[1] for pool in prefill_pools[rank])
        held = -(-rows.num_tokens // prefill.tokens_per_block) * block_bytes + slot_bytes
        assert send.staging_nbytes <= held, (rank, send.staging_nbytes, held)
    return plan


def _byte_set(offsets, nbytes) -> set[int]:
    return {
        byte
        for offset, size in zip(offsets.tolist(), nbytes.tolist(), strict=True)
        for byte in range(offset, offset + size)
    }


def assert_hashed_bytes_are_the_landing_spans(case, plan, rows, decode) -> None:
    """The bytes the senders hash (their writes without padding) are, per decode rank and region, the
    bytes that rank computes alone (``landing_spans``), each hashed once, and inside the writes."""
    hashed: dict[tuple[int, str], list[int]] = {}
    written: dict[tuple[int, str], set[int]] = {}
    for send in plan.values():
        for write in send.writes:
            written.setdefault((write.decode_rank, write.region), set()).update(
                _byte_set(write.remote_offsets, write.nbytes)
            )
        for run in send.hashed:
            assert torch.equal(run.staging_offsets.sort().values, run.staging_offsets)
            hashed.setdefault((run.decode_rank, run.region), []).extend(
                _byte_set(run.remote_offsets, run.nbytes)
            )
    for rank in range(decode.parallel.world_size):
        landing = landing_spans(
            case.config,
            decode,
            rank,
            rows.num_tokens,
            rows.decode_block_ids,
            rows.decode_slot,
            rows.decode_held_tokens,
        )
        for region in (BLOCKS, STATE):
            bytes_hashed = hashed.get((rank, region), [])
            assert len(bytes_hashed) == len(set(bytes_hashed)), f"decode rank {rank}, {region}: hashed twice"
            want = _byte_set(*landing[region]) if region in landing else set()
            assert set(bytes_hashed) == want, f"decode rank {rank}, {region}"
            assert want <= written.get((rank, region), set())


def assert_written_once(plan) -> None:
    """No two writes (of any prefill rank) touch the same byte of a decode rank's region."""
    written: dict[tuple[int, str], list[torch.Tensor]] = {}
    for send in plan.values():
        for write in send.writes:
            for offset, nbytes in zip(write.remote_offsets.tolist(), write.nbytes.tolist(), strict=True):
                written.setdefault((write.decode_rank, write.region), []).append(
                    torch.arange(offset, offset + nbytes)
                )
    for key, parts in written.items():
        touched = torch.cat(parts)
        assert len(touched.unique()) == len(touched), f"a byte of {key} written twice"


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decode_ranks_end_with_their_rows_bitwise(case):
    plan = run_case(case)
    assert set(plan) == set(range(case.prefill.world_size))


def test_a_rank_planning_its_own_part_gets_the_full_plan_s_entry():
    case = CASES["pp2xpcp2-to-tp2xdcp2"]
    prefill, decode = sides(case)
    full = plan_handoff(CONFIG, prefill, decode, request_rows(case))
    for rank, send in full.items():
        (own,) = plan_handoff(CONFIG, prefill, decode, request_rows(case), senders=[rank]).values()
        assert own.staging_nbytes == send.staging_nbytes > 0
        for mine, theirs in zip(own.gather + own.writes, send.gather + send.writes, strict=True):
            assert all(
                torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                for a, b in zip(vars(mine).values(), vars(theirs).values(), strict=True)
            )


def writes_of(send, region):
    return [
        (write.decode_rank, offset, nbytes)
        for write in send.writes
        if write.region == region
        for offset, nbytes in zip(write.remote_offsets.tolist(), write.nbytes.tolist(), strict=True)
    ]


def test_same_layout_moves_whole_blocks_and_the_whole_slot():
    case = CASES["same-layout"]  # 11 tokens of 3 per block: 3 whole blocks, then rows 0 and 1
    plan = run_case(case)
    rows = request_rows(case)
    blocks, slots = rank_layouts(case, case.decode, case.decode_block, 0)
    last = rows.decode_block_ids[3] * blocks.nbytes
    partial = [(0, last + f.offset, 2 * f.nbytes // 3) for f in blocks.fields]
    whole = [(0, block * blocks.nbytes, blocks.nbytes) for block in rows.decode_block_ids[:3]]
    assert writes_of(plan[0], BLOCKS) == whole + partial
    assert writes_of(plan[0], STATE) == [(0, rows.decode_slot * slots.nbytes, slots.nbytes)]
    gathered = [(runs.region, runs.offsets.tolist(), runs.nbytes.tolist()) for runs in plan[0].gather]
    assert gathered[1] == (STATE, [rows.prefill_slot * slots.nbytes], [slots.nbytes])


@pytest.mark.parametrize(
    ("case", "writes_per_block"),
    [
        (Case(ParallelLayout(pcp=2), 4, ParallelLayout(tp=2), 4, 16), 1),
        (Case(ParallelLayout(tp=2, pcp=2, pp=2), 4, ParallelLayout(tp=2), 4, 16), 2),
    ],
    ids=["pcp2-to-tp2", "pp2-to-tp2"],
)
def test_a_decode_block_is_one_write_per_stage_and_the_work_spreads(case, writes_per_block):
    plan = run_case(case)
    blocks = len(request_rows(case).decode_block_ids)
    assert sum(len(writes_of(send, BLOCKS)) for send in plan.values()) == 2 * blocks * writes_per_block
    staged = [send.staging_nbytes for send in plan.values()]
    assert min(staged) > 0 and max(staged) <= 2 * min(staged)


def test_bytes_several_decode_ranks_need_are_staged_once():
    case = Case(ParallelLayout(), 4, ParallelLayout(tp=2), 4, 16)  # MLA rows whole on both decode ranks
    (send,) = run_case(case).values()
    written = sum(int(write.nbytes.sum()) for write in send.writes)
    staged_blocks = [write.staging_offsets.tolist() for write in send.writes if write.region == BLOCKS]
    assert len(staged_blocks) == 2 and staged_blocks[0] == staged_blocks[1], "both read the same staging"
    blocks = [int(write.nbytes.sum()) for write in send.writes if write.region == BLOCKS]
    assert send.staging_nbytes == written - blocks[1]  # the second decode rank's rows were not staged again


def test_whole_state_layers_are_one_write_each():
    case = Case(ParallelLayout(pcp=2), 4, ParallelLayout(), 4, 8)
    plan = run_case(case)
    kda_layers = CONFIG.layer_types.count("kda")
    assert sum(len(writes_of(send, STATE)) for send in plan.values()) == kda_layers
    assert [len(writes_of(send, STATE)) for send in plan.values()] == [kda_layers // 2] * 2


BASE = HandoffSide(ParallelLayout(), 4, DTYPE)


@pytest.mark.parametrize(
    ("prefill", "decode", "message"),
    [
        (
            BASE,
            replace(BASE, parallel=ParallelLayout(pp=2)),
            r"decode --pp 2: a handoff target is a tp x dcp group",
        ),
        (
            BASE,
            replace(BASE, parallel=ParallelLayout(pcp=2)),
            r"decode --pcp 2: .* serve decode with --pcp 1",
        ),
        (
            BASE,
            replace(BASE, dtype=torch.float16),
            r"reservation.layout.dtype: decode group has torch.float16",
        ),
        (BASE, replace(BASE, kv_format="fp8"), r"reservation.layout.kv_format: decode group has fp8"),
        (BASE, replace(BASE, open_chunk_rows=16), r"reservation.layout.numerics: decode group has 16"),
        (
            replace(BASE, parallel=ParallelLayout(tp=3)),
            BASE,
            r"prefill --tp 3: does not divide the 4 KDA heads",
        ),
        (BASE, replace(BASE, block_size=0), r"decode --block-size 0: must be at least 1"),
        (
            replace(BASE, parallel=ParallelLayout(pp=9)),
            BASE,
            r"--pp 9: more pipeline stages than .* 8 layers",
        ),
    ],
    ids=[
        "decode-pp",
        "decode-pcp",
        "dtype",
        "kv-format",
        "numerics",
        "kda-heads",
        "block-size",
        "pp-beyond-layers",
    ],
)
def test_unmappable_layouts_are_refused_naming_the_field(prefill, decode, message):
    with pytest.raises(ValueError, match=message):
        check_mappable(CONFIG, prefill, decode)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            HandoffRequestRows(9, (0, 1, 2), 0, (0, 1), 0),
            r"decode_block_ids: 2 blocks for 9 tokens of 4 per block",
        ),
        (
            HandoffRequestRows(9, (0,), 0, (0, 1, 2), 0),
            r"prefill_block_ids: 1 blocks for 9 tokens .*; need 3",
        ),
        (
            HandoffRequestRows(0, (), 0, (), 0),
            r"num_tokens: a handoff moves at least one cached token, got 0",
        ),
        (
            HandoffRequestRows(9, (0, 1, 2), 0, (0, 1, 2), 0, 6),
            r"decode_held_tokens: 6 is not whole decode blocks of 4 tokens below num_tokens 9",
        ),
        (
            HandoffRequestRows(8, (0, 1), 0, (0, 1), 0, 8),
            r"decode_held_tokens: 8 is not whole decode blocks",
        ),
    ],
    ids=["decode-blocks", "prefill-blocks", "no-tokens", "held-not-whole-blocks", "held-everything"],
)
def test_bad_request_rows_are_refused_naming_the_field(rows, message):
    with pytest.raises(ValueError, match=message):
        plan_handoff(CONFIG, BASE, BASE, rows)


def test_senders_outside_the_group_are_refused():
    with pytest.raises(ValueError, match=r"senders: \[1\] are not all ranks of the prefill group"):
        plan_handoff(CONFIG, BASE, BASE, HandoffRequestRows(4, (0,), 0, (0,), 0), senders=[1])


@pytest.mark.parametrize(
    "engine",
    [
        EngineConfig("unused", block_size=4, num_blocks=2, max_num_seqs=1, tp=2, pcp=2, pp=2),
        EngineConfig("unused", block_size=8, num_blocks=2, max_num_seqs=1, tp=4, dcp=2, kv_format="fp8"),
        EngineConfig("unused", block_size=4, num_blocks=2, max_num_seqs=1, tp=2, batch_invariant=True),
    ],
    ids=["tp2xpcp2xpp2", "fp8-tp4xdcp2", "invariant-tp2"],
)
def test_rank_layouts_are_the_engine_pools_layouts(engine):
    side = HandoffSide.of_engine(engine, DTYPE)
    for rank in range(engine.world_size):
        shard = SimpleNamespace(config=CONFIG, dtype=DTYPE, parallel=ParallelContext(engine.layout, rank))
        pools = CacheManager.for_model(engine, shard)
        assert side.rank_layouts(CONFIG, rank) == (pools.blocks.layout, pools.slots.layout)
