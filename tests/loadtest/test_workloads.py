"""Token ids, the scale rule and the synthetic workloads: determinism, shapes and sharing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.workloads import build_workload, multiturn, shared_prefix, synthetic
from loadtest.workloads.scale import TokenScale
from loadtest.workloads.tokens import block_tokens, prompt_from_hash_ids, tail_tokens, token_stream

REPO = Path(__file__).resolve().parents[2]
VOCAB = 50_000


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ---- tokens ----


def test_token_stream_is_deterministic_in_range_and_prefix_stable():
    ids = token_stream(["k", 1], 500, VOCAB, low=100)
    assert ids == token_stream(["k", 1], 500, VOCAB, low=100)
    assert token_stream(["k", 1], 37, VOCAB, low=100) == ids[:37]
    assert all(100 <= i < VOCAB for i in ids)
    assert token_stream(["k", 2], 500, VOCAB, low=100) != ids
    assert token_stream(["k", 1], 0, VOCAB) == ()


def test_block_tokens_are_the_same_in_another_process():
    code = "from loadtest.workloads.tokens import block_tokens; print(list(block_tokens(7, 16, 50000, 'x')))"
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == list(block_tokens(7, 16, VOCAB, "x"))


def test_equal_hash_ids_give_equal_blocks_and_different_ids_or_salts_differ():
    assert block_tokens(3, 64, VOCAB, "s") == block_tokens(3, 64, VOCAB, "s")
    assert block_tokens(3, 64, VOCAB, "s") != block_tokens(4, 64, VOCAB, "s")
    assert block_tokens(3, 64, VOCAB, "s") != block_tokens(3, 64, VOCAB, "t")
    assert block_tokens(3, 8, VOCAB, "s") == block_tokens(3, 64, VOCAB, "s")[:8]


@pytest.mark.parametrize("vocab,low", [(10, 16), (0, 0), (2**32 + 1, 0)], ids=["low>vocab", "empty", "huge"])
def test_bad_vocab_is_rejected(vocab, low):
    with pytest.raises(ValueError, match="vocab"):
        block_tokens(1, 4, vocab, low=low)


def test_prompt_from_hash_ids_lays_blocks_then_tail():
    blocks = [block_tokens(h, 4, VOCAB, "s") for h in (5, 6, 7)]
    full = blocks[0] + blocks[1] + blocks[2]
    assert prompt_from_hash_ids([5, 6, 7], 4, 12, VOCAB, "s") == full
    # Longer than the blocks: the tail comes from the last hash id.
    assert prompt_from_hash_ids([5, 6, 7], 4, 15, VOCAB, "s") == full + tail_tokens(7, 3, VOCAB, "s")
    # Shorter: the last block is cut (Mooncake's partial last block).
    assert prompt_from_hash_ids([5, 6, 7], 4, 10, VOCAB, "s") == full[:10]
    # A shared cache changes nothing.
    cache: dict = {}
    assert prompt_from_hash_ids([5, 6, 7], 4, 15, VOCAB, "s", cache=cache) == full + tail_tokens(
        7, 3, VOCAB, "s"
    )
    assert prompt_from_hash_ids([5, 6, 7], 4, 15, VOCAB, "s", cache=cache) == full + tail_tokens(
        7, 3, VOCAB, "s"
    )


# ---- scale rule ----


@pytest.mark.parametrize(
    "factor,block,length,hashes,out,want_block,want_len,want_out",
    [
        (1, 512, 6758, 14, 500, 512, 6758, 500),
        (64, 512, 6758, 14, 500, 8, 106, 8),  # ceil(6758 / 64) = 106
        (64, 64, 235833, 3684, 173, 1, 3685, 3),  # WEKA: 3684 blocks + 1 tail id
        (3, 512, 1300, 3, 2, 170, 434, 1),
        (1000, 512, 6758, 14, 3, 1, 13, 1),  # K > b: one id per complete block (13), not ceil = 7
        (64, 64, 63360, 990, 0, 1, 990, 1),
    ],
    ids=["identity", "mooncake-64", "weka-64", "uneven-3", "k-above-block", "whole-blocks"],
)
def test_scale_rule(factor, block, length, hashes, out, want_block, want_len, want_out):
    scale = TokenScale(factor)
    assert scale.block_size(block) == want_block
    assert scale.input_length(length, hashes, block) == want_len
    assert scale.output_length(out) == want_out


@pytest.mark.parametrize("factor", [0, -2, 1.5, True], ids=["zero", "negative", "float", "bool"])
def test_bad_scale_is_rejected(factor):
    with pytest.raises(ValueError, match="scale"):
        TokenScale(factor)


# ---- synthetic ----


@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.9], ids=["r0", "r0.5", "r0.9"])
def test_synthetic_lengths_stay_in_the_range_ratio_bounds(ratio):
    work = synthetic(300, 100, 20, ratio, VOCAB, seed=3)
    lengths = [len(s.turns[0].prompt_ids) for s in work.sessions]
    outs = [s.turns[0].max_tokens for s in work.sessions]
    assert min(lengths) >= int(100 * (1 - ratio)) and max(lengths) <= 100 * (1 + ratio)
    assert min(outs) >= int(20 * (1 - ratio)) and max(outs) <= 20 * (1 + ratio)
    if ratio == 0:
        assert set(lengths) == {100} and set(outs) == {20}
    else:
        assert len(set(lengths)) > 10  # actually spread
    assert all(len(s.turns) == 1 and s.turns[0].at_s is None for s in work.sessions)
    assert len({s.session_id for s in work.sessions}) == 300


def test_synthetic_is_deterministic_per_seed():
    assert synthetic(20, 64, 8, 0.5, VOCAB, seed=1) == synthetic(20, 64, 8, 0.5, VOCAB, seed=1)
    assert synthetic(20, 64, 8, 0.5, VOCAB, seed=1) != synthetic(20, 64, 8, 0.5, VOCAB, seed=2)
    ids = [
        i for s in synthetic(20, 64, 8, 0.5, VOCAB, seed=1, low=200).sessions for i in s.turns[0].prompt_ids
    ]
    assert min(ids) >= 200 and max(ids) < VOCAB


@pytest.mark.parametrize(
    "args,field",
    [((0, 10, 10, 0.0), "num_requests"), ((1, 10, 10, 1.0), "range_ratio"), ((1, 0, 10, 0.0), "input_len")],
    ids=["no-requests", "ratio-1", "zero-len"],
)
def test_synthetic_rejects_bad_arguments(args, field):
    with pytest.raises(ValueError, match=field):
        synthetic(*args, VOCAB)


# ---- shared prefix ----


def test_shared_prefix_groups_share_exactly_their_prefix():
    work = shared_prefix(3, 4, 32, 16, 8, VOCAB, seed=5, ordered=True)
    assert len(work.sessions) == 12
    prompts = {s.session_id: s.turns[0].prompt_ids for s in work.sessions}
    assert all(len(p) == 48 for p in prompts.values())
    for group in range(3):
        first = prompts[f"shared-{group}-0"]
        for index in range(1, 4):
            assert common_prefix(first, prompts[f"shared-{group}-{index}"]) == 32
    assert common_prefix(prompts["shared-0-0"], prompts["shared-1-0"]) < 4
    shuffled = shared_prefix(3, 4, 32, 16, 8, VOCAB, seed=5)
    assert [s.session_id for s in shuffled.sessions] != [s.session_id for s in work.sessions]
    assert sorted(shuffled.sessions, key=lambda s: s.session_id) == sorted(
        work.sessions, key=lambda s: s.session_id
    )


# ---- multi-turn ----


def _multiturn(**overrides):
    options = dict(
        num_sessions=2,
        turns=6,
        first_len=40,
        turn_len=10,
        output_len=5,
        think_time_s=2.0,
        tool_call_every=2,
        tool_time_s=0.5,
        vocab=VOCAB,
        seed=9,
    )
    return multiturn(**(options | overrides))


def test_multiturn_prompts_extend_the_previous_prompt_and_reply():
    work = _multiturn()
    for session in work.sessions:
        prompts = [t.prompt_ids for t in session.turns]
        for k, prompt in enumerate(prompts):
            assert len(prompt) == 40 + k * (5 + 10)
            assert session.turns[k].max_tokens == 5
            if k:
                assert prompt[: len(prompts[k - 1])] == prompts[k - 1]
    assert common_prefix(work.sessions[0].turns[0].prompt_ids, work.sessions[1].turns[0].prompt_ids) < 4
    assert work == _multiturn()


def test_multiturn_delays_are_think_time_or_tool_time():
    delays = [t.delay_s for t in _multiturn().sessions[0].turns]
    assert delays == [0.0, 2.0, 0.5, 2.0, 0.5, 2.0]
    assert [t.delay_s for t in _multiturn(tool_call_every=0).sessions[0].turns] == [0.0] + [2.0] * 5


def test_multiturn_subagents_branch_from_the_parent_context():
    work = _multiturn(subagent_every=2, subagent_turns=3, subagent_fanout=2)
    parent = work.sessions[0]
    # Turns 1 and 3 spawn (k + 1 divisible by 2); turn 5 is the last and spawns none.
    assert [len(t.subagents) for t in parent.turns] == [0, 2, 0, 2, 0, 0]
    assert [s.session_id for s in parent.turns[1].subagents] == ["multiturn-0/sub-1", "multiturn-0/sub-2"]
    assert [s.session_id for s in parent.turns[3].subagents] == ["multiturn-0/sub-3", "multiturn-0/sub-4"]
    parent_prompt = parent.turns[1].prompt_ids
    next_prompt = parent.turns[2].prompt_ids  # holds turn 1's synthetic reply
    context = next_prompt[: len(parent_prompt) + 5]
    for child in parent.turns[1].subagents:
        assert len(child.turns) == 3
        assert child.turns[0].prompt_ids[: len(context)] == context
        assert len(child.turns[0].prompt_ids) == len(context) + 10
        assert all(not t.subagents for t in child.turns)
    a, b = parent.turns[1].subagents
    assert a.turns[0].prompt_ids != b.turns[0].prompt_ids
    assert len(work.all_sessions()) == 2 * (1 + 4)
    assert work.meta["subagents"] == 8


# ---- registry ----


def test_build_workload_by_name():
    assert build_workload(
        "synthetic", num_requests=3, input_len=8, output_len=2, range_ratio=0.0, vocab=VOCAB
    ) == (synthetic(3, 8, 2, 0.0, VOCAB))
    work = build_workload(
        "shared_prefix",
        num_groups=2,
        prompts_per_group=2,
        prefix_len=4,
        suffix_len=4,
        output_len=2,
        vocab=VOCAB,
    )
    assert len(work.sessions) == 4


@pytest.mark.parametrize(
    "kind,options,match",
    [
        ("nope", {}, "kind: unknown workload 'nope'"),
        (
            "synthetic",
            {"num_requests": 1, "input_len": 8, "output_len": 2, "range_ratio": 0, "vocab": 99, "x": 1},
            "x",
        ),
        ("synthetic", {"num_requests": 1, "input_len": 8, "output_len": 2, "range_ratio": 0}, "vocab"),
        ("trace", {"vocab": VOCAB}, "path"),
    ],
    ids=["unknown-kind", "unknown-option", "missing-vocab", "missing-path"],
)
def test_build_workload_errors_name_the_problem(kind, options, match):
    with pytest.raises(ValueError, match=match):
        build_workload(kind, **options)
