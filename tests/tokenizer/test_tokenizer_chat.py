"""Tokenizer.apply_chat_template / encode_chat: parity with transformers, layout, validation."""

from __future__ import annotations

import copy

import pytest

from common.tokenizer import Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city <b>now</b>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"temp_c": 21}'},
    {"role": "assistant", "content": "21 °C and sunny."},
]

CHATS = {
    "user_only": [{"role": "user", "content": "Hi there"}],
    "multi_turn": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? <b>&</b> 你好 🦀"},
    ],
    "tool_call_and_result": TOOL_CHAT,
    "parallel_calls_ending_in_results": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            ],
        },
        {"role": "tool", "content": "21"},
        {"role": "tool", "content": "-3"},
    ],
}

KIMI_TOOL_CHAT = (
    '<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"get_weather",'
    '"description":"Current weather for a city <b>now</b>","parameters":{"type":"object","properties":'
    '{"city":{"type":"string"}},"required":["city"]}}}]<|im_end|>'
    "<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>"
    "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    '<|im_system|>tool<|im_middle|>## Result of functions.get_weather:0\n{"temp_c": 21}<|im_end|>'
    "<|im_assistant|>assistant<|im_middle|>21 °C and sunny.<|im_end|>"
)

DEEPSEEK_TOOL_CHAT = (
    "<｜begin▁of▁sentence｜>## Tools\n"
    "You may call these functions, wrapping each name and its JSON arguments in tool-call markers.\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city '
    '<b>now</b>", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
    '"required": ["city"]}}}\n'
    "<｜User｜>Weather in Paris?<｜Assistant｜>"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
    '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{"temp_c": 21}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>'
    "21 °C and sunny.<｜end▁of▁sentence｜>"
)

GENERATION_PROMPT = {"k3": "<|im_assistant|>assistant<|im_middle|>", "deepseek_v32": "<｜Assistant｜>"}
GENERATION_PROMPT["kimi_linear"] = GENERATION_PROMPT["k3"]


def test_tool_chat_layout(tokenizer, family):
    expected = DEEPSEEK_TOOL_CHAT if family == "deepseek_v32" else KIMI_TOOL_CHAT
    rendered = tokenizer.apply_chat_template(TOOL_CHAT, tools=[WEATHER_TOOL], add_generation_prompt=False)
    assert rendered == expected
    prompted = tokenizer.apply_chat_template(TOOL_CHAT, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert prompted == expected + GENERATION_PROMPT[family]


@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen_prompt", "no_gen_prompt"])
@pytest.mark.parametrize("chat", CHATS.values(), ids=CHATS.keys())
def test_matches_transformers(tokenizer, hf_tokenizer, chat, add_generation_prompt):
    tools = [WEATHER_TOOL] if any("tool_calls" in m for m in chat) else None
    expected = hf_tokenizer.apply_chat_template(
        chat, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert tokenizer.apply_chat_template(chat, tools, add_generation_prompt) == expected
    expected_ids = hf_tokenizer.apply_chat_template(
        chat, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True
    )["input_ids"]
    assert tokenizer.encode_chat(chat, tools, add_generation_prompt) == expected_ids


def test_control_tokens_become_single_ids(tokenizer):
    chat = CHATS["parallel_calls_ending_in_results"]
    rendered = tokenizer.apply_chat_template(chat, tools=[WEATHER_TOOL])
    ids = tokenizer.encode_chat(chat, tools=[WEATHER_TOOL])
    control_ids = [i for i in ids if i in tokenizer.special_token_ids]
    assert len(control_ids) >= 10  # the template really wrote control tokens
    for token_id in tokenizer.special_token_ids:
        token = tokenizer.id_to_token(token_id)
        assert ids.count(token_id) == rendered.count(token), token
    assert tokenizer.decode(ids) == rendered


def test_kimi_tool_call_ids_default_to_kimi_form(kimi_tokenizer):
    rendered = kimi_tokenizer.apply_chat_template(CHATS["parallel_calls_ending_in_results"])
    assert "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" in rendered
    assert "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>" in rendered


def test_caller_messages_are_not_modified(kimi_tokenizer):
    chat = copy.deepcopy(TOOL_CHAT)
    kimi_tokenizer.apply_chat_template(chat)
    assert chat == TOOL_CHAT


BAD_MESSAGES = {
    "unknown_role": (
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "bot", "content": "c"},
        ],
        r"^messages\[2\]\.role: unknown role 'bot'",
    ),
    "missing_role": ([{"content": "a"}], r"^messages\[0\]\.role: missing"),
    "missing_content": (
        [{"role": "system", "content": "s"}, {"role": "user"}],
        r"^messages\[1\]\.content: missing",
    ),
    "null_content_without_tool_calls": (
        [{"role": "assistant", "content": None}],
        r"^messages\[0\]\.content: missing",
    ),
    "content_not_string": (
        [{"role": "user", "content": 5}],
        r"^messages\[0\]\.content: expected a string, got int",
    ),
    "message_not_dict": (["hello"], r"^messages\[0\]: expected a dict, got str"),
    "empty": ([], r"^messages: expected a non-empty list"),
    "tool_calls_on_user": (
        [{"role": "user", "content": "a", "tool_calls": []}],
        r"^messages\[0\]\.tool_calls: only assistant",
    ),
    "tool_call_without_name": (
        [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
        r"^messages\[0\]\.tool_calls\[0\]\.function\.name: missing",
    ),
    "tool_call_bad_arguments": (
        [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}],
        r"^messages\[0\]\.tool_calls\[0\]\.function\.arguments: expected",
    ),
    "tool_call_id_not_string": (
        [{"role": "tool", "content": "r", "tool_call_id": 7}],
        r"^messages\[0\]\.tool_call_id: expected a string",
    ),
}


@pytest.mark.parametrize("messages, pattern", BAD_MESSAGES.values(), ids=BAD_MESSAGES.keys())
def test_bad_messages_name_index_and_field(kimi_tokenizer, messages, pattern):
    with pytest.raises(ValueError, match=pattern):
        kimi_tokenizer.apply_chat_template(messages)
    with pytest.raises(ValueError, match=pattern):
        kimi_tokenizer.encode_chat(messages)


def test_bad_tools(kimi_tokenizer):
    chat = CHATS["user_only"]
    with pytest.raises(ValueError, match=r"^tools\[1\]: expected a dict, got str"):
        kimi_tokenizer.apply_chat_template(chat, tools=[WEATHER_TOOL, "get_weather"])
    with pytest.raises(ValueError, match=r"^tools: expected a list"):
        kimi_tokenizer.apply_chat_template(chat, tools=WEATHER_TOOL)


def test_tokenizer_without_chat_template(build_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((build_dir("k3") / "tokenizer.json").read_bytes())
    tok = Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^chat_template: this tokenizer has none"):
        tok.apply_chat_template(CHATS["user_only"])
