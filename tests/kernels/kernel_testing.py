"""Helpers shared by the kernel tests."""

from __future__ import annotations

import torch


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|``, computed in float64."""
    actual, expected = actual.to(torch.float64), expected.to(torch.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()


def assert_rel(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str = "output") -> None:
    """Fail with the measured error when ``rel_err(actual, expected) > tol`` or anything is not finite."""
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = rel_err(actual, expected)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e}"
