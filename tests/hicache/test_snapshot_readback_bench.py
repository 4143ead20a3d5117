"""``hicache_snapshots`` (the numbers of ``docs/hicache.md``, "Snapshot placement"), on three turns: a
conversation's second turn, after another conversation pushed its first out of the device pool,
restores the first turn's ``prompt_end`` snapshot from the tier and loads its KV from there."""

from loadtest.workload import Turn
from services.engine.benchmark.hicache_snapshots import replay


def test_a_later_turn_restores_its_previous_prompts_end_from_the_tier():
    first, other = tuple(range(100, 164)), tuple(range(300, 364))  # 4 blocks each
    turns = [Turn(first, 2), Turn(other, 2), Turn(first + tuple(range(500, 532)), 2)]
    result = replay(lambda vocab: turns, stride=1, pool_share=0.0)  # the smallest pool: 8 blocks
    assert result["device_pool_blocks"] == 8 and result["requests"] == 3
    assert result["snapshots_saved"] == {"prompt_end": 3}
    assert result["snapshots_restored"] == {"prompt_end": 1}
    assert result["prompt_tokens_cached"] == result["prompt_tokens_cached_host"] == len(first)
