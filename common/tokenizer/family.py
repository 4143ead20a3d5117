"""Per-family tokenizer conventions: special tokens, stop tokens and chat templates.

A family is the set of conventions a model line's tokenizer follows. `k3` and `kimi_linear` share
Kimi's conventions; `deepseek_v32` follows DeepSeek's. The chat templates are written for Baton in
the style of each line's real template (same roles, same control tokens, same tool-call layout);
they are not copies of the released templates.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FamilySpec:
    """Tokenizer conventions of one model family.

    Attributes:
        name: family name, e.g. "kimi_linear".
        special_tokens: every control token, in the order their ids are assigned.
        bos_token, eos_token, pad_token: the named special tokens (each also in `special_tokens`).
        stop_tokens: tokens that end generation; their ids become generation_config's `eos_token_id`.
        chat_template: Jinja chat template in Hugging Face's format.
    """

    name: str
    special_tokens: tuple[str, ...]
    bos_token: str
    eos_token: str
    pad_token: str
    stop_tokens: tuple[str, ...]
    chat_template: str


# Kimi layout: <|im_{role}|>{role name}<|im_middle|>{content}<|im_end|>; tools are declared in a
# "tool_declare" system turn; a tool call is <|tool_call_begin|>{id}<|tool_call_argument_begin|>{json}
# <|tool_call_end|> inside a tool-calls section; a tool result is a "tool" system turn.
_KIMI_TEMPLATE = r"""
{%- if tools -%}
<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>
{%- endif -%}
{%- if messages[0].role != 'system' -%}
<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
<|im_system|>system<|im_middle|>{{ message.content }}<|im_end|>
{%- elif message.role == 'user' -%}
<|im_user|>user<|im_middle|>{{ message.content }}<|im_end|>
{%- elif message.role == 'tool' -%}
<|im_system|>tool<|im_middle|>
{%- if message.tool_call_id -%}
## Result of {{ message.tool_call_id }}{{ '\n' }}
{%- endif -%}
{{ message.content }}<|im_end|>
{%- elif message.role == 'assistant' -%}
<|im_assistant|>assistant<|im_middle|>{{ message.content or '' }}
{%- if message.tool_calls -%}
<|tool_calls_section_begin|>
{%- for call in message.tool_calls -%}
{%- set call_id = call.id or ('functions.' ~ call.function.name ~ ':' ~ loop.index0) -%}
{%- set arguments = call.function.arguments -%}
{%- set arguments = arguments if arguments is string else arguments | tojson -%}
<|tool_call_begin|>{{ call_id }}<|tool_call_argument_begin|>{{ arguments }}<|tool_call_end|>
{%- endfor -%}
<|tool_calls_section_end|>
{%- endif -%}
<|im_end|>
{%- else -%}
{{ raise_exception('Unsupported role: ' ~ message.role) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_assistant|>assistant<|im_middle|>
{%- endif -%}
"""

# DeepSeek layout: BOS, then the system prompt (with tool schemas appended), then <｜User｜>{content}
# and <｜Assistant｜>{content}<｜end▁of▁sentence｜> turns. Tool calls sit between
# <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>; consecutive tool results share one outputs block,
# and the assistant turn that follows them continues without a new <｜Assistant｜> header.
_DEEPSEEK_TEMPLATE = r"""
{%- set ns = namespace(system='', in_tool_outputs=false) -%}
{%- for message in messages if message.role == 'system' -%}
{%- set ns.system = ns.system ~ ('\n\n' if ns.system else '') ~ message.content -%}
{%- endfor -%}
{{ bos_token }}{{ ns.system }}
{%- if tools -%}
{{ '\n\n' if ns.system else '' }}## Tools
{{- '\nYou may call these functions, wrapping each name and its JSON arguments in tool-call markers.\n' }}
{%- for tool in tools -%}
{{ tool | tojson }}{{ '\n' }}
{%- endfor -%}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}
{%- if ns.in_tool_outputs -%}
<｜tool▁outputs▁end｜>
{%- set ns.in_tool_outputs = false -%}
{%- endif -%}
<｜User｜>{{ message.content }}
{%- elif message.role == 'assistant' -%}
{%- if ns.in_tool_outputs -%}
<｜tool▁outputs▁end｜>
{%- set ns.in_tool_outputs = false -%}
{%- else -%}
<｜Assistant｜>
{%- endif -%}
{{ message.content or '' }}
{%- if message.tool_calls -%}
<｜tool▁calls▁begin｜>
{%- for call in message.tool_calls -%}
{%- set arguments = call.function.arguments -%}
{%- set arguments = arguments if arguments is string else arguments | tojson -%}
<｜tool▁call▁begin｜>{{ call.function.name }}<｜tool▁sep｜>{{ arguments }}<｜tool▁call▁end｜>
{%- endfor -%}
<｜tool▁calls▁end｜>
{%- endif -%}
<｜end▁of▁sentence｜>
{%- elif message.role == 'tool' -%}
{%- if not ns.in_tool_outputs -%}
<｜tool▁outputs▁begin｜>
{%- set ns.in_tool_outputs = true -%}
{%- endif -%}
<｜tool▁output▁begin｜>{{ message.content }}<｜tool▁output▁end｜>
{%- elif message.role != 'system' -%}
{{ raise_exception('Unsupported role: ' ~ message.role) }}
{%- endif -%}
{%- endfor -%}
{%- if ns.in_tool_outputs -%}
<｜tool▁outputs▁end｜>
{%- elif add_generation_prompt -%}
<｜Assistant｜>
{%- endif -%}
"""

KIMI = FamilySpec(
    name="kimi",
    special_tokens=(
        "[BOS]",
        "[EOS]",
        "[PAD]",
        "<|im_end|>",
        "<|im_user|>",
        "<|im_assistant|>",
        "<|im_system|>",
        "<|im_middle|>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ),
    bos_token="[BOS]",
    eos_token="[EOS]",
    pad_token="[PAD]",
    stop_tokens=("<|im_end|>", "[EOS]"),
    chat_template=_KIMI_TEMPLATE.strip(),
)

DEEPSEEK = FamilySpec(
    name="deepseek",
    special_tokens=(
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜▁pad▁｜>",
        "<｜User｜>",
        "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁outputs▁begin｜>",
        "<｜tool▁output▁begin｜>",
        "<｜tool▁output▁end｜>",
        "<｜tool▁outputs▁end｜>",
    ),
    bos_token="<｜begin▁of▁sentence｜>",
    eos_token="<｜end▁of▁sentence｜>",
    pad_token="<｜▁pad▁｜>",
    stop_tokens=("<｜end▁of▁sentence｜>",),
    chat_template=_DEEPSEEK_TEMPLATE.strip(),
)

FAMILIES: dict[str, FamilySpec] = {"k3": KIMI, "kimi_linear": KIMI, "deepseek_v32": DEEPSEEK}


def get_family(name: str) -> FamilySpec:
    """Return the conventions of model family `name`; raise ValueError naming the known families."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"family: unknown tokenizer family {name!r}; known: {sorted(FAMILIES)}") from None
