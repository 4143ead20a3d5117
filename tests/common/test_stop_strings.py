"""``stop_cut``: the one stop-string rule of the engine's ``LLM`` and the router."""

import pytest

from common.stop_strings import stop_cut

CASES = {
    "none": ("hello world", ("xyz",), False, None),
    "no-stops": ("hello world", (), False, None),
    "cut-before": ("hello world", ("wor",), False, 6),
    "keep-stop": ("hello world", ("wor",), True, 9),
    "earliest-wins": ("a.b!c", ("!", "."), False, 1),
    "tie-least-string": ("hello world", ("wo", "wor"), True, 8),
}


@pytest.mark.parametrize("text, stops, include, expected", list(CASES.values()), ids=list(CASES))
def test_stop_cut(text, stops, include, expected):
    assert stop_cut(text, stops, include) == expected
