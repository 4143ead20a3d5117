"""Rendering of Hugging Face style Jinja chat templates.

Templates come from model folders, so they are treated as untrusted code: they run in Jinja's
immutable sandbox. The environment matches what transformers gives templates (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a `tojson` that neither escapes
HTML nor unicode), so the same template renders the same text here and there.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own filter escapes <, >, & and ' for HTML, which would change the prompt text.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the Jinja text, as stored under `chat_template` in tokenizer_config.json.

    Raises:
        ValueError: the template does not parse; the message gives Jinja's reason and line.
    """

    def __init__(self, source: str) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as err:
            raise ValueError(f"chat template: line {err.lineno}: {err.message}") from err

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **variables: Any,
    ) -> str:
        """Render a conversation to prompt text.

        Args:
            messages: the conversation, as plain dicts (already validated by the caller).
            tools: JSON schemas of the callable tools, or None.
            add_generation_prompt: append the header that opens the assistant's next turn.
            **variables: further template variables, e.g. `bos_token` and `eos_token`.

        Returns:
            The prompt text, with control tokens written out as text.

        Raises:
            ValueError: the template failed while rendering (including `raise_exception` calls);
                the message is the template's own.
        """
        try:
            return self._template.render(
                messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **variables
            )
        except jinja2.TemplateError as err:
            raise ValueError(f"chat template: {err.message}") from err
