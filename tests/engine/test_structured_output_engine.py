"""Structured output through the engine (``LLM`` on a tiny random checkpoint with its real tokenizer):
at temperature 1 a random model never writes JSON by itself, so output that parses and validates
shows the grammar's mask ran; a regex request fullmatches; every step's mask allows exactly what the
matcher accepts (sampled over the vocabulary) and the batched mask equals the reference; in
batch-invariant mode an unconstrained request's tokens and log-probs are bitwise the same with
constrained batch-mates and without, and a constrained one's too; constrained requests do not draft."""

import json
import re

import jsonschema
import pytest
import torch

from common.sampling_params import SamplingParams
from kernels.token_mask.naive import mask_rows
from services.engine import LLM, model_runner
from services.engine.sampling.grammar import RequestGrammar
from tests.conftest import TEST_DEVICE
from tests.engine.constrained_params import REGEX, constrained
from tests.engine.test_draft_model import draft_overrides

ENGINE = {"block_size": 8, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 256}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "count": {"type": "integer"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "count", "ok", "tags"],
    "additionalProperties": False,
}
PROMPTS = [list(range(3, 3 + n)) for n in (17, 5, 30)]


def engine(checkpoint, **options) -> LLM:
    return LLM(str(checkpoint), dtype="float32", device=TEST_DEVICE, **ENGINE, **options)


def both(seed: int) -> list[SamplingParams]:
    return [constrained("json_schema", json.dumps(SCHEMA), seed=seed), constrained("regex", REGEX)]


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    with engine(tiny_checkpoint("k3"), batch_invariant=True) as llm:
        yield llm


@pytest.fixture
def masked(monkeypatch):
    """Every ``apply_grammars`` call: (its input rows, the requests' grammars copied, its output rows)."""
    calls = []
    original = model_runner.apply_grammars

    def recording(logits, requests):
        grammars = [r.grammar for r in requests]
        for r in requests:  # bring each matcher up to this step before copying it
            if r.grammar is not None:
                r.grammar.sync(r.generated_ids)
        copies = [g.matcher.deep_copy() if g is not None else None for g in grammars]
        processed = original(logits, requests)
        calls.append((logits.detach().cpu().float(), copies, processed.detach().cpu().float()))
        return processed

    monkeypatch.setattr(model_runner, "apply_grammars", recording)
    return calls


@pytest.mark.parametrize("seed", [0, 1, 2, 3], ids=lambda s: f"seed{s}")
def test_json_schema_output_validates_against_the_schema(llm, seed):
    out = llm.generate(PROMPTS[:1], constrained("json_schema", json.dumps(SCHEMA), seed=seed))[0]
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(out.text), SCHEMA)
    llm.engine.check_integrity()


@pytest.mark.parametrize("seed", [0, 1, 2, 3], ids=lambda s: f"seed{s}")
def test_regex_output_fullmatches(llm, seed):
    out = llm.generate(PROMPTS[1:2], constrained("regex", REGEX, seed=seed))[0]
    assert out.finish_reason == "stop"
    assert re.fullmatch(REGEX, out.text), out.text


def test_json_object_output_parses_as_an_object(llm):
    # A random model writes strings on and on; a bias toward the closing tokens lets it finish
    # (the bias is applied before the mask, which still decides what may come).
    tokenizer = llm.tokenizer
    closers = {i: 6.0 for i in range(tokenizer.vocab_size) if tokenizer.decode([i]) in ('"', "}", '":', '",')}
    outputs = llm.generate(
        [PROMPTS[0]] * 3, [constrained("json_object", seed=s, logit_bias=closers) for s in range(3)]
    )
    for out in outputs:
        assert out.finish_reason == "stop", out.text
        assert isinstance(json.loads(out.text), dict)


def test_unconstrained_output_at_the_same_seed_is_not_json(llm):
    """The control: without the grammar the same request is not JSON (so the mask is what made it)."""
    plain = llm.generate(PROMPTS[:1], SamplingParams(temperature=1.0, max_tokens=40, seed=0))[0]
    with pytest.raises(ValueError):
        json.loads(plain.text)


def test_each_mask_allows_exactly_what_the_matcher_accepts(llm, masked):
    llm.generate(
        PROMPTS[:2], [constrained("json_schema", json.dumps(SCHEMA), seed=5), constrained("regex", REGEX)]
    )
    assert masked
    generator = torch.Generator().manual_seed(0)
    checked = 0
    for logits, matchers, processed in masked:
        for row, matcher in enumerate(matchers):
            if matcher is None:
                continue
            allowed = torch.isfinite(processed[row])
            assert allowed.any()
            sample = torch.randint(0, logits.shape[1], (48,), generator=generator).tolist()
            sample += allowed.nonzero().flatten()[:16].tolist()
            for token in sample:
                probe = matcher.deep_copy()
                ok = probe.consume_token(token) and not probe.is_error()
                assert ok == bool(allowed[token]), (token, llm.tokenizer.decode([token]))
                checked += 1
            # the kept logits are the input's, bit for bit
            assert torch.equal(processed[row][allowed], logits[row][allowed])
    assert checked > 500


def test_batched_mask_equals_the_reference(llm, masked):
    """The engine's batched rows against ``naive.mask_rows`` on the same bitmask (recomputed from the
    recorded matchers)."""
    llm.generate(
        PROMPTS[:2], [constrained("json_schema", json.dumps(SCHEMA), seed=7), constrained("regex", REGEX)]
    )
    compiler = llm.engine.grammars
    for logits, matchers, processed in masked:
        rows = [i for i, m in enumerate(matchers) if m is not None]
        bitmask = torch.from_numpy(compiler.fill([RequestGrammar(matchers[i], compiler) for i in rows]))
        reference = mask_rows(logits[rows], bitmask)
        assert torch.equal(processed[rows], reference)


def test_rows_do_not_depend_on_batch_mates(llm):
    plain = SamplingParams(temperature=1.0, max_tokens=24, seed=11, logprobs=0, ignore_eos=True)
    schema = constrained("json_schema", json.dumps(SCHEMA), seed=3)
    alone_plain = llm.generate(PROMPTS[2:3], plain)[0]
    alone_schema = llm.generate(PROMPTS[:1], schema)[0]
    together = llm.generate(PROMPTS, [schema, constrained("regex", REGEX, seed=4), plain])
    assert together[2].token_ids == alone_plain.token_ids
    assert together[2].logprobs == alone_plain.logprobs  # float32 values held exactly: the same bits
    assert together[0].token_ids == alone_schema.token_ids
    assert together[0].logprobs == alone_schema.logprobs
    llm.engine.check_integrity()


def test_constrained_requests_do_not_draft(tiny_checkpoint):
    target = tiny_checkpoint("k3")
    draft = tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))
    params = [constrained("regex", REGEX, seed=2), constrained("json_schema", json.dumps(SCHEMA), seed=9)]
    with engine(target, batch_invariant=True) as llm:
        plain = llm.generate(PROMPTS[:2], params)
    with engine(target, batch_invariant=True, draft_model=str(draft), num_draft_tokens=3) as llm:
        spec = llm.generate(PROMPTS[:2], params)
        assert sum(llm.engine.spec_counters.counts().drafted_by_position) == 0
        llm.engine.check_integrity()
    for ours, theirs in zip(spec, plain, strict=True):
        assert ours.token_ids == theirs.token_ids
        assert ours.logprobs == theirs.logprobs
