"""``SpecPolicy`` in the engine loop, on a fake clock that the target's steps and the proposer advance
by set costs (never wall time): where speculation loses the engine stops drafting after its warm-up
(the proposer sees only the policy's exploration), where a shorter ``k`` wins it drafts that ``k``, and
greedy tokens stay plain decoding's either way, also with the draft model at every ``k`` the policy
may choose."""

import pytest

from common.sampling_params import SamplingParams
from services.engine import LLM
from services.engine.speculative.spec_policy import PLAIN, SpecPolicy
from tests.conftest import TEST_DEVICE
from tests.engine.scripted_proposer import Script, ScriptedProposer
from tests.engine.test_draft_model import draft_overrides

K = 3
PROMPT = list(range(5, 21))
ENGINE = dict(dtype="float32", device=TEST_DEVICE, block_size=8, max_num_seqs=4, max_num_batched_tokens=64)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


class FakeClock:
    """``EngineCore.clock``: time moves only when a target step or a proposal says what it cost."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def costed(llm: LLM, target_seconds, draft_seconds) -> FakeClock:
    """Put ``llm``'s engine on a ``FakeClock``: each target step costs ``target_seconds(k)`` (``k``: the
    step's most drafts per request, 0 for a plain step) and each proposal ``draft_seconds(k)``."""
    core, clock = llm.engine, FakeClock()
    core.clock = clock
    execute, propose = core.runner.execute, core.proposer.propose

    def timed_execute(output, requests):
        clock.now += target_seconds(max((c.num_draft for c in output.chunks), default=0))
        return execute(output, requests)

    def timed_propose(requests, num_tokens=None):
        clock.now += draft_seconds(num_tokens)
        return propose(requests, num_tokens)

    core.runner.execute, core.proposer.propose = timed_execute, timed_propose
    return clock


@pytest.fixture(scope="module")
def target(tiny_checkpoint):
    return str(tiny_checkpoint("k3"))


@pytest.fixture(scope="module")
def plain_tokens(target):
    """``plain_tokens(max_tokens)``: the plain engine's greedy continuation of ``PROMPT``."""
    llm = LLM(target, **ENGINE)
    return lambda max_tokens: tuple(llm.generate([PROMPT], greedy(max_tokens))[0].token_ids)


def scripted(target, continuation, wrong=frozenset()) -> LLM:
    proposer = ScriptedProposer(K, {tuple(PROMPT): Script(continuation, frozenset(wrong))})
    return LLM(target, proposer=proposer, **ENGINE)


def test_drafting_stops_where_speculation_loses(target, plain_tokens):
    """Every draft wrong (one token per verify) and a verify step plus its draft costing four plain
    steps (75% of the time lost): the warm-up stops after 4 verify steps (``k = 3``) and a plain step
    to time it, and the engine decodes plainly; trying ``k = 1`` would wait for 16 x 4 plain steps."""
    max_tokens = 40
    want = plain_tokens(max_tokens)
    llm = scripted(target, want, wrong=range(max_tokens))
    costed(llm, target_seconds=lambda k: 1.0, draft_seconds=lambda k: 3.0)
    got = llm.generate([PROMPT], greedy(max_tokens))[0]
    assert tuple(got.token_ids) == want
    core = llm.engine
    assert core.proposer.proposals == [K] * 4
    counts = core.spec_counters.counts()
    decode_steps = max_tokens - 2  # the prefill gives the first token; the last is not draftable
    assert counts.steps_by_draft_tokens == (decode_steps - 4, 0, 0, 4)
    assert counts.draft_tokens == PLAIN and counts.verifies == 4
    assert core.spec_policy.best(1) == PLAIN
    core.check_integrity()


def test_a_seeded_sampled_request_keeps_every_draft_where_speculation_loses(target, tiny_checkpoint):
    """A draft costing ten plain steps: the policy turns greedy drafting down after its warm-up (cut to 4
    verify steps: even every draft accepted, 4 tokens for 11 plain steps' time, loses), but a
    step holding a seeded sampled request drafts K every time (its tokens must depend only on its seed,
    not on the draft lengths the policy picks)."""
    draft = tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))
    llm = LLM(target, draft_model=str(draft), num_draft_tokens=K, **ENGINE)
    costed(llm, target_seconds=lambda k: 1.0, draft_seconds=lambda k: 10.0)
    lengths, propose = [], llm.engine.proposer.propose

    def recorded(requests, num_tokens=None):
        lengths.append(num_tokens)
        return propose(requests, num_tokens)

    llm.engine.proposer.propose = recorded
    llm.generate([PROMPT], greedy(40))
    assert lengths == [K] * 4  # plain steps after the warm-up
    lengths.clear()
    seeded = SamplingParams(max_tokens=30, temperature=0.8, seed=5, ignore_eos=True)
    llm.generate([PROMPT], seeded)
    assert len(lengths) >= 10 and set(lengths) == {K}  # every step drafted K (accepted drafts skip steps)
    assert llm.engine.spec_policy.best(1) != K  # left to itself the policy would have drafted less
    llm.engine.check_integrity()


