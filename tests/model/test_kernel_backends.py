"""Kernel backends by name: selection and validation at start, which families the ``triton`` backend
runs where, and the ``triton`` backend with this build's library kernels (under the Triton
interpreter on CPU) against the ``reference`` oracle on ragged paged steps: float32 relative error
<= 1e-4 on every layer's output and on the logits, for every family and for FP8 rows."""

import dataclasses
import logging

import pytest
import torch

from services.engine.checkpoint.loader import load_model
from services.engine.model.backends import (
    build_kernels,
    check_kernels,
    default_kernels,
    library_kernels,
)
from services.engine.model.numerics import Numerics
from tests.conftest import FAMILIES, relative_error
from tests.counted_kernels import KERNEL_FIELDS, counting
from tests.model.ragged_steps import ragged_chunks, run_ragged

FAMILY_NAMES = ("attention", "indexer", "kda", "moe", "sampling")


def test_library_has_every_kernel_and_its_flags_name_real_ones():
    library = library_kernels()
    assert all(callable(getattr(library, name)) for name in KERNEL_FIELDS)
    assert library.interpretable == KERNEL_FIELDS  # all take CPU tensors (kda_varlen: its reference)
    assert library.reads_fp8 == {"paged_mla_decode", "paged_indexer_topk"}


def test_defaults_follow_the_device_and_mode():
    assert default_kernels("cuda") == default_kernels("cuda:1") == "triton"
    assert default_kernels("cpu") == "reference"
    assert default_kernels("cuda", batch_invariant=True) == "reference"  # invariant Triton: opt-in


@pytest.mark.parametrize(
    "name, device, invariant, interpret, message",
    [
        ("fast", "cpu", False, "1", r"--kernels: unknown backend 'fast' \(choose from reference, triton\)"),
        ("triton", "cpu", False, None, r"--kernels: .*set TRITON_INTERPRET=1"),
        (
            "triton",
            "cpu",
            True,
            None,
            r"--kernels: triton \(with --batch-invariant: the invariant Triton kernels\) on the CPU .*"
            "TRITON_INTERPRET=1",
        ),
        pytest.param(
            "triton",
            "cuda",
            False,
            "1",
            r"--kernels: triton on --device cuda needs a CUDA GPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible"),
        ),
    ],
    ids=["unknown-name", "cpu-without-interpreter", "invariant-without-interpreter", "cuda-without-a-gpu"],
)
def test_bad_backend_is_refused_naming_the_flag(name, device, invariant, interpret, message, monkeypatch):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    with pytest.raises(ValueError, match=message):
        check_kernels(name, device, invariant)


@pytest.mark.parametrize("kv_format", ["auto", "fp8"])
def test_triton_under_the_interpreter_runs_every_family_on_its_kernel(kv_format, monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_kernels("triton", "cpu")
    with caplog.at_level(logging.INFO, logger="services.engine.model.backends.kernel_set"):
        kernels = build_kernels("triton", Numerics(), "cpu", kv_format)
    assert kernels.name == "triton" and kernels.reference_families() == ()
    assert all(getattr(kernels, family).kind == "triton" for family in FAMILY_NAMES)
    assert not [r.message for r in caplog.records if "runs its reference" in r.message]


def test_kernels_that_cannot_run_here_use_their_reference_and_say_so(caplog):
    library = library_kernels()
    with caplog.at_level(logging.INFO, logger="services.engine.model.backends.kernel_set"):
        on_cpu = build_kernels(
            "triton", Numerics(), "cpu", library=dataclasses.replace(library, interpretable=frozenset())
        )
        no_fp8 = build_kernels(
            "triton", Numerics(), "cpu", "fp8", library=dataclasses.replace(library, reads_fp8=frozenset())
        )
    assert on_cpu.reference_families() == FAMILY_NAMES
    assert no_fp8.reference_families() == ("attention", "indexer")
    messages = [r.message for r in caplog.records]
    assert sum("kda runs its reference (cannot run under the Triton interpreter" in m for m in messages) == 1
    assert (
        sum("attention runs its reference (cannot read FP8 rows: paged_mla_decode)" in m for m in messages)
        == 1
    )


@pytest.mark.parametrize(
    "family, kv_format", [(f, "auto") for f in FAMILIES] + [("k3", "fp8")], ids=[*FAMILIES, "k3-fp8"]
)
def test_triton_kernels_match_the_reference_per_layer_on_ragged_steps(family, kv_format, tiny_checkpoint):
    """Prefill chunks, a chunk continuing a cached prefix, decodes and a sequence sitting a step out,
    on scattered block tables; every layer's output and the logits within 1e-4 in float32."""
    model = load_model(tiny_checkpoint(family), dtype=torch.float32)
    chunks = ragged_chunks()
    want_layers, want, _ = run_ragged(
        model, build_kernels("reference", model.numerics, "cpu"), chunks, kv_format
    )
    library, calls = counting(library_kernels())
    triton = build_kernels("triton", model.numerics, "cpu", kv_format, library=library)
    assert triton.reference_families() == ()
    got_layers, got, _ = run_ragged(model, triton, chunks, kv_format)
    errors = [relative_error(g, w) for g, w in zip(got_layers, want_layers, strict=True)]
    logits_error = relative_error(got, want)
    shown = ", ".join(f"{e:.1e}" for e in errors)
    print(f"{family} {kv_format}: per layer [{shown}], logits {logits_error:.1e}")
    needed = KERNEL_FIELDS - {"sample_batch"}
    if model.config.indexer is None:
        needed -= {"paged_indexer_topk"}
    if "kda" not in model.config.layer_types:
        needed -= {"kda_varlen", "causal_conv1d_varlen"}
    assert set(calls) == needed, "a kernel the model needs did not run"
    for index, error in enumerate(errors):
        assert error <= 1e-4, f"layer {index}: relative error {error:.2e}"
    assert logits_error <= 1e-4
