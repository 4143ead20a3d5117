"""``baton bench hicache``: the replay plan (requests in arrival order, later turns, working set), a tiny
disaggregated replay with the node tier and without it (the tier arm loads later turns from the tier,
the other never does), and the load-bandwidth rows."""

import json
import math

import pytest
import torch

from deploy.benchmark.hicache_bandwidth import measure_load_bandwidth
from deploy.benchmark.hicache_bench import HicacheSetup, load_replay, measure_hicache
from deploy.benchmark.hicache_report import format_comparison
from deploy.benchmark.hicache_workload import conversation_requests, later_turns, working_set_blocks
from services.engine.checkpoint.presets import preset_config
from services.engine.model.config_loader import load_model_config

# One agent session of three turns, each extending the last: 10, 20, 30 blocks of 64 trace tokens.
TURNS = [(0.0, 10), (1.0, 20), (2.0, 30)]
SETUP = HicacheSetup(
    scale=16,  # 4 tokens per trace block: prompts of 40, 80, 120 tokens
    requests=None,
    copies=3,  # three sessions taking turns: the pool holds about one
    snapshot_stride=2,
    max_tokens=2,
    worker_args=("--dtype", "float32", "--transfer-backend", "grpc_bytes"),
    timeout_s=120.0,
)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "agent.json"
    requests = [
        {"t": t, "type": "n", "in": blocks * 64, "out": 32, "hash_ids": list(range(blocks))}
        for t, blocks in TURNS
    ]
    path.write_text(json.dumps({"id": "agent", "block_size": 64, "requests": requests}))
    return path


def test_plan_interleaves_copies_and_finds_later_turns(trace):
    plan = load_replay(str(trace), SETUP)
    ids = [session.session_id for session in plan.workload.sessions]
    assert ids == [f"agent/copy{k}" for _ in TURNS for k in range(3)]  # turn i of every copy, then i + 1
    lengths = [len(session.turns[0].prompt_ids) for session in plan.workload.sessions]
    assert lengths == [40] * 3 + [80] * 3 + [120] * 3
    assert plan.later == (False,) * 3 + (True,) * 6
    assert all(session.turns[0].max_tokens == 2 for session in plan.workload.sessions)
    assert plan.working_set_blocks == 3 * (120 // 16)  # the copies share nothing
    assert plan.pool_blocks(0.1) == -(-(120 + 2) // 16) + 1  # the longest request, more than 10%


def test_later_turns_need_more_than_one_shared_trace_block():
    system = (7, 7, 7, 7)
    prompts = [system + (1,) * 8, system + (2,) * 8, system + (1,) * 8 + (3,) * 4]
    assert later_turns(prompts, 4) == (False, False, True)
    assert working_set_blocks(prompts, 4) == 3 + 2 + 1  # block 0 shared, (1,1,1,1) twice under one prefix


def test_conversation_requests_pair_each_later_turn_with_the_request_it_continues():
    system = (7, 7, 7, 7)
    prompts = [
        system + (1,) * 8,  # 0: continued by 2 and 4
        system + (2,) * 8,  # 1: nobody continues it
        system + (1,) * 8 + (3,) * 4,  # 2: later turn of 0
        system + (5,) * 8,  # 3: nobody continues it
        system + (1,) * 8 + (3,) * 4 + (6,) * 4,  # 4: later turn of 0 (and 2)
    ]
    assert conversation_requests(prompts, 4, None) == [0, 2, 4]
    assert conversation_requests(prompts, 4, 2) == [0, 2]  # stops once the limit is reached


def test_tier_arm_loads_later_turns_from_the_tier_and_the_other_does_not(tiny_checkpoint, trace):
    (comparison,) = measure_hicache(
        str(tiny_checkpoint("k3")), [str(trace)], ("disaggregated",), SETUP, progress=lambda line: None
    )
    without, tier = comparison.without, comparison.with_tier
    for arm in (without, tier):
        assert (arm.requests, arm.failed, arm.later_requests) == (9, 0, 6)
        assert arm.prompt_tokens == 3 * (40 + 80 + 120)
        assert arm.computed_from == "router counters"
        assert arm.computed_tokens == arm.prompt_tokens - arm.cached_tokens
        assert math.isfinite(arm.later_ttft_p50_ms) and arm.later_ttft_p50_ms > 0
    assert without.cached_tokens_host == 0 and not without.tier
    assert tier.tier and tier.later_cached_tokens_host > 0
    assert tier.computed_tokens < without.computed_tokens
    text = format_comparison(comparison)
    assert "no tier" in text and "prefill tokens computed" in text
    found = json.loads(json.dumps(comparison.as_dict(), allow_nan=False))  # what --json prints
    assert found["ratios"]["computed_tokens"] == pytest.approx(without.computed_tokens / tier.computed_tokens)


def test_load_bandwidth_rows_cover_every_block_size():
    config = load_model_config(preset_config("k3", "tiny"))
    rows = measure_load_bandwidth(config, torch.float32, "cpu", [16, 32], blocks=8, repeats=1)
    assert [row.block_tokens for row in rows] == [16, 32]
    assert rows[1].block_bytes > rows[0].block_bytes
    assert all(row.rows_gbps > 0 and row.get_gbps > 0 and row.copy_gbps > 0 for row in rows)
