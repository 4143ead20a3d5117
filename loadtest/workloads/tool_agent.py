"""Tool-calling agent sessions, rendered through the served model's chat template.

Every session is one agent run: a system prompt and a set of declared tools (the same for every
session: the shared prefix an agent fleet sends), a task from the user, then ``turns`` rounds of the
agent calling a tool and the tool's result coming back. Turn ``k`` sends the whole conversation so far
with the generation prompt::

    turn 0:  | tools | system | task |
    turn 1:  | tools | system | task | call 0 | result 0 |
    turn 2:  | tools | system | task | call 0 | result 0 | call 1 | result 1 |

rendered by the model's own template (its tool-declaration block, tool-call markers and tool-result
turns), so the prompts are what an OpenAI client with ``tools`` would make the server build. The calls
are synthetic (a tool of the declared set, JSON arguments), not what the model generated, so the server
can reuse everything but the newest call and result. Tool results have realistic sizes: log-normal
token counts (a median and a spread, clipped; file reads and test logs of a few hundred to thousands of
tokens), their text made of ordinary token ids in ``[low, vocab)`` decoded by the tokenizer, so the
rendered lengths match the drawn ones to within a few tokens. Each later turn waits ``tool_time_s``
(the tool running).
"""

import json
from pathlib import Path

import numpy as np

from common.tokenizer import Tokenizer
from loadtest.workload import Session, Turn, Workload
from loadtest.workloads.synthetic import check_positive
from loadtest.workloads.tokens import DEFAULT_LOW_ID, token_stream

SYSTEM_PROMPT = (
    "You are a coding agent working in a software repository. Use the tools to read, search, edit and "
    "test the code; call one tool at a time and wait for its result; answer when the task is done."
)


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def _string(description: str) -> dict:
    return {"type": "string", "description": description}


TOOLS = (
    _function("read_file", "Read a file of the repository.", {"path": _string("file path")}, ["path"]),
    _function(
        "search",
        "Search the repository's files for a regular expression.",
        {"pattern": _string("regular expression"), "path": _string("folder to search")},
        ["pattern"],
    ),
    _function(
        "edit_file",
        "Replace one occurrence of a string in a file.",
        {"path": _string("file path"), "old": _string("text to replace"), "new": _string("replacement")},
        ["path", "old", "new"],
    ),
    _function("run_tests", "Run the test suite or one test file.", {"target": _string("test path")}, []),
    _function("list_dir", "List a folder of the repository.", {"path": _string("folder path")}, ["path"]),
    _function(
        "run_shell", "Run a shell command in the repository.", {"command": _string("command")}, ["command"]
    ),
)


def _load(folder: str | Path) -> Tokenizer:
    try:
        return Tokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise ValueError(f"tokenizer: cannot load a tokenizer from {str(folder)!r}: {error}") from None


def tool_agent(
    tokenizer: str | Path | Tokenizer,
    num_sessions: int,
    turns: int,
    output_len: int,
    vocab: int,
    seed: int = 0,
    *,
    task_len: int = 128,
    result_median: int = 600,
    result_sigma: float = 1.0,
    result_max: int = 8192,
    tool_time_s: float = 0.5,
    low: int = DEFAULT_LOW_ID,
) -> Workload:
    """``num_sessions`` agent runs of ``turns`` turns, rendered with ``tokenizer``'s chat template.

    Args:
        tokenizer: the served model's folder (or its ``Tokenizer``): its chat template renders the
            tools, calls and results.
        turns: requests per session (the first answers the task, each later one a tool result).
        output_len: ``max_tokens`` of every turn (a tool call's JSON is tens of tokens).
        vocab, low: tool-result and task text is made of ids in ``[low, vocab)``; ``vocab`` at most the
            tokenizer's ordinary (non-added) tokens.
        task_len: tokens of the user's task message.
        result_median, result_sigma, result_max: tool-result sizes in tokens, log-normal with this
            median and spread (sigma of the log), clipped to ``[1, result_max]``.
        tool_time_s: ``delay_s`` of every turn after the first.
        seed: the sizes, tools and texts drawn (same seed, same prompts).

    Returns:
        Sessions ``tool-agent-<i>``; ``meta`` has the options and the drawn result sizes' total.

    Raises:
        ValueError: a count below 1, a negative time, ``result_median > result_max``, a ``vocab`` past
            the tokenizer's ordinary tokens, or a tokenizer without a chat template (naming the option).
    """
    check_positive(
        num_sessions=num_sessions,
        turns=turns,
        output_len=output_len,
        task_len=task_len,
        result_median=result_median,
        result_max=result_max,
    )
    if not result_sigma >= 0:
        raise ValueError(f"result_sigma: must be >= 0, got {result_sigma!r}")
    if not tool_time_s >= 0:
        raise ValueError(f"tool_time_s: must be >= 0, got {tool_time_s!r}")
    if result_median > result_max:
        raise ValueError(f"result_median: {result_median} is above result_max {result_max}")
    source = tokenizer if isinstance(tokenizer, Tokenizer) else _load(tokenizer)
    ordinary = min(source.added_token_ids, default=source.vocab_size)
    if vocab > ordinary:
        raise ValueError(f"vocab: {vocab} is past the tokenizer's {ordinary} ordinary tokens")
    rng = np.random.default_rng(seed)
    tools = list(TOOLS)

    def text(key: list, length: int) -> str:
        return source.decode(token_stream(["tool-agent", seed, *key], length, vocab, low))

    def encode(messages: list[dict]) -> tuple[int, ...]:
        try:
            return tuple(source.encode_chat(messages, tools))
        except ValueError as error:
            raise ValueError(f"tokenizer: {error}") from None

    sessions, result_tokens = [], 0
    for index in range(num_sessions):
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": text([index, "task"], task_len)},
        ]
        session_turns = []
        for k in range(turns):
            session_turns.append(Turn(encode(messages), output_len, delay_s=tool_time_s if k else 0.0))
            if k == turns - 1:
                break
            tool = tools[int(rng.integers(len(tools)))]["function"]
            arguments = {name: text([index, k, name], 6) for name in tool["parameters"]["required"]}
            size = int(
                np.clip(round(result_median * np.exp(result_sigma * rng.standard_normal())), 1, result_max)
            )
            result_tokens += size
            call_id = f"call_{index}_{k}"
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": tool["name"], "arguments": json.dumps(arguments)},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": text([index, k, "result"], size)}
            )
        sessions.append(Session(f"tool-agent-{index}", tuple(session_turns)))
    return Workload(
        name="tool_agent",
        sessions=tuple(sessions),
        description=(
            f"{num_sessions} agent runs x {turns} turns over {len(tools)} tools: tool results of median "
            f"{result_median} tokens (sigma {result_sigma}, at most {result_max}), {output_len} out"
        ),
        meta={
            "kind": "tool_agent",
            "num_sessions": num_sessions,
            "turns": turns,
            "output_len": output_len,
            "task_len": task_len,
            "result_median": result_median,
            "result_sigma": result_sigma,
            "result_max": result_max,
            "tool_time_s": tool_time_s,
            "tools": len(tools),
            "result_tokens": result_tokens,
            "vocab": vocab,
            "low": low,
            "seed": seed,
        },
    )
