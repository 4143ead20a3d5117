"""SamplingParams: vLLM defaults, validation errors that name the field, list-to-tuple coercion."""

from __future__ import annotations

import dataclasses

import pytest

from common.sampling_params import SamplingParams

BAD = {
    "max_tokens_zero": ({"max_tokens": 0}, "max_tokens: must be >= 1"),
    "max_tokens_float": ({"max_tokens": 2.0}, "max_tokens:"),
    "max_tokens_bool": ({"max_tokens": True}, "max_tokens:"),
    "temperature_negative": ({"temperature": -1}, "temperature: must be >= 0, got -1"),
    "temperature_nan": ({"temperature": float("nan")}, "temperature:"),
    "temperature_inf": ({"temperature": float("inf")}, "temperature: must be finite"),
    "temperature_str": ({"temperature": "0.5"}, "temperature:"),
    "top_k_negative": ({"top_k": -1}, "top_k: must be >= 0"),
    "top_k_float": ({"top_k": 1.5}, "top_k:"),
    "top_p_zero": ({"top_p": 0}, "top_p: must be in (0, 1], got 0"),
    "top_p_above_one": ({"top_p": 1.01}, "top_p: must be in (0, 1]"),
    "top_p_nan": ({"top_p": float("nan")}, "top_p:"),
    "min_p_negative": ({"min_p": -0.1}, "min_p: must be in [0, 1]"),
    "min_p_above_one": ({"min_p": 1.5}, "min_p: must be in [0, 1]"),
    "seed_negative": ({"seed": -1}, "seed: must be an integer in [0, 2**63)"),
    "seed_too_big": ({"seed": 2**63}, "seed: must be an integer in [0, 2**63)"),
    "seed_float": ({"seed": 1.0}, "seed:"),
    "stop_empty_string": ({"stop": ["ok", ""]}, "stop: stop strings must be non-empty"),
    "stop_not_string": ({"stop": [3]}, "stop:"),
    "stop_bare_string": ({"stop": "abc"}, "stop: must be a sequence of strings"),
    "stop_token_ids_negative": ({"stop_token_ids": [1, -2]}, "stop_token_ids:"),
    "stop_token_ids_float": ({"stop_token_ids": [1.0]}, "stop_token_ids:"),
    "ignore_eos_int": ({"ignore_eos": 1}, "ignore_eos:"),
    "logprobs_negative": ({"logprobs": -1}, "logprobs: must be between 0 and 20"),
    "logprobs_too_many": ({"logprobs": 21}, "logprobs: must be between 0 and 20"),
    "logprobs_float": ({"logprobs": 1.0}, "logprobs:"),
    "include_stop_str_in_output_str": ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output:"),
}


@pytest.mark.parametrize(("kwargs", "message"), list(BAD.values()), ids=list(BAD))
def test_bad_field_raises_naming_it(kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        SamplingParams(**kwargs)
    assert str(excinfo.value).startswith(message)


def test_defaults_match_vllm():
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_k, params.top_p, params.min_p) == (
        16,
        1.0,
        0,
        1.0,
        0.0,
    )
    assert params.seed is None and params.logprobs is None
    assert params.stop == () and params.stop_token_ids == ()
    assert not params.ignore_eos and not params.include_stop_str_in_output
    assert not params.greedy


GOOD = {
    "greedy": {"temperature": 0},
    "edges": {"top_p": 1.0, "min_p": 1.0, "top_k": 1, "logprobs": 20, "seed": 2**63 - 1, "max_tokens": 1},
    "logprobs_zero": {"logprobs": 0, "seed": 0, "min_p": 0},
    "int_floats": {"temperature": 2, "top_p": 1},
}


@pytest.mark.parametrize("kwargs", list(GOOD.values()), ids=list(GOOD))
def test_valid_values_accepted(kwargs):
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value


def test_lists_become_tuples_and_params_are_hashable():
    params = SamplingParams(stop=["\n\n", "END"], stop_token_ids=[7, 9])
    assert params.stop == ("\n\n", "END") and params.stop_token_ids == (7, 9)
    assert params == SamplingParams(stop=("\n\n", "END"), stop_token_ids=(7, 9))
    assert hash(params) == hash(SamplingParams(stop=("\n\n", "END"), stop_token_ids=(7, 9)))


def test_frozen():
    params = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("temperature", "greedy"),
    [(0.0, True), (1e-6, True), (1e-5, False), (0.7, False), (1.0, False)],
    ids=["zero", "below_eps", "at_eps", "0.7", "1.0"],
)
def test_greedy_property(temperature, greedy):
    assert SamplingParams(temperature=temperature).greedy is greedy
