"""``baton client generate`` on the SDK, against the scripted server: the JSON object's shape, the
new flags reaching the request, and a server error as one ``CODE: details`` line with exit 2."""

import json

import grpc
import pytest

from cli.main import main
from tests.sdk.scripted_server import fail


def generate(server, *flags: str) -> list[str]:
    return ["client", "generate", "--addr", server.address, "--timeout", "10", *flags]


def test_json_output_has_the_documented_shape(server, capsys):
    assert main(generate(server, "--prompt-ids", "1,2,3", "--max-tokens", "5", "--logprobs", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == {
        "token_ids": [11, 12, 13, 14, 15],
        "logprobs": [-0.5, -0.25, -0.125, -1.0, -2.0],
        "text": "Hello you",
        "finish_reason": "length",
        "usage": {
            "prompt": 3,
            "completion": 5,
            "cached": 1,
            "cached_host": 1,
            "drafted": 4,
            "accepted_drafts": 3,
        },
        "route": {"prefill": "p:1", "decode": "d:2", "transfer_backend": "nixl", "transfer_bytes": 4096},
    }
    (request,) = server.script.requests["Generate"]
    assert list(request.token_ids.ids) == [1, 2, 3] and request.sampling.max_tokens == 5
    assert request.sampling.HasField("logprobs") and request.sampling.logprobs == 0


def test_logprobs_are_null_unless_asked(server, capsys):
    assert main(generate(server, "--prompt", "Hi", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["logprobs"] is None and "top_logprobs" not in result
    assert not server.script.requests["Generate"][0].sampling.HasField("logprobs")


def test_new_flags_reach_the_request(server, capsys):
    flags = ["--prompt", "Hi", "--chat", "--stop", "END", "--stop", "\n\n", "--session-id", "s-7"]
    flags += ["--tenant", "acme", "--top-logprobs", "2", "--seed", "4", "--json"]
    assert main(generate(server, *flags)) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["top_logprobs"][0] == [[11, -0.5], [7, -1.0]] and len(result["logprobs"]) == 5
    (request,) = server.script.requests["Generate"]
    assert [(m.role, m.content) for m in request.chat.messages] == [("user", "Hi")]
    assert list(request.sampling.stop) == ["END", "\n\n"] and request.sampling.logprobs == 2
    assert (request.session_id, request.tenant, request.sampling.seed) == ("s-7", "acme", 4)


def test_text_mode_streams_the_text(server, capsys):
    assert main(generate(server, "--prompt", "Hi")) == 0
    assert capsys.readouterr().out == "Hello you\n"


@pytest.mark.parametrize(
    "code, details",
    [
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "token_ids: id 99999 at position 0 is outside the vocabulary [0, 512)",
        ),
        (grpc.StatusCode.UNAVAILABLE, "decode worker any: no worker reachable"),
    ],
    ids=["invalid-argument", "unavailable"],
)
def test_a_server_error_is_one_line_and_exit_2(server, capsys, code, details):
    server.script.generate = fail(code, details)
    assert main(generate(server, "--prompt-ids", "99999", "--json")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"baton client: error: {code.name}: {details}\n"


def test_chat_needs_a_text_prompt(server, capsys):
    assert main(generate(server, "--prompt-ids", "1", "--chat")) == 2
    assert "--chat" in capsys.readouterr().err
    assert server.script.calls["Generate"] == 0