def test_the_engine_drafts_the_k_that_wins(target, plain_tokens):
    """Every draft right (E_k = 1 + k) and a proposal of k costing 0.1 k^2 plain steps: tokens per
    second 1.82, 2.14, 2.11 at k = 1, 2, 3. The policy explores every 4 decisions here (not 16, to keep
    the run short): after the warm-up (16 verify steps at k = 3, a plain step after the 4th), 1 and 2 are each
    tried once 4 x 1.9 (k = 3's cost) of other steps have passed, and the engine then drafts 2, timing
    the others (0, 1, 3) in turn every 4th decision."""
    max_tokens = 16 * (K + 1) + 80
    want = plain_tokens(max_tokens)
    llm = scripted(target, want)
    llm.engine.spec_policy = SpecPolicy(K, explore_every=4)
    costed(llm, target_seconds=lambda k: 1.0, draft_seconds=lambda k: 0.1 * k * k)
    got = llm.generate([PROMPT], greedy(max_tokens))[0]
    assert tuple(got.token_ids) == want
    proposals = llm.engine.proposer.proposals
    assert llm.engine.spec_policy.best(1) == 2
    assert proposals[:16] == [K] * 16
    after = proposals[16:]
    first_1, first_2 = after.index(1), after.index(2)
    assert 4 <= first_1 and first_1 + 4 < first_2 and set(after[:first_2]) == {1, K}, after
    settled = after[first_2:]
    assert set(settled) <= {1, 2} and settled.count(2) > 3 * settled.count(1), after
    counts = llm.engine.spec_counters.counts()
    assert counts.steps_by_draft_tokens[PLAIN] == 2  # the warm-up's, and one explored while drafting 2
    accepted = [n for _, n in llm.engine.proposer.commits]
    assert accepted == proposals[: len(accepted)]  # drafts right: all accepted
    llm.engine.check_integrity()


class CyclingPolicy:
    """Stands in for ``SpecPolicy``: the draft lengths of ``lengths`` in turn, from the first step."""

    def __init__(self, lengths):
        self.lengths, self.chosen = list(lengths), []

    def choose(self, batch_size: int) -> int:
        k = self.lengths[len(self.chosen) % len(self.lengths)]
        self.chosen.append(k)
        return k

    def observe_step(self, batch_size, k, target_seconds, draft_seconds) -> None:
        pass

    def observe_verifies(self, verifies) -> None:
        pass


@pytest.mark.parametrize("family", ["k3", "deepseek_v32"])
def test_the_draft_model_at_every_k_keeps_plain_tokens(family, tiny_checkpoint):
    """The draft model's seats commit proposals of the step's ``k`` (4, 1, plain, 2, 3 in turn; its
    fed drafts are ``k - 1``), catching up after plain steps: greedy tokens are plain decoding's."""
    target = tiny_checkpoint(family)
    draft = tiny_checkpoint(family, seed=1, **draft_overrides(family))
    prompts = [PROMPT, list(range(3, 9)), list(range(40, 70))]
    params = greedy(24)
    want = [o.token_ids for o in LLM(str(target), **ENGINE).generate(prompts, params)]
    llm = LLM(str(target), draft_model=str(draft), num_draft_tokens=4, **ENGINE)
    llm.engine.spec_policy = policy = CyclingPolicy([4, 1, PLAIN, 2, 3])
    got = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == want
    assert set(policy.chosen) == {4, 1, PLAIN, 2, 3}
    counts = llm.engine.spec_counters.counts()
    assert all(n > 0 for n in counts.steps_by_draft_tokens[1:]) and counts.steps_by_draft_tokens[PLAIN] > 0
    assert sum(counts.accepted_lengths) == counts.verifies > 0
    llm.engine.check_integrity()
    assert not llm.engine.proposer.seats
