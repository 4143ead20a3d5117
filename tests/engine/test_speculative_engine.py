"""The engine's side of speculative decoding, driven by a scripted proposer (``scripted_proposer.py``).

The proposer drafts the plain engine's own greedy continuation with wrong tokens at chosen output
positions, so each verify accepts a known number of drafts (all, none, some). Greedy speculative
decoding must then give the plain run's tokens (and, in batch-invariant mode, its log-prob bits),
whatever the acceptance, stops and preemptions; the checkpoint slots must be held and freed with the
requests; and ``SpecCounters`` must count exactly the verifies the script forced.

K3 (KDA) rejections take the KDA state the verify step kept after the last accepted draft
(``--kda-rollback states``) or roll it back from the checkpoint its KDA layers wrote after the tail
(``replay``, also batch-invariant mode's); DeepSeek-V3.2 (no KDA) only rewrites MLA rows.
"""

import dataclasses

import numpy as np
import pytest
import torch

from services.engine import LLM, SamplingParams
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.handoff import (
    first_token,
    handoff_row_bytes,
    held_prefill,
    register_pools,
    reservation_of,
    send_state,
)
from services.engine.request import RequestStatus
from services.engine.speculative.proposal import DraftTokens
from services.transfer import make_backend
from tests.conftest import TEST_DEVICE
from tests.engine.scripted_proposer import Script, ScriptedProposer, expected_verifies
from tests.preemptions import counted_preemptions

FAMILIES = ("k3", "deepseek_v32")
K = 3
MAX_TOKENS = 10
PROMPTS = [list(range(5, 5 + n)) for n in (9, 17, 4)]
# Wrong drafts by output position: accept all, accept none, accept some.
WRONG = {"all": frozenset(), "none": frozenset(range(MAX_TOKENS)), "some": frozenset({2, 3, 7})}
MIXED = ("all", "none", "some")  # PROMPTS[i] is drafted with WRONG[MIXED[i]]
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=0, ignore_eos=True)
ENGINE = dict(dtype="float32", device=TEST_DEVICE, block_size=8, max_num_seqs=4, max_num_batched_tokens=64)


def bits(values: list[float]) -> list[int]:
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


@pytest.fixture(scope="module")
def plain(tiny_checkpoint):
    """``plain(family, invariant=False, params=GREEDY, prompts=PROMPTS)``: the plain engine's outputs
    (one engine per family and mode, runs cached)."""
    engines, runs = {}, {}

    def run(family, invariant=False, params=GREEDY, prompts=PROMPTS):
        key = (family, invariant, params, tuple(map(tuple, prompts)))
        if key not in runs:
            if (family, invariant) not in engines:
                path = str(tiny_checkpoint(family))
                engines[family, invariant] = LLM(path, batch_invariant=invariant, **ENGINE)
            runs[key] = engines[family, invariant].generate(prompts, params)
        return runs[key]

    return run


def speculative(tiny_checkpoint, family, outputs, patterns, invariant=False, **options) -> LLM:
    """A speculative engine whose proposer drafts each of ``outputs``' tokens, wrong at its pattern's
    positions (``WRONG``), ``K`` every step (the fixed policy: the counts below assume it; the adaptive
    policy's plain steps are tested in ``test_spec_policy_engine.py``)."""
    scripts = {
        tuple(o.prompt_ids): Script(tuple(o.token_ids), WRONG[pattern])
        for o, pattern in zip(outputs, patterns, strict=True)
    }
    path = str(tiny_checkpoint(family))
    return LLM(
        path,
        batch_invariant=invariant,
        proposer=ScriptedProposer(K, scripts),
        **{**ENGINE, "spec_policy": "fixed", **options},
    )


def expected_counts(outputs, patterns, max_tokens=MAX_TOKENS) -> tuple:
    """``SpecCounts``' (verifies, accepted_lengths, drafted_by_position, accepted_by_position) for
    requests run side by side with budget to spare."""
    verifies = []
    for output, pattern in zip(outputs, patterns, strict=True):
        verifies += expected_verifies(Script(tuple(output.token_ids), WRONG[pattern]), K, max_tokens)
    lengths = tuple(sum(1 for _, a in verifies if a == n) for n in range(K + 1))
    drafted = tuple(sum(1 for d, _ in verifies if d > i) for i in range(K))
    accepted = tuple(sum(1 for _, a in verifies if a > i) for i in range(K))
    return len(verifies), lengths, drafted, accepted


