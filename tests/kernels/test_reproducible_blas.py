"""MKL's strict reproducible mode: requested at start, checked before the invariant path multiplies."""

import os
import subprocess
import sys

import pytest

from kernels.invariant.reproducible_blas import MKL_CBWR_VARIABLE, STRICT_AUTO, mkl_is_strict
from tests.services.workers import REPO

needs_mkl = pytest.mark.skipif(mkl_is_strict() is None, reason="this torch build has no MKL")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (MKL not started yet) with ``env`` replacing MKL_CBWR."""
    environment = {k: v for k, v in os.environ.items() if k != MKL_CBWR_VARIABLE}
    environment.update(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120, cwd=REPO
    )


INVARIANT_PRODUCT = (
    "import torch\n"
    "from services.engine.model.invariant_numerics import InvariantNumerics\n"
    "InvariantNumerics().linear(torch.randn(3, 64), torch.randn(32, 64))\n"
)
MODE = "from kernels.invariant.reproducible_blas import mkl_is_strict; print('strict', mkl_is_strict())\n"


@needs_mkl
def test_the_suite_runs_in_strict_mode():
    assert os.environ[MKL_CBWR_VARIABLE] == STRICT_AUTO
    assert mkl_is_strict() is True


@needs_mkl
def test_the_engine_and_the_command_line_request_strict_mode_at_import():
    for package in ("services.engine", "cli"):
        result = _run(f"import {package}, torch\ntorch.randn(8, 8) @ torch.randn(8, 8)\n{MODE}")
        assert result.returncode == 0, result.stderr
        assert "strict True" in result.stdout, package


@needs_mkl
def test_invariant_path_switches_mkl_to_strict_when_it_has_not_started():
    result = _run(
        "import torch\nfrom kernels.invariant.reproducible_blas import ensure_strict_mkl\n"
        f"ensure_strict_mkl()\n{MODE}"
    )
    assert result.returncode == 0, result.stderr
    assert "strict True" in result.stdout


@needs_mkl
@pytest.mark.parametrize("mode", ["COMPATIBLE", "AUTO"], ids=["compatible", "auto-not-strict"])
def test_invariant_path_refuses_mkl_started_in_a_non_strict_mode(mode):
    result = _run("import torch\ntorch.randn(8, 8) @ torch.randn(8, 8)\n" + INVARIANT_PRODUCT, MKL_CBWR=mode)
    assert result.returncode != 0
    assert "RuntimeError" in result.stderr and f"{MKL_CBWR_VARIABLE}={STRICT_AUTO}" in result.stderr


@needs_mkl
def test_invariant_path_runs_when_started_strict():
    result = _run(INVARIANT_PRODUCT + MODE, MKL_CBWR=STRICT_AUTO)
    assert result.returncode == 0, result.stderr
    assert "strict True" in result.stdout
