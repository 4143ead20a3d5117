"""Every prefill rank's ``RankTransfer`` over real NIXL agents (UCX, host memory) in one process: each
rank plans its own part, gathers it into its registered staging buffer and writes it into the decode
ranks' agents with ``write_bytes``; the decode pools end bitwise as the plan's CPU reference
(``apply_plan_reference``) leaves them, and every other byte is untouched, whether a rank's part fits
its staging buffer or goes in many windows of it. The ranks' span checksums of what they wrote add up
to what the decode ranks hash of their own landing spans (and a byte changed there changes it). A rank
that cannot send reports the error instead of raising (its group must stay in step)."""

import pytest
import torch

from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.model.config_loader import load_model_config
from services.engine.parallel.group_handoff import sent_checksum
from services.engine.parallel.handoff_plan import HandoffRequestRows, HandoffSide, plan_handoff
from services.engine.parallel.handoff_send import apply_plan_reference
from services.engine.parallel.layout import ParallelLayout
from services.engine.parallel.rank_handoff import HandoffCommand, LandedCheck, RankTransfer, landed_checksum
from services.transfer import BLOCKS, STATE, make_backend

CONFIG = load_model_config(with_layers(preset_config("k3", "tiny"), 8))  # one MLA layer per PP stage
DTYPE = torch.bfloat16
NUM_BLOCKS, NUM_SLOTS = 12, 2
STAGING = {"one-window": 1 << 20, "windows-of-3001-bytes": 3001}
KEY = 0xF00DFACE12345678

CASES = {
    "tp1-to-tp2": (ParallelLayout(), 8, ParallelLayout(tp=2), 4, 13),
    "pp2xpcp2-to-tp2xdcp2": (ParallelLayout(pcp=2, pp=2), 8, ParallelLayout(tp=2, dcp=2), 4, 37),
}


def random_pools(
    side: HandoffSide, generator: torch.Generator
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    pools = {}
    for rank in range(side.parallel.world_size):
        blocks, slots = side.rank_layouts(CONFIG, rank)
        pools[rank] = (
            torch.randint(0, 256, (NUM_BLOCKS, blocks.nbytes), dtype=torch.uint8, generator=generator),
            torch.randint(0, 256, (NUM_SLOTS, slots.nbytes), dtype=torch.uint8, generator=generator),
        )
    return pools


@pytest.mark.parametrize("staging_bytes", STAGING.values(), ids=STAGING.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_rank_writes_its_share_bitwise_as_the_reference(case, staging_bytes):
    prefill_layout, prefill_block, decode_layout, decode_block, num_tokens = case
    prefill = HandoffSide(prefill_layout, prefill_block, DTYPE)
    decode = HandoffSide(decode_layout, decode_block, DTYPE)
    generator = torch.Generator().manual_seed(0)
    prefill_pools, decode_pools = random_pools(prefill, generator), random_pools(decode, generator)
    before = {rank: tuple(pool.clone() for pool in pools) for rank, pools in decode_pools.items()}
    expected = {rank: tuple(pool.clone() for pool in pools) for rank, pools in decode_pools.items()}
    prefill_ids = tuple(range(NUM_BLOCKS - 1, NUM_BLOCKS - 1 - -(-num_tokens // prefill_block), -1))
    decode_ids = tuple(range(1, 1 + 2 * -(-num_tokens // decode.tokens_per_block), 2))
    rows = HandoffRequestRows(num_tokens, prefill_ids, 1, decode_ids, 0)
    plan = plan_handoff(CONFIG, prefill, decode, rows)
    apply_plan_reference(plan, prefill_pools, expected)
    windows = [-(-send.staging_nbytes // staging_bytes) for send in plan.values()]  # per rank
    assert min(windows) > 1 if staging_bytes < STAGING["one-window"] else set(windows) == {1}, windows

    receivers = [make_backend("nixl", f"decode-rank{rank}") for rank in decode_pools]
    senders: list[RankTransfer] = []
    try:
        for backend, (blocks, state) in zip(receivers, decode_pools.values(), strict=True):
            RankTransfer(backend, CONFIG, blocks, state, 0)
        endpoints = tuple(backend.endpoint() for backend in receivers)
        command = HandoffCommand("req", prefill, decode, rows, endpoints, 20.0, checksum_key=KEY)
        reports = []
        for rank, (blocks, state) in prefill_pools.items():
            senders.append(
                RankTransfer(
                    make_backend("nixl", f"prefill-rank{rank}"), CONFIG, blocks, state, staging_bytes
                )
            )
            reports.append(senders[-1].send(rank, command))
    finally:
        for transfer in senders:
            transfer.close()
        for backend in receivers:
            backend.close()
    assert [report.error for report in reports] == [""] * len(prefill_pools)
    assert all(report.nbytes > 0 for report in reports), reports  # the work is spread over the ranks
    for rank, (blocks, state) in decode_pools.items():
        assert not torch.equal(blocks, before[rank][0]) and not torch.equal(state, before[rank][1]), rank
        assert torch.equal(blocks, expected[rank][0]) and torch.equal(state, expected[rank][1]), rank
    check = LandedCheck(decode, num_tokens, decode_ids, 0, 0, KEY)
    landed = [landed_checksum(CONFIG, {BLOCKS: b, STATE: s}, check, r) for r, (b, s) in decode_pools.items()]
    assert all(report.checksum for report in reports)
    assert sent_checksum(tuple(reports)) == sum(landed) % (1 << 64)
    blocks, state = decode_pools[len(decode_pools) - 1]
    state.view(-1)[0] ^= 1  # the first byte of the last decode rank's slot 0: its first field's
    assert landed_checksum(CONFIG, {BLOCKS: blocks, STATE: state}, check, len(decode_pools) - 1) != landed[-1]


def test_a_rank_that_cannot_write_reports_it():
    prefill, decode = HandoffSide(ParallelLayout(), 8, DTYPE), HandoffSide(ParallelLayout(tp=2), 8, DTYPE)
    pools = random_pools(prefill, torch.Generator().manual_seed(1))
    rows = HandoffRequestRows(9, (0, 1), 0, (0, 1), 0)
    sender = RankTransfer(make_backend("nixl", "prefill-alone"), CONFIG, *pools[0], 16)
    try:
        report = sender.send(0, HandoffCommand("req", prefill, decode, rows, (), 5.0))
    finally:
        sender.close()
    assert report.nbytes == 0 and report.error == "ValueError: 0 decode endpoints for 2 ranks"
