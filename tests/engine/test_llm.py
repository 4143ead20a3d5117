"""``LLM`` end to end on tiny checkpoints: reference agreement, stops, preemption, cancellation, leaks."""

import pytest
import torch

from services.engine import LLM, SamplingParams
from services.engine.checkpoint.loader import load_model
from tests.conftest import FAMILIES, TEST_DEVICE
from tests.preemptions import counted_preemptions

PROMPTS = [list(range(5, 5 + n)) for n in (23, 7, 1, 40)]


def reference_greedy(model, prompt, tokens):
    """Greedy continuation and raw logprobs by full-sequence recompute (no cache)."""
    sequence, logprobs = list(prompt), []
    with torch.no_grad():
        for token in tokens:
            row = torch.log_softmax(model(torch.tensor([sequence]))[0, -1].float(), dim=-1)
            assert int(row.argmax()) == token, f"greedy token differs at position {len(sequence)}"
            logprobs.append(float(row[token]))
            sequence.append(token)
    return logprobs


@pytest.fixture(scope="module")
def engines(tiny_checkpoint):
    cache = {}

    def make(family, **options):
        key = (family, tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = LLM(str(tiny_checkpoint(family)), dtype="float32", device=TEST_DEVICE, **options)
        return cache[key]

    return make


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_full_recompute_reference(family, engines, tiny_checkpoint):
    llm = engines(family, max_num_batched_tokens=16, max_num_seqs=3, block_size=8)
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0, logprobs=0, ignore_eos=True))
    model = load_model(tiny_checkpoint(family), dtype=torch.float32)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        assert output.prompt_ids == prompt and len(output.token_ids) == 6 and output.finish_reason == "length"
        want = reference_greedy(model, prompt, output.token_ids)
        assert max(abs(a - b) for a, b in zip(output.logprobs, want, strict=True)) < 1e-4
    llm.engine.check_integrity()


def test_mixed_batch_greedy_equals_alone(engines):
    llm = engines("k3", max_num_batched_tokens=8, max_num_seqs=4, block_size=8)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    together = llm.generate(PROMPTS, params)
    alone = [llm.generate([prompt], params)[0] for prompt in PROMPTS]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    llm.engine.check_integrity()


def test_preemption_under_a_small_cache_keeps_outputs(engines):
    roomy = engines("k3", max_num_seqs=4, block_size=4)
    tight = engines("k3", max_num_seqs=4, block_size=4, num_blocks=16, max_num_batched_tokens=64)
    prompts = [list(range(10, 10 + n)) for n in (20, 18, 15, 12)]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    with counted_preemptions(tight) as preemptions:
        squeezed = tight.generate(prompts, params)
    assert preemptions, "the small cache should have forced a preemption"
    assert [o.token_ids for o in squeezed] == [o.token_ids for o in roomy.generate(prompts, params)]
    tight.engine.check_integrity()


def test_seeded_sampling_is_batch_independent(engines):
    llm = engines("kimi_linear", max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=1234, ignore_eos=True)
    together = llm.generate(PROMPTS, params)
    alone = llm.generate([PROMPTS[1]], params)[0]
    assert together[1].token_ids == alone.token_ids


def test_text_prompts_stop_strings_and_stop_tokens(engines):
    llm = engines("k3")
    base = llm.generate("Hello Baton", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert base.text and len(base.token_ids) == 12
    stop_text = base.text[3:5]
    cut = llm.generate("Hello Baton", SamplingParams(max_tokens=12, temperature=0, stop=[stop_text]))[0]
    assert cut.finish_reason == "stop" and stop_text not in cut.text and base.text.startswith(cut.text)
    assert len(cut.token_ids) < 12
    kept = llm.generate(
        "Hello Baton",
        SamplingParams(max_tokens=12, temperature=0, stop=[stop_text], include_stop_str_in_output=True),
    )[0]
    assert kept.text.endswith(stop_text)
    third = base.token_ids[2]
    by_id = llm.generate("Hello Baton", SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[third]))[
        0
    ]
    assert by_id.token_ids == base.token_ids[:3] and by_id.finish_reason == "stop"
    llm.engine.check_integrity()


def test_bad_requests_are_rejected_without_leaking(engines):
    llm = engines("k3", max_model_len=64)
    with pytest.raises(ValueError, match=r"prompts\[0\].prompt_ids: id 5000 at position 1"):
        llm.generate([[1, 5000]])
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([list(range(64))])
    with pytest.raises(ValueError, match=r"prompts\[1\]: expected text or a list of token ids"):
        llm.generate([[1, 2], 3.5])
    with pytest.raises(ValueError, match="temperature"):
        llm.generate([[1]], SamplingParams(temperature=-1))
    assert llm.generate([]) == []
    assert not llm.engine.has_unfinished
    llm.engine.check_integrity()


def test_request_larger_than_the_cache_is_a_clear_error(tiny_checkpoint):
    llm = LLM(str(tiny_checkpoint("k3")), dtype="float32", device=TEST_DEVICE, num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="exceed the whole cache"):
        llm.generate([list(range(6))], SamplingParams(max_tokens=8))
    llm.engine.check_integrity()
