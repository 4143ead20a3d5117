"""Causal depthwise short convolution: per-tap loop, state carry across splits, short inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.kimi_linear import modeling_kimi_linear as hf_kimi

from kernels.conv.naive import causal_conv1d
from tests.kernels.kernel_testing import assert_rel

TOL = 1e-6


def conv_loop(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None):
    """Explicit reference in float64: ``y[t] = silu(sum_j w[:, j] * input[t - (K-1) + j])``."""
    batch, seq_len, channels = x.shape
    kernel = weight.shape[-1]
    x, weight = x.double(), weight.double()
    state = torch.zeros(batch, channels, kernel - 1, dtype=torch.float64) if state is None else state.double()

    def input_at(p: int) -> torch.Tensor:  # p < 0 reads the carried inputs, -1 being the newest
        return x[:, p] if p >= 0 else state[:, :, kernel - 1 + p]

    y = torch.zeros(batch, seq_len, channels, dtype=torch.float64)
    for t in range(seq_len):
        for j in range(kernel):
            y[:, t] += weight[:, j] * input_at(t - (kernel - 1) + j)
    final = torch.stack([input_at(seq_len - (kernel - 1) + i) for i in range(kernel - 1)], dim=-1)
    return F.silu(y), final


CASES = {  # name: (T, kernel)
    "T1_k4": (1, 4),
    "T2_k4": (2, 4),
    "T3_k4": (3, 4),
    "T9_k4": (9, 4),
    "T40_k4": (40, 4),
    "T7_k2": (7, 2),
    "T5_k6": (5, 6),
}


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "init_state"])
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_matches_per_tap_loop(case, with_state):
    torch.manual_seed(0)
    seq_len, kernel = case
    batch, channels = 2, 12
    x = torch.randn(batch, seq_len, channels)
    weight = torch.randn(channels, kernel)
    state = torch.randn(batch, channels, kernel - 1) if with_state else None

    y, final = causal_conv1d(x, weight, state)
    y_ref, final_ref = conv_loop(x, weight, state)

    assert y.shape == (batch, seq_len, channels) and final.shape == (batch, channels, kernel - 1)
    assert_rel(y, y_ref, TOL, "y")
    # the carried inputs are copies of the inputs: bitwise
    assert torch.equal(final, final_ref.float())
    if with_state and seq_len < kernel - 1:
        assert torch.equal(final[..., : kernel - 1 - seq_len], state[..., seq_len:]), "old inputs must remain"


SPLITS = [[1], [2], [5], [1, 1, 1], [3, 1, 4]]  # leading piece lengths; the rest of the sequence follows


@pytest.mark.parametrize("splits", SPLITS, ids=["split_" + "_".join(map(str, s)) for s in SPLITS])
def test_split_sequence_carries_state(splits):
    torch.manual_seed(1)
    batch, seq_len, channels, kernel = 2, 11, 8, 4
    x = torch.randn(batch, seq_len, channels)
    weight = torch.randn(channels, kernel)
    state0 = torch.randn(batch, channels, kernel - 1)
    y_whole, final_whole = causal_conv1d(x, weight, state0)

    bounds = [0, *torch.tensor(splits).cumsum(0).tolist(), seq_len]
    state, pieces = state0, []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        y, state = causal_conv1d(x[:, lo:hi], weight, state)
        pieces.append(y)
    assert_rel(torch.cat(pieces, dim=1), y_whole, TOL, "y")
    assert torch.equal(state, final_whole)


def test_token_by_token_decode_matches_prefill():
    torch.manual_seed(2)
    batch, seq_len, channels, kernel = 3, 9, 8, 4
    x = torch.randn(batch, seq_len, channels)
    weight = torch.randn(channels, kernel)
    y_whole, final_whole = causal_conv1d(x, weight, None)
    state, pieces = None, []
    for t in range(seq_len):
        y, state = causal_conv1d(x[:, t : t + 1], weight, state)
        pieces.append(y)
    assert_rel(torch.cat(pieces, dim=1), y_whole, TOL, "y")
    assert torch.equal(state, final_whole)


def test_matches_transformers_conv_functions():
    torch.manual_seed(3)
    batch, seq_len, channels, kernel = 2, 10, 16, 4
    x = torch.randn(batch, seq_len, channels)
    weight = torch.randn(channels, kernel)

    y, final = causal_conv1d(x, weight, None)
    y_hf = hf_kimi.causal_conv1d_fn(x.transpose(1, 2), weight, activation="silu").transpose(1, 2)
    assert_rel(y, y_hf, TOL, "prefill y")

    x_next = torch.randn(batch, 1, channels)
    conv_state = F.pad(x.transpose(1, 2), (kernel - 1, 0))[..., -kernel:].contiguous()  # hf keeps K inputs
    y_next, final_next = causal_conv1d(x_next, weight, final)
    y_hf_next = hf_kimi.causal_conv1d_update(x_next.transpose(1, 2), conv_state, weight, activation="silu")
    assert_rel(y_next, y_hf_next.transpose(1, 2), TOL, "decode y")
    assert torch.equal(final_next, conv_state[..., 1:])


def test_bf16_input_returns_bf16():
    torch.manual_seed(4)
    x = torch.randn(2, 6, 8, dtype=torch.bfloat16)
    weight = torch.randn(8, 4)
    y, final = causal_conv1d(x, weight, None)
    y_ref, _ = conv_loop(x.float(), weight, None)
    assert y.dtype == torch.bfloat16
    assert_rel(y, y_ref, 1e-2, "y")
