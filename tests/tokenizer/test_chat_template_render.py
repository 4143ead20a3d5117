"""ChatTemplate: the Jinja environment matches transformers' and errors become ValueErrors."""

from __future__ import annotations

from datetime import datetime

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from common.tokenizer.chat_template import ChatTemplate

MESSAGES = [
    {"role": "user", "content": "Is <b>1 & 2</b> 'bold'? 你好 🦀"},
    {"role": "assistant", "content": "Yes."},
]

TEMPLATES = {
    "trim_and_lstrip_blocks": (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n  U: {{ m.content }}\n"
        "    {% else %}\n  A: {{ m.content }}\n    {% endif %}\n{% endfor %}\n"
        "{% if add_generation_prompt %}\n  A:\n{% endif %}"
    ),
    "tojson_defaults": "{{ messages | tojson }}",
    "tojson_options": (
        "{{ messages | tojson(indent=2, sort_keys=true) }}|{{ tools | tojson(separators=(',', ':')) }}"
    ),
    "loop_controls": (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
    ),
    "namespace": (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
    ),
    "special_variables": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
}


@pytest.mark.parametrize("source", TEMPLATES.values(), ids=TEMPLATES.keys())
@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen_prompt", "no_gen_prompt"])
def test_renders_like_transformers(source, add_generation_prompt):
    tools = [{"type": "function", "function": {"name": "f", "description": "<x> & é"}}]
    variables = {"bos_token": "<s>", "eos_token": "</s>"}
    (expected,), _ = render_jinja_template(
        [MESSAGES],
        tools=tools,
        chat_template=source,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    rendered = ChatTemplate(source).render(MESSAGES, tools, add_generation_prompt, **variables)
    assert rendered == expected


def test_tojson_keeps_html_and_unicode():
    assert ChatTemplate("{{ messages[0] | tojson }}").render(MESSAGES) == (
        '{"role": "user", "content": "Is <b>1 & 2</b> \'bold\'? 你好 🦀"}'
    )


def test_raise_exception_becomes_value_error():
    template = ChatTemplate(
        "{% if messages[0].role != 'system' %}{{ raise_exception('need a system turn') }}{% endif %}"
    )
    with pytest.raises(ValueError, match=r"^chat template: need a system turn$"):
        template.render(MESSAGES)


def test_strftime_now():
    rendered = ChatTemplate("{{ strftime_now('%Y') }}").render(MESSAGES)
    assert rendered in {str(datetime.now().year), str(datetime.now().year - 1)}


def test_syntax_error_names_line():
    with pytest.raises(ValueError, match=r"^chat template: line 2: "):
        ChatTemplate("ok\n{% if %}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ messages.append(1) }}",
        "{{ messages[0].update({'role': 'x'}) }}",
    ],
    ids=["dunder_attribute", "list_mutation", "dict_mutation"],
)
def test_sandbox_blocks_escapes_and_mutation(source):
    messages = [dict(m) for m in MESSAGES]
    with pytest.raises(ValueError, match=r"^chat template: access to attribute .* is unsafe"):
        ChatTemplate(source).render(messages)
    assert messages == MESSAGES


def test_undefined_attribute_access_fails_loudly():
    with pytest.raises(ValueError, match=r"^chat template: 'missing' is undefined"):
        ChatTemplate("{{ missing.field }}").render(MESSAGES)
