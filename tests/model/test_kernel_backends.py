"""Kernel backends by name: selection and validation at start, the pending list kept honest, and the
``triton`` backend's glue (stand-in kernels with its batch-level signatures, ``tests/batch_kernels``)
against the ``reference`` oracle on ragged steps: float32 relative error <= 1e-4 on the logits."""

import logging

import pytest
import torch

from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.checkpoint.loader import load_model
from services.engine.model import build_step_metadata
from services.engine.model.backends import (
    PENDING_KERNELS,
    TritonKernels,
    build_kernels,
    check_kernels,
    default_kernels,
    library_kernels,
)
from services.engine.model.numerics import Numerics
from tests.batch_kernels import STAND_INS
from tests.conftest import FAMILIES, relative_error

FAMILY_NAMES = ("attention", "indexer", "kda", "moe", "sampling")


def test_pending_kernels_are_exactly_the_missing_ones():
    """A kernel is listed as pending if and only if this build has no implementation of it."""
    assert library_kernels().missing() == PENDING_KERNELS
    assert set(PENDING_KERNELS) <= set(TritonKernels().names())
    print("pending triton kernels:", ", ".join(PENDING_KERNELS) or "none")


def test_defaults_follow_the_device_and_mode():
    assert default_kernels("cuda") == default_kernels("cuda:1") == "triton"
    assert default_kernels("cpu") == "reference"
    assert default_kernels("cuda", batch_invariant=True) == "reference"


@pytest.mark.parametrize(
    "name, device, kv_format, invariant, interpret, message",
    [
        (
            "fast",
            "cpu",
            "auto",
            False,
            "1",
            r"--kernels: unknown backend 'fast' \(choose from reference, triton\)",
        ),
        ("triton", "cpu", "auto", False, None, r"--kernels: .*set TRITON_INTERPRET=1"),
        ("triton", "cpu", "fp8", False, "1", r"--kernels: triton on the CPU cannot read --kv-format fp8"),
        ("triton", "cpu", "auto", True, "1", r"--kernels: triton cannot run with --batch-invariant"),
    ],
    ids=["unknown-name", "cpu-without-interpreter", "fp8-under-interpreter", "batch-invariant"],
)
def test_bad_backend_is_refused_naming_the_flag(
    name, device, kv_format, invariant, interpret, message, monkeypatch
):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    with pytest.raises(ValueError, match=message):
        check_kernels(name, device, kv_format, invariant)


def test_triton_under_the_interpreter_starts_and_names_each_reference_family(monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_kernels("triton", "cpu")
    with caplog.at_level(logging.INFO, logger="services.engine.model.backends.kernel_set"):
        kernels = build_kernels("triton", Numerics(), "cpu")
    pending_families = kernels.reference_families()
    for family in pending_families:
        assert sum(f"{family} runs its reference (kernel pending" in r.message for r in caplog.records) == 1
    assert kernels.name == "triton"
    assert set(pending_families) | {f for f in FAMILY_NAMES if getattr(kernels, f).kind == "triton"} == set(
        FAMILY_NAMES
    )


def test_kernels_the_interpreter_cannot_run_use_their_reference(caplog):
    library = TritonKernels(**{name: getattr(STAND_INS, name) for name in STAND_INS.names()})
    with caplog.at_level(logging.INFO, logger="services.engine.model.backends.kernel_set"):
        on_cpu = build_kernels("triton", Numerics(), "cpu", library=library)
    assert on_cpu.reference_families() == FAMILY_NAMES
    assert any(
        "kda runs its reference (cannot run under the Triton interpreter" in r.message for r in caplog.records
    )
    assert build_kernels("triton", Numerics(), "cpu", library=STAND_INS).reference_families() == ()


def _ragged_logits(model, kernels, chunks: list[list[list[int]]]) -> torch.Tensor:
    """Run ``chunks[step][seq]`` (empty: the sequence sits the step out) with ``kernels``; all logits."""
    model.kernels = kernels
    cache = ContiguousCache(len(chunks[0]), model.config, torch.float32, "cpu")
    out = []
    with torch.no_grad():
        for pieces in chunks:
            steps = cache.steps(pieces)
            rows = list(range(sum(len(p) for p in pieces)))
            meta = build_step_metadata(
                steps, cache.block_size, "cpu", logit_rows=rows, index_topk=model.index_topk
            )
            out.append(model.forward_step(meta, cache))
            cache.advance(pieces)
    return torch.cat(out)


@pytest.mark.parametrize("family", FAMILIES)
def test_triton_glue_matches_the_reference_on_ragged_steps(family, tiny_checkpoint):
    """Prefill chunks continuing a cached prefix, decodes and a sequence sitting a step out, mixed."""
    model = load_model(tiny_checkpoint(family), dtype=torch.float32)
    ids = torch.randint(0, 1024, (3, 40), generator=torch.Generator().manual_seed(5)).tolist()
    chunks = [
        [ids[0][:13], ids[1][:1], ids[2][:30]],
        [ids[0][13:30], ids[1][1:2], []],
        [ids[0][30:31], ids[1][2:3], ids[2][30:31]],
        [ids[0][31:32], ids[1][3:20], ids[2][31:32]],
    ]
    reference = _ragged_logits(model, build_kernels("reference", model.numerics, "cpu"), chunks)
    triton = build_kernels("triton", model.numerics, "cpu", library=STAND_INS)
    assert triton.reference_families() == ()  # every family ran its triton glue
    got = _ragged_logits(model, triton, chunks)
    error = relative_error(got, reference)
    print(f"{family}: triton (stand-in kernels) vs reference, relative error {error:.2e}")
    assert error <= 1e-4
