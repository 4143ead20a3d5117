"""Device-kernel tests run on CUDA when there is one, else on CPU under Triton's interpreter.

Triton chooses the interpreter when a kernel is decorated, so the variable is set here, before the
test modules import any kernel module.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
