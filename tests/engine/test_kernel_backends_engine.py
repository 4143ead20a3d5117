"""``--kernels`` through the engine: chosen at start (bad names and devices refused there), carried in
``EngineConfig``, and the ``triton`` backend's greedy tokens equal the ``reference`` oracle's for 64
steps in float32 over ragged, chunked batches (issue 12's oracle check, CPU-sized)."""

import logging

import pytest
import torch

import services.engine.model.backends.kernel_set as kernel_set
from services.engine import LLM, SamplingParams
from services.engine.engine_config import EngineConfig
from services.engine.model.backends import PENDING_KERNELS
from tests.batch_kernels import STAND_INS
from tests.conftest import relative_error

STEPS = 64
# Small steps force chunked prefills that continue a cached prefix, mixed with decodes.
ENGINE = {"dtype": "float32", "max_num_batched_tokens": 24, "max_num_seqs": 4, "enable_prefix_caching": False}


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(3, 1024, (n,), generator=generator).tolist() for n in (37, 5, 20)]


def _generate(model_dir, kernels: str):
    llm = LLM(str(model_dir), kernels=kernels, **ENGINE)
    params = SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True, logprobs=0)
    return llm, llm.generate(_prompts(), params)


def test_triton_glue_greedy_tokens_equal_the_reference_for_64_steps(tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(kernel_set, "library_kernels", lambda: STAND_INS)
    model_dir = tiny_checkpoint("k3")
    _, want = _generate(model_dir, "reference")
    llm, got = _generate(model_dir, "triton")
    assert llm.engine.model.kernels.reference_families() == ()  # every family ran its triton glue
    for g, w in zip(got, want, strict=True):
        assert len(g.token_ids) == STEPS and g.token_ids == w.token_ids
        assert relative_error(torch.tensor(g.logprobs), torch.tensor(w.logprobs)) <= 1e-4


def test_triton_with_this_builds_kernels_runs_pending_families_on_their_reference(
    tiny_checkpoint, monkeypatch
):
    """What ``--kernels triton`` runs on this branch: the families of ``PENDING_KERNELS`` delegate."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model_dir = tiny_checkpoint("kimi_linear")
    _, want = _generate(model_dir, "reference")
    llm, got = _generate(model_dir, "triton")
    kernels = llm.engine.model.kernels
    assert kernels.name == "triton" and llm.config.kernel_backend == "triton"
    needed = {"attention": {"paged_mla_decode"}, "indexer": {"paged_indexer_topk"}, "moe": {"moe_grouped"}}
    needed |= {"kda": {"kda_varlen", "causal_conv1d_varlen"}, "sampling": {"sample_batch"}}
    pending = {family for family, names in needed.items() if names & set(PENDING_KERNELS)}
    assert set(kernels.reference_families()) == pending
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


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


def test_cuda_graphs_flag_is_a_logged_no_op_on_the_cpu(tiny_checkpoint, caplog):
    with caplog.at_level(logging.INFO, logger="services.engine.engine_core"):
        llm = LLM(str(tiny_checkpoint("kimi_linear")), cuda_graphs=True, max_num_seqs=2)
    assert llm.engine.runner.graphs is None
    assert any("--cuda-graphs: a no-op on the CPU" in r.message for r in caplog.records)
    assert llm.engine.cache.blocks.scratch_id is None  # no padding rows without graphs