def counted(llm: LLM) -> tuple:
    counts = llm.engine.spec_counters.counts()
    assert counts.num_draft_tokens == K and counts.draft_seconds > 0 and counts.target_seconds > 0
    return counts.verifies, counts.accepted_lengths, counts.drafted_by_position, counts.accepted_by_position


@pytest.mark.parametrize("pattern", ["all", "none", "some"])
@pytest.mark.parametrize(
    ("family", "rollback"), [("k3", "states"), ("k3", "replay"), ("deepseek_v32", "auto")]
)
def test_greedy_tokens_equal_plain_decoding(family, rollback, pattern, plain, tiny_checkpoint):
    want = plain(family)
    llm = speculative(tiny_checkpoint, family, want, [pattern] * len(PROMPTS), kda_rollback=rollback)
    got = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(o.finish_reason == "length" for o in got)
    for g, w in zip(got, want, strict=True):
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) < 1e-4
    assert counted(llm) == expected_counts(want, [pattern] * len(PROMPTS))
    commits = [n for _, n in llm.engine.proposer.commits]
    assert commits and (pattern != "all" or all(n == K for n in commits[:2]))
    assert pattern != "none" or set(commits) == {0}


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_invariant_logprobs_are_plain_bits(family, plain, tiny_checkpoint):
    """Requests of different acceptance in one batch: tokens and log-prob bits of the plain run."""
    want = plain(family, invariant=True)
    llm = speculative(tiny_checkpoint, family, want, MIXED, invariant=True)
    got = llm.generate(PROMPTS, GREEDY)
    assert [(o.token_ids, bits(o.logprobs)) for o in got] == [(o.token_ids, bits(o.logprobs)) for o in want]
    assert counted(llm) == expected_counts(want, MIXED)


def test_stop_token_inside_accepted_drafts_ends_there(plain, tiny_checkpoint):
    """Every draft right: the first verify accepts output positions 1-3; a stop id at position 2 ends the
    request there (position 3 is dropped) as in plain decoding."""
    family = "deepseek_v32"
    base = plain(family, prompts=PROMPTS[:1])[0]
    stop = base.token_ids[2]
    if stop in base.token_ids[:2]:
        pytest.fail(f"pick another prompt: the stop token {stop} occurs before position 2")
    params = dataclasses.replace(GREEDY, stop_token_ids=(stop,))
    want = plain(family, params=params, prompts=PROMPTS[:1])[0]
    llm = speculative(tiny_checkpoint, family, [base], ["all"])
    got = llm.generate(PROMPTS[:1], params)[0]
    assert got.token_ids == want.token_ids == base.token_ids[:3] and got.finish_reason == "stop"
    assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True)) < 1e-4
    assert llm.engine.proposer.commits == [] and llm.engine.spec_counters.counts().accepted_lengths[K] == 1


@pytest.mark.parametrize("max_tokens", [4, 5], ids=["drafts-cut-to-2", "ends-in-verify"])
def test_max_tokens_inside_a_verify(max_tokens, plain, tiny_checkpoint):
    family = "deepseek_v32"
    params = dataclasses.replace(GREEDY, max_tokens=max_tokens)
    want = plain(family, params=params, prompts=PROMPTS[:1])
    llm = speculative(tiny_checkpoint, family, want, ["all"])
    got = llm.generate(PROMPTS[:1], params)[0]
    assert got.token_ids == want[0].token_ids and len(got.token_ids) == max_tokens
    counts = llm.engine.spec_counters.counts()
    assert counts.verifies == 1 and counts.drafted_by_position == (
        (1, 1, 0) if max_tokens == 4 else (1, 1, 1)
    )
    assert counted(llm) == expected_counts(want, ["all"], max_tokens)


