"""Logit bias and penalties through the engine (``LLM`` on a tiny random checkpoint): a large bias
makes greedy decoding emit the token, a large negative one bans it; every processed row the sampler
got equals the per-row reference applied to the raw logits and the request's tokens at that step,
and greedy decoding follows it (frequency, presence, repetition on prompt tokens); a request's
processed rows do not depend on its batch-mates (batch-invariant mode); penalised requests do not
draft, so greedy output is the same with a draft model configured; a migrated request's resumed
tokens count as output."""

import pytest
import torch

from common.sampling_params import SamplingParams
from kernels.logit_penalties.batched import token_counts
from kernels.logit_penalties.naive import penalize_row
from services.engine import LLM, model_runner
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.request import Request
from services.engine.sampling.penalties import TokenCounts
from tests.conftest import TEST_DEVICE
from tests.engine.test_draft_model import draft_overrides

ENGINE = {"block_size": 8, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 96}
PROMPTS = [list(range(3, 3 + n)) for n in (17, 5, 30)]


def engine(checkpoint, **options) -> LLM:
    return LLM(str(checkpoint), dtype="float32", device=TEST_DEVICE, **ENGINE, **options)


def greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, **fields)


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    with engine(tiny_checkpoint("k3"), batch_invariant=True) as llm:
        yield llm


@pytest.fixture
def recorded(monkeypatch):
    """Every ``apply_penalties`` call of the model runner: (raw logits, the requests' prompt, output
    and params at that moment, the processed logits)."""
    calls = []
    original = model_runner.apply_penalties

    def recording(logits, requests):
        processed = original(logits, requests)
        snapshot = [(r.request_id, list(r.prompt_ids), list(r.output_ids), r.params) for r in requests]
        calls.append((logits.detach().cpu().float(), snapshot, processed.detach().cpu().float()))
        return processed

    monkeypatch.setattr(model_runner, "apply_penalties", recording)
    return calls


def test_a_large_bias_makes_greedy_emit_the_token_and_a_negative_one_bans_it(llm):
    plain = llm.generate(PROMPTS, greedy())
    target = 7
    assert any(t != target for o in plain for t in o.token_ids)
    forced = llm.generate(PROMPTS, greedy(logit_bias={target: 100.0}))
    assert all(o.token_ids == [target] * 10 for o in forced)
    banned = {t for o in plain for t in o.token_ids}
    out = llm.generate(PROMPTS, greedy(logit_bias={t: -100.0 for t in banned}))
    assert all(not banned & set(o.token_ids) for o in out)
    llm.engine.check_integrity()


@pytest.mark.parametrize(
    "fields",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"frequency_penalty": -1.0, "presence_penalty": 0.5},
        {"repetition_penalty": 3.0},
        {"repetition_penalty": 0.5, "logit_bias": {5: 3.0}},
    ],
    ids=["frequency", "presence", "frequency-and-presence", "repetition", "repetition-below-1-and-bias"],
)
def test_processed_rows_are_the_references_and_greedy_follows_them(llm, recorded, fields):
    params = greedy(logprobs=0, **fields)
    outputs = llm.generate(PROMPTS, params)
    plain = llm.generate(PROMPTS, greedy())
    assert any(o.token_ids != p.token_ids for o, p in zip(outputs, plain, strict=True))
    by_id = {o.request_id: o for o in outputs}
    checked = 0
    for raw, snapshot, processed in recorded:
        for i, (request_id, prompt, output, row_params) in enumerate(snapshot):
            if request_id not in by_id:  # the plain run's rows: passed through untouched
                assert not row_params.processes_logits and torch.equal(processed[i], raw[i])
                continue
            final = by_id[request_id]
            assert final.token_ids[: len(output)] == output
            want = penalize_row(
                raw[i],
                prompt,
                output,
                list(params.logit_bias),
                params.presence_penalty,
                params.frequency_penalty,
                params.repetition_penalty,
            )
            assert torch.equal(processed[i].view(torch.int32), want.view(torch.int32))
            token = final.token_ids[len(output)]
            assert token == int(torch.argmax(want))
            # logprobs are of the processed distribution (before temperature)
            assert final.logprobs[len(output)] == torch.log_softmax(want, -1)[token].item()
            if params.repetition_penalty != 1.0:  # prompt tokens are penalised, others are not
                only_prompt = sorted(set(prompt) - set(output) - {t for t, _ in params.logit_bias})
                untouched = sorted(set(range(raw.shape[1])) - set(prompt) - set(output) - {5})
                assert all(processed[i, t] != raw[i, t] for t in only_prompt if raw[i, t] != 0)
                assert torch.equal(processed[i, untouched], raw[i, untouched])
            checked += 1
    assert checked == sum(len(o.token_ids) for o in outputs)
    llm.engine.check_integrity()


