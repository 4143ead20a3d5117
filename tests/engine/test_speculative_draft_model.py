"""Speculative decoding end to end with a real draft model (``--draft-model``) through ``LLM`` and
``baton generate``: greedy tokens are plain decoding's (and its log-prob bits in batch-invariant mode);
the target drafting for itself is accepted in full, greedy and sampled; seeded sampling repeats; a draft
that cannot draft for the target is refused at start, naming the flag."""

import pytest

from cli.main import main as baton_main
from common.sampling_params import SamplingParams
from services.engine import LLM
from tests.conftest import TEST_DEVICE
from tests.engine.test_draft_model import draft_overrides

ENGINE = {"block_size": 8, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 96}
PROMPTS = [list(range(3, 3 + n)) for n in (17, 5, 30)]
GREEDY = SamplingParams(temperature=0, max_tokens=12, logprobs=0, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tiny_checkpoint):
    """``pair(family) -> (target_dir, draft_dir)``: the draft a 2-layer tiny checkpoint of another seed."""
    return lambda family: (
        tiny_checkpoint(family),
        tiny_checkpoint(family, seed=1, **draft_overrides(family)),
    )


def engine(target, draft=None, k=0, **options) -> LLM:
    spec = {"draft_model": str(draft), "num_draft_tokens": k} if draft is not None else {}
    return LLM(str(target), dtype="float32", device=TEST_DEVICE, **ENGINE, **spec, **options)


def generate(llm: LLM, params: SamplingParams) -> list:
    outputs = llm.generate(PROMPTS, params)
    llm.engine.check_integrity()
    return outputs


def drafted_and_accepted(llm: LLM) -> tuple[int, int]:
    counts = llm.engine.spec_counters.counts()
    return sum(counts.drafted_by_position), sum(counts.accepted_by_position)


@pytest.mark.parametrize(
    "family, batch_invariant", [("k3", False), ("k3", True), ("deepseek_v32", False)], ids=str
)
def test_greedy_with_a_draft_model_gives_plain_decodings_tokens(pair, family, batch_invariant):
    target, draft = pair(family)
    plain = generate(engine(target, batch_invariant=batch_invariant), GREEDY)
    spec_llm = engine(target, draft, 3, batch_invariant=batch_invariant)
    spec = generate(spec_llm, GREEDY)
    for ours, theirs in zip(spec, plain, strict=True):
        assert ours.token_ids == theirs.token_ids
        if batch_invariant:
            assert ours.logprobs == theirs.logprobs  # float32 values held exactly: the same bits
    drafted, accepted = drafted_and_accepted(spec_llm)
    assert drafted > 0 and 0 <= accepted <= drafted
    # each request's own counts (its usage's draft_tokens / accepted_draft_tokens) add up to the engine's
    assert sum(o.num_draft_tokens for o in spec) == drafted
    assert sum(o.num_accepted_draft_tokens for o in spec) == accepted
    assert spec_llm.engine.proposer.seats == {}  # every request released its draft cache


def test_the_target_drafting_for_itself_is_accepted_in_full(pair):
    target, _ = pair("k3")
    plain = generate(engine(target, batch_invariant=True), GREEDY)
    spec_llm = engine(target, target, 4, batch_invariant=True)
    spec = generate(spec_llm, GREEDY)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert [o.logprobs for o in spec] == [o.logprobs for o in plain]
    drafted, accepted = drafted_and_accepted(spec_llm)
    assert drafted > 0 and accepted == drafted
    assert all(0 < o.num_accepted_draft_tokens == o.num_draft_tokens for o in spec)
    assert all(o.num_draft_tokens == 0 for o in plain)
    # 12 tokens each: the first from the prefill, then verifies of 4 drafts + 1 (fewer near the end).
    assert spec_llm.engine.spec_counters.counts().verifies <= len(PROMPTS) * 3


def test_sampled_speculation_repeats_by_seed_and_a_self_draft_is_accepted_in_full(pair):
    target, draft = pair("k3")
    params = [
        SamplingParams(temperature=0.9, top_k=50, seed=s, max_tokens=10, ignore_eos=True) for s in (1, 2, 3)
    ]
    spec_llm = engine(target, draft, 3)  # adaptive, but seeded sampled steps draft every k
    first, again = spec_llm.generate(PROMPTS, params), spec_llm.generate(PROMPTS, params)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert len({tuple(o.token_ids) for o in first}) == len(PROMPTS)
    self_llm = engine(target, target, 3, batch_invariant=True)
    generate(self_llm, params)
    drafted, accepted = drafted_and_accepted(self_llm)
    assert drafted > 0 and accepted == drafted  # q == p bit for bit: u * q <= p always holds


def test_a_draft_that_cannot_draft_for_the_target_is_refused_at_start(pair, tiny_checkpoint, tmp_path):
    target, _ = pair("k3")
    cases = [
        (tiny_checkpoint("deepseek_v32"), "is a deepseek_v32 checkpoint, the target .* is k3"),
        (tiny_checkpoint("k3", vocab_size=512), "has vocab_size 512, the target .* has 1024"),
        (tmp_path / "missing", "is not a checkpoint folder"),
    ]
    for draft, message in cases:
        with pytest.raises(ValueError, match=f"--draft-model: .*{message}"):
            engine(target, draft, 2)
    with pytest.raises(ValueError, match="--num-draft-tokens"):
        engine(target, target, 0)


def test_baton_generate_with_a_draft_prints_plain_decodings_tokens(pair, capsys):
    target, draft = pair("k3")
    common = ["generate", "--model", str(target), "--prompt-ids", "5,6,7,8,9", "--max-tokens", "8"]
    assert baton_main([*common, "--dtype", "float32"]) == 0
    plain = capsys.readouterr().out
    assert (
        baton_main([*common, "--dtype", "float32", "--draft-model", str(draft), "--num-draft-tokens", "3"])
        == 0
    )
    spec = capsys.readouterr().out
    ids = [line for line in plain.splitlines() if "generated" in line]
    assert ids and ids == [line for line in spec.splitlines() if "generated" in line]
