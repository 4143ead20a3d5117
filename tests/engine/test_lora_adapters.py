"""LoRA adapters in the engine: PEFT-format folders, per-request adapters batched in one step.

Checked on K3 (KDA + MLA with DSA + MoE) and Kimi-Linear: served-with-adapter tokens and logprobs equal
a float32 reference whose weights have the deltas merged in by hand; several adapters and base rows in
one batch each equal their request alone (bitwise in batch-invariant mode); base rows keep the base
model's bits; the prefix cache never shares blocks across adapters; bad folders are refused naming the
field or tensor; unload is refused while a request uses the adapter.
"""

import dataclasses

import numpy as np
import pytest
import torch

from services.engine import LLM, SamplingParams
from services.engine.adapters.merge import scaling_of
from services.engine.adapters.peft_format import AdapterError
from services.engine.adapters.registry import AdapterInUse, UnknownAdapter
from services.engine.adapters.step_lora import StepLora
from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.model.step_metadata import build_step_metadata
from tests.conftest import TEST_DEVICE
from tests.lora_adapters import merged_reference_model, random_pairs, write_peft_adapter

FAMILIES = ["k3", "kimi_linear"]
PROMPT = list(range(40, 40 + 37))
OTHERS = [list(range(200, 219)), list(range(300, 305)), list(range(100, 164))]
GREEDY = SamplingParams(max_tokens=5, temperature=0, logprobs=0, ignore_eos=True)
RANK, ALPHA = 4, 8.0


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


@pytest.fixture(scope="module")
def adapters(tiny_checkpoint, tmp_path_factory):
    """``adapters(family) -> (model_dir, {name: (folder, pairs)})``: two adapters per family."""
    made = {}

    def make(family):
        if family not in made:
            model_dir = tiny_checkpoint(family)
            folders = {}
            for seed, name in ((1, "alpha"), (2, "beta")):
                pairs = random_pairs(model_dir, RANK, seed=seed)
                folder = write_peft_adapter(tmp_path_factory.mktemp(f"{family}-{name}"), pairs, RANK, ALPHA)
                folders[name] = (folder, pairs)
            made[family] = (model_dir, folders)
        return made[family]

    return make


def make_llm(model_dir, folders, invariant, **options):
    llm = LLM(str(model_dir), device=TEST_DEVICE, batch_invariant=invariant, dtype="float32", **options)
    for name, (folder, _) in folders.items():
        llm.load_adapter(name, str(folder))
    return llm


def run(llm, prompts, adapter):
    outputs = llm.generate(prompts, GREEDY, adapter=adapter)
    llm.engine.check_integrity()
    return [(o.token_ids, bits(o.logprobs)) for o in outputs]