@pytest.mark.parametrize("family", FAMILIES)
def test_preemption_under_a_small_cache_keeps_outputs(family, plain, tiny_checkpoint):
    want = plain(family)
    llm = speculative(tiny_checkpoint, family, want, MIXED, block_size=4, num_blocks=12)
    with counted_preemptions(llm) as preempted:
        got = llm.generate(PROMPTS, GREEDY)
    assert preempted, "the small cache should have forced a preemption"
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert set(preempted) <= set(llm.engine.proposer.released)
    assert not llm.engine.proposer.pending


@pytest.mark.parametrize(
    "max_tokens, budget, kept", [(3, 64, 1), (10, 3, 2), (10, 64, 3)], ids=["max-tokens", "budget", "whole"]
)
def test_drafts_and_their_distributions_are_cut_to_fit(max_tokens, budget, kept, tiny_checkpoint):
    """A verify chunk is the whole tail and the drafts that fit: ``max_tokens`` (the step emits up to
    drafts + 1 tokens) and the step budget cut the drafts, and the rows of their distributions."""
    path = str(tiny_checkpoint("deepseek_v32"))
    engine = EngineCore(
        EngineConfig(path, device=TEST_DEVICE, dtype="float32", max_num_batched_tokens=budget),
        proposer=ScriptedProposer(K, {}),
    )
    request = engine.add_request(PROMPTS[2], dataclasses.replace(GREEDY, max_tokens=max_tokens))
    while not request.output_ids:
        engine.step()
    probs = torch.rand(K, engine.model.config.vocab_size)
    output = engine.scheduler.schedule({request.request_id: DraftTokens((1, 2, 3), probs)})
    (chunk,) = output.chunks
    assert chunk.num_draft == kept and chunk.token_ids == (request.output_ids[-1], 1, 2, 3)[: 1 + kept]
    assert output.drafts[request.request_id].token_ids == (1, 2, 3)[:kept]
    assert torch.equal(output.drafts[request.request_id].probs, probs[:kept])
    assert len(request.block_table) * engine.cache.block_tokens >= chunk.past + len(chunk.token_ids)
    engine.abort(request.request_id)


def test_drafts_that_do_not_fit_are_discarded_not_released(tiny_checkpoint):
    """A budget of one token leaves no room for drafts after the tail: the request decodes plainly and
    the proposer is told to discard the drafts (keeping its state), not to release the request."""
    path = str(tiny_checkpoint("deepseek_v32"))
    proposer = ScriptedProposer(K, {})
    engine = EngineCore(
        EngineConfig(path, device=TEST_DEVICE, dtype="float32", max_num_batched_tokens=1), proposer=proposer
    )
    request = engine.add_request(PROMPTS[1][:1], dataclasses.replace(GREEDY, max_tokens=4))
    while not request.output_ids:
        engine.step()
    output = engine.scheduler.schedule({request.request_id: DraftTokens((1, 2, 3))})
    (chunk,) = output.chunks
    assert chunk.num_draft == 0 and not output.drafts
    assert proposer.discarded == [request.request_id] and proposer.released == []
    engine.abort(request.request_id)


@pytest.mark.parametrize(("rollback", "extra"), [("replay", 1), ("states", K)])
def test_each_request_holds_its_speculation_slots_while_it_runs(plain, tiny_checkpoint, rollback, extra):
    """``replay``: a checkpoint slot beside the request's own; ``states``: one per draft."""
    family = "k3"
    want = plain(family)
    llm = speculative(tiny_checkpoint, family, want, ["all"] * len(PROMPTS), kda_rollback=rollback)
    engine = llm.engine
    assert engine.cache.slots.num_slots == (1 + extra) * ENGINE["max_num_seqs"]
    requests = [engine.add_request(p, GREEDY) for p in PROMPTS]
    engine.step()
    held = [(r.slot, *r.spec_slots) for r in requests]
    assert all(len(slots) == 1 + extra for slots in held)
    assert len({s for slots in held for s in slots}) == (1 + extra) * len(PROMPTS)
    assert engine.cache.slots.used == {s for slots in held for s in slots}
    engine.check_integrity()
    engine.abort(requests[0].request_id)
    assert requests[0].spec_slots == [] and requests[0].request_id in engine.proposer.released
    engine.check_integrity()
    while engine.has_unfinished:
        engine.step()
    assert engine.cache.slots.num_free == engine.cache.slots.num_slots


