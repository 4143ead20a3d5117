"""Typed readers for the fields of a JSON request body; a bad value raises ``RequestError`` naming it.

JSON ``null`` counts as absent everywhere (OpenAI clients send ``"logprobs": null`` and the like).
"""

import math
import reprlib
from collections.abc import Mapping
from typing import Any

from common.limits import MAX_LABEL_CHARS, MAX_STOP_CHARS, MAX_STOP_STRINGS, FieldError, check_text

UINT32_MAX = 2**32 - 1
_MISSING = object()
# Quotes a client's value in an error message: bounded in length and depth, whatever it sent.
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxstring, _QUOTE.maxother, _QUOTE.maxlist, _QUOTE.maxdict = 2, 40, 40, 4, 4


class RequestError(Exception):
    """A request the front refuses before calling the router.

    Args:
        param: the offending field as the client spelled it (``max_tokens``, ``messages[2].content``),
            or None when no single field is at fault.
        message: starts with the field name, e.g. ``max_tokens: must be a positive integer, got 0``.
        status: the HTTP status (400, or 413 for an oversized body).
    """

    def __init__(self, param: str | None, message: str, status: int = 400):
        super().__init__(message)
        self.param = param
        self.message = message
        self.status = status


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def quote(value: Any) -> str:
    """A client's value for an error message: at most 40 characters, however large or deep it is."""
    text = _QUOTE.repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def text(value: str, name: str, max_chars: int) -> str:
    """``value`` when it has at most ``max_chars`` characters and no lone surrogate."""
    try:
        check_text(value, name, max_chars)
    except FieldError as error:
        raise RequestError(error.field, str(error)) from None
    return value


def get(body: Mapping[str, Any], name: str) -> Any:
    """The field's value, or None when it is absent or null."""
    return body.get(name)


def integer(
    body: Mapping[str, Any], name: str, default: Any, low: int, high: int = UINT32_MAX, what: str = ""
) -> Any:
    """An integer in ``[low, high]`` (``default`` when absent); ``what`` replaces the range wording."""
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        wording = what or f"must be an integer in [{low}, {high}]"
        raise RequestError(name, f"{name}: {wording}, got {quote(value)}")
    return value


def number(
    body: Mapping[str, Any], name: str, default: Any, low: float, high: float, low_open: bool = False
) -> Any:
    """A finite number in ``[low, high]`` (``(low, high]`` with ``low_open``); ``default`` when absent."""
    value = body.get(name)
    if value is None:
        return default
    low_ok = _is_number(value) and (value > low if low_open else value >= low)
    # ``value > high`` first: math.isfinite overflows on an integer past float range (JSON allows one).
    if not low_ok or value > high or not math.isfinite(value):
        bracket = "(" if low_open else "["
        raise RequestError(name, f"{name}: must be a number in {bracket}{low}, {high}], got {quote(value)}")
    return float(value)


def boolean(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """``true`` or ``false`` (``default`` when absent)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(name, f"{name}: must be a boolean, got {quote(value)}")
    return value


def string(body: Mapping[str, Any], name: str, default: str = "", max_chars: int = MAX_LABEL_CHARS) -> str:
    """A string of at most ``max_chars`` characters (``default`` when absent); labels by default."""
    value = body.get(name)
    if value is None:
        return text(default, name, max_chars)  # a default from a header is the client's too
    if not isinstance(value, str):
        raise RequestError(name, f"{name}: must be a string, got {quote(value)}")
    return text(value, name, max_chars)


def strings(body: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """One non-empty string or a list of them (``stop``), within the stop-string limits."""
    value = body.get(name)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise RequestError(name, f"{name}: must be a non-empty string or a list of them, got {quote(value)}")
    if len(items) > MAX_STOP_STRINGS:
        raise RequestError(name, f"{name}: {len(items)} strings, more than the limit of {MAX_STOP_STRINGS}")
    for j, item in enumerate(items):
        text(item, name if isinstance(value, str) else f"{name}[{j}]", MAX_STOP_CHARS)
    return tuple(items)


def token_ids(value: Any, name: str, max_count: int | None = None) -> tuple[int, ...]:
    """A list of token ids (non-negative 32-bit integers), at most ``max_count`` of them."""
    if not isinstance(value, list) or not all(_is_int(t) and 0 <= t <= UINT32_MAX for t in value):
        raise RequestError(name, f"{name}: must be a list of token ids (integers >= 0), got {quote(value)}")
    if max_count is not None and len(value) > max_count:
        raise RequestError(name, f"{name}: {len(value)} ids, more than the limit of {max_count}")
    return tuple(value)


def only(body: Mapping[str, Any], name: str, allowed: tuple, message: str) -> None:
    """Refuse a field unless it is absent or one of ``allowed`` (features Baton does not serve)."""
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        return
    if not any(type(value) is type(a) and value == a for a in allowed):
        raise RequestError(name, f"{name}: {message}, got {quote(value)}")
