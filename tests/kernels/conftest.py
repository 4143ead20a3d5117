"""Kernel-test fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def nan_filled_empty(monkeypatch):
    """Fill every fresh ``torch.empty`` float buffer with NaN, so memory a kernel forgets to write shows."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        if out.is_floating_point() or out.is_complex():
            out.fill_(float("nan"))
        return out

    monkeypatch.setattr(torch, "empty", empty)