@pytest.mark.parametrize("family", FAMILIES)
def test_served_adapter_equals_merged_float32_reference(family, adapters):
    model_dir, folders = adapters(family)
    llm = make_llm(model_dir, folders, invariant=False)
    out = llm.generate([PROMPT], GREEDY, adapter="alpha")[0]
    base = llm.generate([PROMPT], GREEDY)[0]
    assert out.logprobs != base.logprobs, "the adapter changed nothing: the comparison would be vacuous"
    reference = merged_reference_model(model_dir, [(folders["alpha"][1], scaling_of(ALPHA, RANK, False))])
    ids = torch.tensor([PROMPT + out.token_ids[:-1]])
    with torch.no_grad():
        logprobs = torch.log_softmax(reference(ids)[0, len(PROMPT) - 1 :].double(), -1)
    assert logprobs.argmax(-1).tolist() == out.token_ids
    want = logprobs.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(out.logprobs, dtype=torch.float64), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_many_adapters_in_one_batch_equal_each_alone_bitwise(family, adapters):
    model_dir, folders = adapters(family)
    llm = make_llm(model_dir, folders, invariant=True, max_num_batched_tokens=32, block_size=16)
    names = ["alpha", "", "beta", "alpha"]
    prompts = [PROMPT, *OTHERS]
    alone = [run(llm, [prompt], name)[0] for prompt, name in zip(prompts, names, strict=True)]
    mixed = run(llm, prompts, names)
    assert mixed == alone
    # The base row in the mixed batch has the base model's bits: equal to an engine without adapters.
    plain = LLM(str(model_dir), device=TEST_DEVICE, batch_invariant=True, dtype="float32", block_size=16)
    assert run(plain, [prompts[1]], "")[0] == mixed[1]
    assert mixed[0] != run(llm, [PROMPT], "")[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_served_logprobs_equal_the_full_sequence_forward_bitwise(family, adapters):
    """What a trainer computes (one forward over the whole sequence, ``CausalLM.forward(adapter=)``)
    gives the served-with-adapter logprobs bit for bit in batch-invariant mode."""
    model_dir, folders = adapters(family)
    llm = make_llm(model_dir, folders, invariant=True, max_num_batched_tokens=16, block_size=16)
    served = llm.generate([PROMPT, OTHERS[1]], GREEDY, adapter=["alpha", "beta"])[0]
    sequence = PROMPT + served.token_ids[:-1]
    with torch.no_grad():
        logits = llm.engine.model(torch.tensor([sequence]), adapter=llm.engine.adapters.get("alpha"))[0]
    first = len(PROMPT) - 1
    full = [
        float(torch.log_softmax(logits[first + i].float(), dim=-1)[token])
        for i, token in enumerate(served.token_ids)
    ]
    assert bits(full) == bits(served.logprobs)


@pytest.mark.parametrize("invariant", [False, True], ids=["default", "batch-invariant"])
def test_base_rows_of_a_step_keep_the_base_bits(invariant, adapters):
    """Same step, same rows: the base sequence's logits do not change when its neighbour gets an adapter."""
    model_dir, folders = adapters("k3")
    llm = make_llm(model_dir, folders, invariant=invariant)
    model, table = llm.engine.model, llm.engine.adapters.table
    slot = llm.engine.adapters.slot("alpha")
    prompts = [PROMPT, OTHERS[0], OTHERS[1]]

    def logits(adapter_slots):
        cache = ContiguousCache(len(prompts), model.config, torch.float32, "cpu", invariant)
        steps = [
            dataclasses.replace(step, adapter=a)
            for step, a in zip(cache.steps(prompts), adapter_slots, strict=True)
        ]
        meta = build_step_metadata(
            steps, cache.block_size, "cpu", logit_rows=list(range(sum(map(len, prompts))))
        )
        with torch.no_grad():
            return model.forward_step(meta, cache, table)

    base, adapted = logits([0, 0, 0]), logits([0, slot, 0])
    rows = [range(0, len(PROMPT)), range(len(PROMPT) + len(OTHERS[0]), sum(map(len, prompts)))]
    for span in rows:
        assert torch.equal(
            base[span.start : span.stop].view(torch.int32), adapted[span.start : span.stop].view(torch.int32)
        )
    middle = slice(len(PROMPT), len(PROMPT) + len(OTHERS[0]))
    assert not torch.equal(base[middle], adapted[middle])


def test_prefix_cache_is_salted_by_adapter(adapters):
    model_dir, folders = adapters("k3")
    llm = make_llm(model_dir, folders, invariant=False, block_size=16)
    first = llm.generate([PROMPT], GREEDY, adapter="alpha")[0]
    assert first.num_cached_tokens == 0
    assert llm.generate([PROMPT], GREEDY, adapter="beta")[0].num_cached_tokens == 0
    assert llm.generate([PROMPT], GREEDY)[0].num_cached_tokens == 0
    again = llm.generate([PROMPT], GREEDY, adapter="alpha")[0]
    assert again.num_cached_tokens == 32
    assert again.token_ids == first.token_ids


def test_reloading_a_name_with_other_weights_does_not_reuse_its_cache(adapters):
    model_dir, folders = adapters("k3")
    llm = make_llm(model_dir, {"alpha": folders["alpha"]}, invariant=False, block_size=16)
    llm.generate([PROMPT], GREEDY, adapter="alpha")
    llm.unload_adapter("alpha")
    llm.load_adapter("alpha", str(folders["beta"][0]))
    assert llm.generate([PROMPT], GREEDY, adapter="alpha")[0].num_cached_tokens == 0


def test_unload_is_refused_while_a_request_uses_the_adapter(adapters):
    model_dir, folders = adapters("k3")
    llm = make_llm(model_dir, folders, invariant=False)
    engine = llm.engine
    request = engine.add_request(PROMPT, GREEDY, adapter="alpha")
    engine.step()
    with pytest.raises(AdapterInUse, match="adapter: 'alpha' is used by 1 unfinished request"):
        engine.unload_adapter("alpha")
    while engine.has_unfinished:
        engine.step()
    assert len(request.output_ids) == GREEDY.max_tokens
    engine.unload_adapter("alpha")
    assert engine.adapters.names == ["beta"]
    with pytest.raises(UnknownAdapter, match="adapter: 'alpha' is not loaded \\(loaded: beta\\)"):
        engine.add_request(PROMPT, GREEDY, adapter="alpha")
    with pytest.raises(UnknownAdapter):
        engine.unload_adapter("alpha")


def _one_pair(model_dir, module="model.layers.0.self_attn.q_proj"):
    return {module: random_pairs(model_dir, RANK)[module]}


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing-weights", "adapter_model.safetensors: missing"),
        ("modules-to-save", "modules_to_save is set"),
        ("wrong-rank", "lora_A.weight: rank 4 .* does not match r=8"),
        ("wrong-shape", r"q_proj.lora_B.weight: shape \[65, 4\] does not fit the base module"),
        ("unknown-module", "the model has no module 'model.layers.0.self_attn.nope_proj'"),
        ("not-adaptable", "module 'model.layers.2.self_attn.kv_b_proj' .* cannot be adapted"),
        ("missing-half", "lora_B.weight is missing"),
    ],
)
def test_bad_adapters_are_refused_naming_the_field(case, match, adapters, tmp_path):
    model_dir, _ = adapters("k3")
    pairs = _one_pair(model_dir)
    options = {}
    if case == "modules-to-save":
        options["modules_to_save"] = ["lm_head"]
    if case == "wrong-rank":
        options["r"] = 8
    if case == "wrong-shape":
        a, b = pairs["model.layers.0.self_attn.q_proj"]
        pairs = {"model.layers.0.self_attn.q_proj": (a, torch.zeros(65, RANK))}
    if case == "unknown-module":
        pairs = {"model.layers.0.self_attn.nope_proj": next(iter(pairs.values()))}
    if case == "not-adaptable":
        pairs = {"model.layers.2.self_attn.kv_b_proj": (torch.zeros(RANK, 32), torch.zeros(128, RANK))}
    folder = write_peft_adapter(tmp_path / "bad", pairs, RANK, ALPHA, **options)
    if case == "missing-weights":
        (folder / "adapter_model.safetensors").unlink()
    if case == "missing-half":
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / "adapter_model.safetensors"))
        tensors = {k: v for k, v in tensors.items() if "lora_B" not in k}
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    llm = LLM(str(model_dir), device=TEST_DEVICE, dtype="float32")
    with pytest.raises(AdapterError, match=match):
        llm.load_adapter("bad", str(folder))
    assert llm.engine.adapters.names == []


def test_segmented_kernel_path_equals_the_grouped_path(adapters):
    """``StepLora(segmented=True)`` (the GPU's Triton kernel, interpreted here) gives the grouped path's
    rows within float32 tolerance and leaves base rows bitwise untouched."""
    model_dir, folders = adapters("k3")
    llm = make_llm(model_dir, folders, invariant=False)
    alpha, beta = (llm.engine.adapters.get(name) for name in ("alpha", "beta"))
    module = llm.engine.model.model.layers[2].self_attn.q_a_proj
    x = torch.randn(9, module.in_features, generator=torch.Generator().manual_seed(3))
    base = llm.engine.model.numerics.linear(x, module.weight)
    groups = [(alpha, torch.tensor([0, 4, 5])), (beta, torch.tensor([2, 8]))]
    grouped = StepLora(groups).linear(module, x, base, llm.engine.model.numerics)
    segmented = StepLora(groups, segmented=True).linear(module, x, base, llm.engine.model.numerics)
    untouched = [1, 3, 6, 7]
    assert torch.equal(segmented[untouched], base[untouched])
    assert not torch.equal(segmented[[0, 2]], base[[0, 2]])
    torch.testing.assert_close(segmented, grouped, rtol=1e-5, atol=1e-5)