def test_a_penalised_requests_rows_do_not_depend_on_its_batch_mates(llm):
    params = greedy(logprobs=0, frequency_penalty=1.5, repetition_penalty=1.3, logit_bias={4: 2.0})
    alone = llm.generate(PROMPTS[:1], params)[0]
    together = llm.generate(PROMPTS, [params, greedy(), greedy(presence_penalty=-1.0)])[0]
    assert together.token_ids == alone.token_ids
    assert together.logprobs == alone.logprobs  # float32 values held exactly: the same bits
    llm.engine.check_integrity()


def test_greedy_with_penalties_is_the_same_with_a_draft_model(tiny_checkpoint):
    target = tiny_checkpoint("k3")
    draft = tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))
    params = [
        greedy(logprobs=0, frequency_penalty=1.0),
        greedy(logprobs=0, repetition_penalty=1.5, logit_bias={9: 1.0}),
        greedy(logprobs=0),  # drafts for this one still run
    ]
    with engine(target, batch_invariant=True) as llm:
        plain = llm.generate(PROMPTS, params)
    with engine(target, batch_invariant=True, draft_model=str(draft), num_draft_tokens=3) as llm:
        spec = llm.generate(PROMPTS, params)
        counts = llm.engine.spec_counters.counts()
        llm.engine.check_integrity()
    for ours, theirs in zip(spec, plain, strict=True):
        assert ours.token_ids == theirs.token_ids
        assert ours.logprobs == theirs.logprobs
    assert sum(counts.drafted_by_position) > 0  # the unpenalised request drafted


def test_a_bias_outside_the_vocabulary_is_refused_naming_the_field(llm):
    vocab = llm.engine.model.config.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(PROMPTS[:1], greedy(logit_bias={vocab: 1.0}))
    llm.engine.check_integrity()


def test_a_resumed_requests_earlier_tokens_count_as_output(tiny_checkpoint):
    """A migrated request (prompt + its first k tokens, ``resumed_tokens=k``) continues with the same
    penalties: its first k tokens are output for frequency and presence, not prompt."""
    config = EngineConfig(
        model=str(tiny_checkpoint("k3")), device=TEST_DEVICE, dtype="float32", batch_invariant=True
    )
    core = EngineCore(config)

    def run(prompt, params, request_id, resumed_tokens=0):
        request = core.add_request(prompt, params, request_id, resumed_tokens=resumed_tokens)
        while core.has_unfinished:
            core.step()
        return request

    def params(max_tokens):
        return SamplingParams(
            temperature=0,
            max_tokens=max_tokens,
            ignore_eos=True,
            logprobs=0,
            frequency_penalty=1.0,
            presence_penalty=0.5,
        )

    prompt, k = PROMPTS[0], 4
    whole = run(prompt, params(10), "whole")
    resumed = run(prompt + whole.output_ids[:k], params(10 - k), "resumed", resumed_tokens=k)
    assert resumed.output_ids == whole.output_ids[k:]
    assert resumed.logprobs == whole.logprobs[k:]  # the same float32 values
    # Counted as prompt instead, the first k tokens are not penalised: other logprobs.
    restarted = run(prompt + whole.output_ids[:k], params(10 - k), "restarted")
    assert restarted.logprobs != whole.logprobs[k:]
    core.check_integrity()


def test_tables_grown_token_by_token_equal_tables_built_at_once():
    """The engine's ``TokenCounts`` adds each step's tokens to the tables of the prompt's."""
    request = Request(request_id="r", prompt_ids=[3, 3, 7], params=greedy(), stop_ids=frozenset())
    state = TokenCounts(request, 40, torch.device("cpu"))
    for token in [7, 9, 9, 1]:
        request.output_ids.append(token)
        state.sync(request)
    rows, ids = torch.zeros(7, dtype=torch.int64), torch.tensor([3, 3, 7, 7, 9, 9, 1])
    counts, seen = token_counts(1, 40, rows, ids, torch.tensor([False] * 3 + [True] * 4))
    assert torch.equal(state.counts, counts[0]) and torch.equal(state.seen, seen[0])
    assert state.counts[9] == 2 and state.counts[3] == 0 and bool(state.seen[3])
