"""Shared fixtures: tiny random checkpoints, written once per test session."""

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch


def _bind_transformers_kimi_to_torch() -> None:
    """transformers' Kimi-Linear binds its KDA functions to fla's kernels when fla is importable, once,
    when its modeling module is imported; fla's Triton kernels cannot run on a CPU. Without a GPU the
    module is imported here first with fla hidden, so every test compares against its torch path."""
    saved = {name: module for name, module in sys.modules.items() if name == "fla" or name.startswith("fla.")}
    sys.modules["fla"] = None  # ``import fla`` raises ImportError while this is in place
    try:
        importlib.import_module("transformers.models.kimi_linear.modeling_kimi_linear")
    finally:
        del sys.modules["fla"]
        sys.modules.update(saved)


if not torch.cuda.is_available():
    # Triton picks compiled or interpreted mode when a kernel module is first imported: without a GPU
    # every Triton kernel the tests reach runs under the interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _bind_transformers_kimi_to_torch()

# Imported after the set-up above: they reach Triton kernels and transformers' modeling modules.
from kernels.invariant.reproducible_blas import request_strict_mkl  # noqa: E402
from services.engine.checkpoint.init_folder import init_checkpoint  # noqa: E402
from tests.relative_error import relative_error  # noqa: E402, F401 (the tests import it from here too)

request_strict_mkl()  # before any test multiplies: MKL reads its reproducibility mode once, at its first call
# One compute thread per process (and, through the environment, per worker process a test starts):
# ``make test`` runs two pytest workers on two cores, and every CPU matrix product's thread barrier
# stalls while another process holds the core (a tiny model's forward measured 8x slower with 2
# threads than with 1 on a loaded 2-core box). An OMP_NUM_THREADS set by the user is kept; the tests
# that are about thread counts set their own.
torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))

FAMILIES = ("k3", "kimi_linear", "deepseek_v32")
# Engine tests run on this device; the GPU run sets BATON_TEST_DEVICE=cuda.
TEST_DEVICE = os.environ.get("BATON_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """``tiny_checkpoint(family, layout="hub", **config_overrides) -> Path`` (with a tokenizer), cached."""
    made: dict[tuple, Path] = {}

    def make(family: str, layout: str = "hub", seed: int = 0, **overrides) -> Path:
        key = (family, layout, seed, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"{family}-{layout}")
            init_checkpoint(out, family, "tiny", seed=seed, layout=layout, overrides=overrides)
            made[key] = out
        return made[key]

    return make


# The files that take longest on a 2-core runner, longest first. The first ten: each file alone with
# -p no:xdist on the shared 2-core box (load 2-7), 2026-12-01 evening, seconds in the comments; the
# rest: the same measure under load 7-12 that afternoon, after the suite went to one thread per process.
# (tests/lifecycle's files, ~117 s together, stay together: they share the package's slow workers.)
# ``make test`` runs files whole on 2 workers (``--dist loadfile --no-loadscope-reorder``): a long
# file handed out last would run on alone at the end, so these go first, the rest as collected.
SLOWEST_FIRST = (
    "tests/services/test_rolling_restart.py",  # 84-112 (one step of the roll since: about 2/3 the CPU time)
    "tests/parallel/test_rank_group.py",  # 72
    "tests/faults/test_fault_suite.py",  # 55
    "tests/engine/test_invariant_triton_engine.py",  # 43
    "tests/cli/test_cli.py",  # 42
    "tests/parallel/test_dcp_generate.py",  # 40
    "tests/cluster_secret/test_served_cluster.py",  # 39 (alone, 2026-12-02)
    "tests/services/test_end_to_end.py",  # 34
    "tests/parallel/test_dcp_decode.py",  # 26-37
    "tests/parallel/test_model_parallel.py",  # 28
    "tests/parallel/test_prefill_parallel.py",  # 23
    "tests/trainer/test_trainer_bitwise.py",
    "tests/engine/test_batch_invariance.py",
    "tests/engine/test_lora_adapters.py",
    "tests/engine/test_llm.py",
    "tests/services/test_dispatch.py",
    "tests/trainer/test_trainer_gradients.py",
    "tests/engine/test_handoff.py",
    "tests/model/test_incremental_forward.py",
)


def pytest_collection_modifyitems(config, items):
    """Puts the tests of ``SLOWEST_FIRST`` first (stable: every other test keeps its place)."""
    place = {path: index for index, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: place.get(item.nodeid.split("::")[0], len(place)))
