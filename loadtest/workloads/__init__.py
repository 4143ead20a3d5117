"""Workloads by name: synthetic generators and replays of public traces.

``build_workload(kind, **options)`` is the one entry point drivers and the CLI use:

- ``synthetic``: random prompts, one request per session (``synthetic.synthetic``).
- ``shared_prefix``: groups of prompts sharing a system prefix (``shared_prefix.shared_prefix``).
- ``multiturn``: growing agent conversations with think/tool pauses and subagents (``multiturn.multiturn``).
- ``tool_agent``: agent runs calling tools, rendered by the model's chat template (``tool_agent.tool_agent``).
- ``trace``: a Mooncake ``.jsonl`` or WEKA ``.json`` trace, detected from the file (``load_trace``).
"""

import inspect
import json
from collections.abc import Callable
from pathlib import Path

from loadtest.workload import Workload
from loadtest.workloads.mooncake import load_mooncake
from loadtest.workloads.multiturn import multiturn
from loadtest.workloads.shared_prefix import shared_prefix
from loadtest.workloads.synthetic import synthetic
from loadtest.workloads.tokens import DEFAULT_LOW_ID
from loadtest.workloads.tool_agent import tool_agent
from loadtest.workloads.weka import load_weka


def trace_format(path: str | Path) -> str:
    """The trace format of ``path``: ``"mooncake"`` (a ``.jsonl`` file) or ``"weka"`` (a folder, or
    a ``.json`` object with ``requests``)."""
    path = Path(path)
    if path.is_dir():
        return "weka"
    if path.suffix == ".jsonl":
        return "mooncake"
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except OSError as error:
            raise ValueError(f"{path}: cannot read trace: {error.strerror or error}") from error
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON: {error}") from error
        if isinstance(data, dict) and "requests" in data:
            return "weka"
    raise ValueError(f"{path}: unknown trace format (expected Mooncake .jsonl or WEKA .json with 'requests')")


def load_trace(
    path: str | Path | list,
    vocab: int,
    scale: int = 1,
    *,
    max_requests: int | None = None,
    max_input_tokens: int | None = None,
    time_scale: float = 1.0,
    salt: str | None = None,
    low: int = DEFAULT_LOW_ID,
    copies: int = 1,
) -> Workload:
    """A trace replay, its format detected from the file (a list or folder: WEKA files).

    ``max_requests`` applies to Mooncake only (the first requests of the file), ``copies`` to WEKA only
    (replays of each agent session, salted apart: ``load_weka``); ``salt`` defaults to the file name
    for Mooncake and to "" for WEKA (whose local ids are salted with the trace id).
    """
    paths = [path] if isinstance(path, str | Path) else list(path)
    formats = {trace_format(p) for p in paths}
    if formats == {"mooncake"} and len(paths) == 1:
        if copies != 1:
            raise ValueError("copies: applies to WEKA traces only (a Mooncake trace has many users already)")
        return load_mooncake(
            paths[0], scale, vocab, max_requests, max_input_tokens, salt, time_scale=time_scale, low=low
        )
    if formats != {"weka"}:
        raise ValueError(f"path: give one Mooncake .jsonl or WEKA .json traces, got {path!r}")
    if max_requests is not None:
        raise ValueError("max_requests: applies to Mooncake traces only (limit WEKA by files instead)")
    return load_weka(
        path,
        scale,
        vocab,
        time_scale=time_scale,
        max_input_tokens=max_input_tokens,
        salt=salt or "",
        low=low,
        copies=copies,
    )


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "synthetic": synthetic,
    "shared_prefix": shared_prefix,
    "multiturn": multiturn,
    "tool_agent": tool_agent,
    "trace": load_trace,
}


def build_workload(kind: str, **options) -> Workload:
    """The workload ``kind`` (a key of ``WORKLOADS``) built from keyword ``options``.

    Raises:
        ValueError: unknown kind, an option the kind does not take or a missing one (naming it), or
            whatever the builder rejects.
    """
    builder = WORKLOADS.get(kind)
    if builder is None:
        raise ValueError(f"kind: unknown workload {kind!r} (known: {', '.join(WORKLOADS)})")
    parameters = inspect.signature(builder).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if not takes_any:
        unknown = sorted(set(options) - set(parameters))
        if unknown:
            known = ", ".join(parameters)
            raise ValueError(f"{unknown[0]}: not an option of workload {kind!r} (options: {known})")
    missing = [
        name
        for name, p in parameters.items()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        and name not in options
    ]
    if missing:
        raise ValueError(f"{missing[0]}: required by workload {kind!r}")
    return builder(**options)


__all__ = [
    "WORKLOADS",
    "build_workload",
    "load_mooncake",
    "load_trace",
    "load_weka",
    "multiturn",
    "shared_prefix",
    "synthetic",
    "tool_agent",
    "trace_format",
]
