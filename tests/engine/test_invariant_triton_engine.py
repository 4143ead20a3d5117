"""Batch-invariant mode on the invariant Triton kernels (``--kernels triton --batch-invariant``; the
default on CUDA, the Triton interpreter here): chosen at start, every family on the invariant numerics,
a sequence's tokens and logprobs bitwise identical alone, beside other requests and across step token
budgets, and close to the torch invariant ops' logprobs, with KDA on the CF-BI Triton rows."""

from collections import Counter

import numpy as np
import pytest
import torch

from kernels.invariant import kda_triton
from services.engine import LLM, SamplingParams
from services.engine.model import invariant_numerics
from services.engine.model.backends import build_kernels
from services.engine.model.invariant_numerics import InvariantNumerics
from tests.conftest import relative_error

from .test_kernel_backends_engine import TWO_LAYERS

TARGET = list(range(30, 30 + 17))  # past one 16-token KDA chunk; interpreted kernels run a program a row
NEIGHBOURS = [list(range(200, 200 + n)) for n in (1, 13, 6)]
GREEDY = SamplingParams(max_tokens=2, temperature=0, logprobs=0, ignore_eos=True)  # a prefill, a decode step


def _bits(values: list[float]) -> list[int]:
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


def _run(llm: LLM, prompts):
    outputs = llm.generate(prompts, GREEDY)
    llm.engine.check_integrity()
    return [(o.token_ids, _bits(o.logprobs)) for o in outputs]


@pytest.fixture(scope="module")
def make_llm(tiny_checkpoint):
    made = {}

    def make(kernels: str, budget: int = 32):
        if (kernels, budget) not in made:
            made[kernels, budget] = LLM(
                str(tiny_checkpoint("k3", **TWO_LAYERS)),
                kernels=kernels,
                batch_invariant=True,
                dtype="float32",
                max_num_batched_tokens=budget,
                max_num_seqs=4,
                enable_prefix_caching=False,
            )
        return made[kernels, budget]

    return make


def test_invariant_triton_is_chosen_and_every_family_runs_the_invariant_numerics(make_llm):
    model = make_llm("triton").engine.model
    assert isinstance(model.numerics, InvariantNumerics) and model.numerics.device_kernels == "triton"
    assert model.kernels.name == "triton"
    assert set(model.kernels.reference_families()) == {"attention", "indexer", "kda", "moe", "sampling"}
    assert make_llm("reference").engine.model.numerics.device_kernels == "torch"


def _counted(monkeypatch, module, name: str) -> Counter:
    """Count the calls of ``module.name`` (the real function still runs)."""
    calls, real = Counter(), getattr(module, name)

    def counted(*args, **kwargs):
        calls[name] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture(scope="module")
def alone(make_llm):
    """``TARGET`` alone on the Triton engine: ``(output, calls)``, ``calls`` counting the KDA Triton kernel's
    and the torch rows' calls meanwhile."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        calls = _counted(monkeypatch, kda_triton, "kda_fixed_chunk_varlen_triton")
        calls.update(_counted(monkeypatch, invariant_numerics, "kda_fixed_chunk"))
        output = make_llm("triton").generate([TARGET], GREEDY)[0]
    return output, calls


def test_alone_equals_mixed_batches_and_other_budgets(make_llm, alone):
    llm = make_llm("triton")
    want = (alone[0].token_ids, _bits(alone[0].logprobs))
    assert want[1], "VACUOUS: no logprobs"
    # Beside three other requests: over a step's 32 tokens, so the target's prefill shares its first
    # step with three other prefills and is split into a second one (beside their decodes).
    assert _run(llm, NEIGHBOURS + [TARGET])[-1] == want, "beside 3 other requests"
    assert _run(make_llm("triton", budget=5), [TARGET, NEIGHBOURS[0]])[0] == want, "5-token steps"


def test_close_to_the_torch_invariant_ops_and_kda_runs_the_triton_rows(make_llm, alone, monkeypatch):
    """Same tokens as the torch invariant path, and KDA ran the Triton CF-BI kernel, never the torch rows."""
    got, calls = alone
    # one call per KDA layer (one here) and step: the 17-token prefill, then a decode per further token
    assert calls["kda_fixed_chunk_varlen_triton"] == GREEDY.max_tokens and not calls["kda_fixed_chunk"]
    torch_rows = _counted(monkeypatch, invariant_numerics, "kda_fixed_chunk")
    want = make_llm("reference").generate([TARGET], GREEDY)[0]
    assert torch_rows["kda_fixed_chunk"] == GREEDY.max_tokens
    assert got.token_ids == want.token_ids
    assert relative_error(torch.tensor(got.logprobs), torch.tensor(want.logprobs)) <= 1e-4


def test_unknown_device_kernels_and_families_stay_on_the_numerics():
    with pytest.raises(ValueError, match="device_kernels: 'cuda' is not one of torch, triton"):
        InvariantNumerics(device_kernels="cuda")
    kernels = build_kernels("triton", InvariantNumerics(), "cpu")
    assert kernels.name == "triton" and all(
        getattr(kernels, family).kind == "reference" for family in ("attention", "indexer", "kda", "moe")
    )