def test_next_turn_resumes_from_a_snapshot_taken_while_speculating(plain, tiny_checkpoint):
    """Rejections roll back and the tail is recomputed; the verify that lands on output block boundary
    24 (17 prompt tokens, blocks of 8) leaves a decode snapshot there. A next turn on the same engine
    resumes from it and continues exactly as the plain engine does."""
    family = "k3"
    first = plain(family, prompts=PROMPTS[1:2])
    llm = speculative(tiny_checkpoint, family, first, ["some"])
    assert llm.generate(PROMPTS[1:2], GREEDY)[0].token_ids == first[0].token_ids
    turn = [PROMPTS[1] + first[0].token_ids + [7, 8]]
    want = plain(family, prompts=turn)[0]
    got = llm.generate(turn, GREEDY)[0]
    assert got.num_cached_tokens == 24, "the next turn should resume from the decode snapshot at 24"
    assert got.token_ids == want.token_ids
    assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True)) < 1e-4


def test_a_handed_off_request_speculates_from_its_next_step(plain, tiny_checkpoint):
    """Decode side of a handoff: the prompt's state arrives by transfer, then the request verifies
    drafts from its next step on (the proposer is told nothing special)."""
    family = "k3"
    want = plain(family, prompts=PROMPTS[:1])[0]
    options = dict(model=str(tiny_checkpoint(family)), dtype="float32", device=TEST_DEVICE, block_size=8)
    prefill = EngineCore(EngineConfig(**options))
    proposer = ScriptedProposer(K, {tuple(want.prompt_ids): Script(tuple(want.token_ids), WRONG["some"])})
    decode = EngineCore(EngineConfig(**options), proposer=proposer)
    sender, receiver = make_backend("grpc_bytes"), make_backend("grpc_bytes")
    try:
        register_pools(sender, prefill.cache)
        register_pools(receiver, decode.cache)
        peer = sender.connect(receiver.endpoint())
        reserved = decode.reserve(PROMPTS[0], GREEDY, "handed")
        assert len(reserved.spec_slots) == K
        held = prefill.add_prefill_only(PROMPTS[0], GREEDY, "handed")
        while held.status is not RequestStatus.HELD:
            prefill.step()
        send_state(
            sender, peer, held_prefill(held), reservation_of(reserved), handoff_row_bytes(prefill.cache, None)
        )
        assert receiver.wait_notification("handed", timeout_s=10).message == "handed"
        decode.scheduler.complete_reserved("handed", first_token(held))
        prefill.scheduler.release_held("handed")
        while decode.has_unfinished:
            decode.step()
    finally:
        sender.close()
        receiver.close()
    assert reserved.output_ids == want.token_ids
    assert decode.spec_counters.counts().verifies == len(
        expected_verifies(proposer.scripts[tuple(PROMPTS[0])], K, MAX_TOKENS)
    )


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(draft_model="draft"), "--num-draft-tokens"),
        (dict(num_draft_tokens=3), "--draft-model"),
        (dict(draft_model="draft", num_draft_tokens=17), "--num-draft-tokens"),
        (dict(draft_model="draft", num_draft_tokens=0), "--num-draft-tokens"),
        (dict(draft_model="draft", num_draft_tokens=3, tp=2), "--draft-model"),
        (
            dict(draft_model="draft", num_draft_tokens=3, spec_policy="greedy"),
            "spec_policy: 'greedy'.*adaptive",
        ),
        (dict(draft_model="draft", num_draft_tokens=3, kda_rollback="undo"), "kda_rollback: 'undo'.*states"),
        (
            dict(draft_model="draft", num_draft_tokens=3, kda_rollback="states", batch_invariant=True),
            "kda_rollback: states.*--batch-invariant",
        ),
    ],
    ids=["no-k", "no-draft", "k-too-big", "k-zero", "parallel", "policy", "rollback", "states-invariant"],
)
def test_config_errors_name_the_flag(fields, named):
    with pytest.raises(ValueError, match=named):
        EngineConfig(model="target", **fields)


def test_a_proposer_on_a_parallel_engine_is_refused():
    with pytest.raises(ValueError, match="--draft-model"):
        EngineCore(EngineConfig(model="target", tp=2), proposer=ScriptedProposer(K, {}))
