"""``relative_error``, the suite's float comparison, in a module of its own: code that spawned ranks
import (a rank body in a test module) reaches it without importing ``conftest``, whose set-up imports
transformers' modeling modules (about 5 s of CPU in each rank process)."""

import torch


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max |want|`` in float64."""
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
