"""``--kernels`` through the engine: chosen at start (bad names and devices refused there), carried in
``EngineConfig``, and the ``triton`` backend with this build's kernels (the Triton interpreter on
CPU) gives the ``reference`` oracle's greedy tokens for 24 steps in float32 over ragged, chunked
batches (issue 12's oracle check, CPU-sized)."""

import logging

import pytest
import torch

import services.engine.model.backends.kernel_set as kernel_set
from services.engine import LLM, SamplingParams
from services.engine.engine_config import EngineConfig
from services.engine.model.backends import library_kernels
from tests.conftest import relative_error
from tests.counted_kernels import KERNEL_FIELDS, counting

STEPS = 24  # the GPU test (tests/gpu) runs 64; interpreted, each step costs about a second
# Small steps force chunked prefills that continue a cached prefix, mixed with decodes.
ENGINE = {"dtype": "float32", "max_num_batched_tokens": 24, "max_num_seqs": 4, "enable_prefix_caching": False}
# The smallest k3 that still runs every kernel: one KDA layer (dense MLP), one MLA + DSA layer (MoE).
# The interpreter pays per program, so two layers instead of four halve the test's time.
TWO_LAYERS = {
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "linear_attn_config": {
        "head_dim": 16,
        "num_heads": 4,
        "short_conv_kernel_size": 4,
        "kda_layers": [1],
        "full_attn_layers": [2],
    },
}


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(3, 1024, (n,), generator=generator).tolist() for n in (37, 5, 20)]


def _generate(model_dir, kernels: str):
    llm = LLM(str(model_dir), kernels=kernels, **ENGINE)
    params = SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True, logprobs=0)
    return llm, llm.generate(_prompts(), params)


def test_triton_greedy_tokens_equal_the_reference_for_24_steps(tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    library, calls = counting(library_kernels())
    monkeypatch.setattr(kernel_set, "library_kernels", lambda: library)
    model_dir = tiny_checkpoint("k3", **TWO_LAYERS)
    _, want = _generate(model_dir, "reference")
    llm, got = _generate(model_dir, "triton")
    kernels = llm.engine.model.kernels
    assert kernels.name == "triton" and llm.config.kernel_backend == "triton"
    assert kernels.reference_families() == ()
    assert set(calls) == KERNEL_FIELDS, "a kernel did not run"
    assert calls["sample_batch"] >= STEPS
    for g, w in zip(got, want, strict=True):
        assert len(g.token_ids) == STEPS and g.token_ids == w.token_ids
        assert relative_error(torch.tensor(g.logprobs), torch.tensor(w.logprobs)) <= 1e-4


def test_backend_defaults_and_bad_choices_at_start(tiny_checkpoint, monkeypatch):
    model_dir = str(tiny_checkpoint("kimi_linear"))
    assert EngineConfig(model=model_dir).kernel_backend == "reference"
    assert EngineConfig(model=model_dir, device="cuda").kernel_backend == "triton"
    assert EngineConfig(model=model_dir, device="cuda", batch_invariant=True).kernel_backend == "reference"
    with pytest.raises(ValueError, match=r"kernels: 'fast' is not supported \(reference, triton\)"):
        EngineConfig(model=model_dir, kernels="fast")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="--kernels: triton on the CPU runs under the Triton interpreter"):
        LLM(model_dir, kernels="triton")
    with pytest.raises(ValueError, match=r"--kernels: triton \(with --batch-invariant: the invariant Triton"):
        LLM(model_dir, kernels="triton", batch_invariant=True)


def test_cuda_graphs_flag_is_a_logged_no_op_on_the_cpu(tiny_checkpoint, caplog):
    with caplog.at_level(logging.INFO, logger="services.engine.cuda_graphs"):
        llm = LLM(str(tiny_checkpoint("kimi_linear")), cuda_graphs=True, max_num_seqs=2)
    assert llm.engine.runner.graphs is None
    assert any("--cuda-graphs: a no-op on the CPU" in r.message for r in caplog.records)
    assert llm.engine.cache.blocks.scratch_id is None  # no padding rows without graphs
