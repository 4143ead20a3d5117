"""The trainer's log-probs equal the served ones bit for bit (float32 patterns), for every generated
token, across trainer packings and the serving side's batch composition, chunked prefill, prefix-cache
hits and preemption. Each test counts what it compared and checks the engine served in batch-invariant
mode; the trainer runs its own copy of the weights (loaded again from the checkpoint)."""

from dataclasses import replace

import pytest
import torch

from services.engine import LLM, SamplingParams
from services.engine.checkpoint.loader import load_model
from tests.conftest import FAMILIES, TEST_DEVICE
from tests.preemptions import counted_preemptions
from trainer import make_trainable

from .served import assert_bitwise, assert_served_invariant

PROMPTS = [list(range(30, 30 + 37)), list(range(200, 205)), list(range(400, 420))]
GREEDY = SamplingParams(max_tokens=6, temperature=0, logprobs=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, seed=11, logprobs=0, ignore_eos=True)
PARAMS = {"greedy": GREEDY, "seeded-sampling": SAMPLED}


@pytest.fixture(scope="module")
def make_llm(tiny_checkpoint):
    made = {}

    def make(family, dtype="float32", **options):
        key = (family, dtype, tuple(sorted(options.items())))
        if key not in made:
            options = {"max_num_batched_tokens": 32, "block_size": 16, **options}
            made[key] = LLM(
                str(tiny_checkpoint(family)), device=TEST_DEVICE, batch_invariant=True, dtype=dtype, **options
            )
        return made[key]

    return make


@pytest.fixture(scope="module")
def trainer_model(tiny_checkpoint):
    made = {}

    def make(family, dtype=torch.float32):
        if (family, dtype) not in made:
            model = load_model(tiny_checkpoint(family), device=TEST_DEVICE, dtype=dtype)
            made[family, dtype] = make_trainable(model)
        return made[family, dtype]

    return make


def serve(llm: LLM, prompts, params):
    outputs = llm.generate(prompts, params)
    assert_served_invariant(llm)
    assert not llm.engine.has_unfinished
    llm.engine.check_integrity()
    return outputs


@pytest.mark.parametrize("params", list(PARAMS), ids=list(PARAMS))
@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_equals_served(family, params, make_llm, trainer_model):
    outputs = serve(make_llm(family), PROMPTS, PARAMS[params])
    assert assert_bitwise(trainer_model(family), outputs) == 3 * 6


def test_any_packing_of_the_trainer_batch(make_llm, trainer_model):
    outputs = serve(make_llm("k3"), PROMPTS, SAMPLED)
    model = trainer_model("k3")
    compared = sum(assert_bitwise(model, outputs, order) for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]))
    # Micro-batches: the same trajectories split over separate trainer forwards.
    compared += assert_bitwise(model, outputs[1:2]) + assert_bitwise(model, [outputs[2], outputs[0]])
    assert compared == 4 * 3 * 6


def test_served_alone_or_beside_others(make_llm, trainer_model):
    llm, model = make_llm("k3"), trainer_model("k3")
    alone = serve(llm, [PROMPTS[2]], SAMPLED)
    beside = serve(llm, PROMPTS, SAMPLED)[2:]
    first = serve(llm, [PROMPTS[2], PROMPTS[0]], SAMPLED)[:1]
    for outputs in (alone, beside, first):
        assert outputs[0].token_ids == alone[0].token_ids
        assert assert_bitwise(model, outputs) == 6


@pytest.mark.parametrize("family", ["k3", "kimi_linear"])
def test_chunked_prefill_and_one_shot(family, make_llm, trainer_model):
    """A 3-token step budget cuts every prompt into chunks; 1024 prefills each in one step."""
    model = trainer_model(family)
    for budget in (3, 1024):
        outputs = serve(make_llm(family, max_num_batched_tokens=budget), PROMPTS, GREEDY)
        assert assert_bitwise(model, outputs) == 3 * 6


def test_prefix_cache_hit(make_llm, trainer_model):
    llm, model = make_llm("k3", max_num_batched_tokens=64), trainer_model("k3")
    prefix = list(range(500, 548))
    first = serve(llm, [prefix], SAMPLED)[0]
    second = serve(llm, [prefix + [7, 8, 9]], SAMPLED)[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens > 0, "the second request must hit"
    assert assert_bitwise(model, [first, second]) == 2 * 6


def test_preemption_and_recompute(make_llm, trainer_model):
    llm = make_llm("k3", max_num_seqs=4, block_size=4, num_blocks=16, max_num_batched_tokens=64)
    prompts = [list(range(10, 10 + n)) for n in (20, 18, 15, 12)]
    with counted_preemptions(llm) as preempted:
        outputs = serve(llm, prompts, replace(SAMPLED, max_tokens=10))
    assert preempted, "the small pool should have forced a preemption"
    assert assert_bitwise(trainer_model("k3"), outputs) == 4 * 10


def test_bfloat16_model(make_llm, trainer_model):
    outputs = serve(make_llm("k3", dtype="bfloat16"), PROMPTS, SAMPLED)
    assert assert_bitwise(trainer_model("k3", torch.bfloat16), outputs) == 3 * 6
