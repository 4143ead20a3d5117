"""Trace replay: Mooncake and WEKA files parsed into sessions, block sharing kept under scale, errors."""

import json
import math
from pathlib import Path

import pytest

from loadtest.workloads import build_workload, load_mooncake, load_trace, load_weka, trace_format
from loadtest.workloads.scale import TokenScale

TRACES = Path("/work/shared/traces")
MOONCAKE = ["mooncake_conversation_trace.jsonl", "mooncake_synthetic_trace.jsonl"]
WEKA = ["weka_trace_0147.json", "weka_trace_0182.json", "weka_trace_0346.json"]
VOCAB = 2**20  # wide, so no two different blocks start with the same id by chance
N = 60

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason="shared traces not present")


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def raw_lines(name: str, n: int) -> list[dict]:
    with (TRACES / name).open() as f:
        return [json.loads(next(f)) for _ in range(n)]


# ---- Mooncake ----


@pytest.mark.parametrize("name", MOONCAKE)
def test_mooncake_lines_become_one_turn_sessions_on_a_fixed_schedule(name):
    rows = raw_lines(name, N)
    work = load_mooncake(TRACES / name, 64, VOCAB, max_requests=N)
    assert len(work.sessions) == N and work.meta["requests"] == N
    scale = TokenScale(64)
    for i, (session, row) in enumerate(zip(work.sessions, rows, strict=True)):
        (turn,) = session.turns
        assert session.session_id == f"mooncake-{i}"
        assert turn.at_s == row["timestamp"] / 1000
        assert len(turn.prompt_ids) == scale.input_length(row["input_length"], len(row["hash_ids"]), 512)
        assert len(turn.prompt_ids) == math.ceil(row["input_length"] / 64)  # K divides 512: plain ceil
        assert turn.max_tokens == max(1, math.ceil(row["output_length"] / 64))
    assert work.meta["input_tokens"] == sum(len(s.turns[0].prompt_ids) for s in work.sessions)


@pytest.mark.parametrize("factor", [8, 64, 1000], ids=["k8", "k64", "k1000"])
def test_mooncake_scaled_prompts_share_exactly_the_shared_blocks(factor):
    rows = raw_lines(MOONCAKE[0], N)
    work = load_mooncake(TRACES / MOONCAKE[0], factor, VOCAB, max_requests=N)
    block = TokenScale(factor).block_size(512)
    prompts = [s.turns[0].prompt_ids for s in work.sessions]
    checked = 0
    for i in range(N):
        for j in range(i + 1, N):
            a, b = rows[i]["hash_ids"], rows[j]["hash_ids"]
            k = common_prefix(tuple(a), tuple(b))
            if k == 0 or k >= min(len(a), len(b)) or min(len(prompts[i]), len(prompts[j])) <= k * block:
                continue
            assert common_prefix(prompts[i], prompts[j]) == k * block, (i, j, k)
            checked += 1
    assert checked > 100


def test_mooncake_conversations_group_the_lines_of_one_conversation_in_file_order():
    rows = raw_lines(MOONCAKE[0], 700)
    work = load_mooncake(TRACES / MOONCAKE[0], 64, VOCAB, max_requests=700, conversations=True)
    firsts: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        firsts.setdefault(tuple(row["hash_ids"][:2]), i)
    assert [s.session_id for s in work.sessions] == [f"mooncake-{i}" for i in firsts.values()]
    assert sum(len(s.turns) for s in work.sessions) == 700 and work.meta["conversations"] is True
    multi = [s for s in work.sessions if len(s.turns) > 1]
    assert len(multi) > 50  # the conversation trace's later turns come back to their conversation
    block = TokenScale(64).block_size(512)
    for session in multi:
        first, *later = session.turns
        assert [t.at_s for t in session.turns] == sorted(t.at_s for t in session.turns)
        assert all(common_prefix(first.prompt_ids, t.prompt_ids) >= 2 * block for t in later)


def test_mooncake_files_do_not_share_blocks_by_accident():
    a = load_mooncake(TRACES / MOONCAKE[0], 64, VOCAB, max_requests=1).sessions[0].turns[0].prompt_ids
    b = load_mooncake(TRACES / MOONCAKE[1], 64, VOCAB, max_requests=1).sessions[0].turns[0].prompt_ids
    assert common_prefix(a, b) == 0  # both start with hash id 0, salted by file name


def test_mooncake_length_cap_drops_and_counts():
    work = load_mooncake(TRACES / MOONCAKE[0], 64, VOCAB, max_requests=N, max_input_tokens=100)
    assert all(len(s.turns[0].prompt_ids) <= 100 for s in work.sessions)
    assert work.meta["dropped_turns"] == N - len(work.sessions) > 0
    assert work.meta["over_length"] == "drop"


# ---- WEKA ----


def parent_requests(name: str) -> list[dict]:
    return json.loads((TRACES / name).read_text())["requests"]


@pytest.mark.parametrize("name", WEKA)
def test_weka_file_becomes_one_session_with_trace_times(name):
    requests = parent_requests(name)
    work = load_weka(TRACES / name, 64, VOCAB)
    (session,) = work.sessions
    assert session.session_id == name.removesuffix(".json").removeprefix("weka_")
    assert len(session.turns) == len(requests)
    assert [t.at_s for t in session.turns] == [r["t"] for r in requests]
    assert [t.delay_s for t in session.turns] == [r["think_time"] for r in requests]
    assert work.meta["subagents"] == 0 and len(work.all_sessions()) == 1
    scale = TokenScale(64)
    for turn, request in zip(session.turns, requests, strict=True):
        assert len(turn.prompt_ids) == scale.input_length(request["in"], len(request["hash_ids"]), 64)
        assert turn.max_tokens == scale.output_length(request["out"])
    # Consecutive turns share exactly their common whole blocks (one id each at scale 64).
    for k in range(1, len(requests)):
        shared = common_prefix(tuple(requests[k - 1]["hash_ids"]), tuple(requests[k]["hash_ids"]))
        assert common_prefix(session.turns[k - 1].prompt_ids, session.turns[k].prompt_ids) == shared


def test_weka_files_are_counted_and_time_scaled():
    work = load_trace([TRACES / name for name in WEKA], VOCAB, 64, time_scale=2.0)
    assert [len(s.turns) for s in work.sessions] == [18, 67, 44]
    assert work.sessions[0].turns[1].at_s == 17.0 / 2 and work.sessions[0].turns[1].delay_s == 10.0 / 2
    assert work.meta["format"] == "weka" and work.meta["dropped_turns"] == 0
    expected_in = expected_out = 0
    for name in WEKA:
        for r in parent_requests(name):
            expected_in += TokenScale(64).input_length(r["in"], len(r["hash_ids"]), 64)
            expected_out += TokenScale(64).output_length(r["out"])
    assert (work.meta["input_tokens"], work.meta["output_tokens"]) == (expected_in, expected_out)
    # "local" hash ids: every trace starts with hash id 1, yet the traces share no block.
    firsts = [s.turns[0].prompt_ids for s in work.sessions]
    assert common_prefix(firsts[0], firsts[1]) == 0 and common_prefix(firsts[1], firsts[2]) == 0
    assert load_trace(TRACES, VOCAB, 64, time_scale=2.0) == work  # a folder of traces


def test_weka_length_cap_drops_turns():
    work = load_weka(TRACES / WEKA[0], 64, VOCAB, max_input_tokens=3800)
    turns = work.sessions[0].turns
    assert all(len(t.prompt_ids) <= 3800 for t in turns)
    assert work.meta["dropped_turns"] == 18 - len(turns) > 0


# ---- WEKA subagents (hand-written: the shared traces have none) ----


def _request(t, n_blocks, out=64, think=None, tail=10, first=1, kind="n"):
    request = {"t": t, "type": kind, "in": n_blocks * 64 + tail, "out": out}
    request["hash_ids"] = list(range(first, first + n_blocks))
    if think is not None:
        request["think_time"] = think
    return request


def _subagent(t, requests):
    return {"type": "subagent", "t": t, "agent_id": "a", "subagent_type": "explore", "requests": requests}


def _write(tmp_path, requests, **top):
    path = tmp_path / "trace_x.json"
    path.write_text(
        json.dumps({"id": "trace_x", "block_size": 64, "hash_id_scope": "local", **top, "requests": requests})
    )
    return path


def test_weka_subagents_nest_under_the_preceding_turn(tmp_path):
    nested = _subagent(1.0, [_request(0.0, 2, first=500)])
    path = _write(
        tmp_path,
        [
            _subagent(0.0, [_request(0.0, 3, first=900)]),  # before any turn: top-level
            _request(0.0, 4, think=0.0),
            _request(5.0, 6, think=3.0, kind="s"),
            _subagent(9.0, [_request(0.0, 4, think=0.0), nested, _request(2.5, 5)]),  # shares blocks 1..4
            _subagent(9.0, [_request(0.5, 2, first=700)]),
            _request(30.0, 8, think=4.0),
        ],
    )
    work = load_weka(path, 64, VOCAB)
    parent, detached = work.sessions
    assert parent.session_id == "trace_x" and detached.session_id == "trace_x/sub-1"
    assert [len(t.subagents) for t in parent.turns] == [0, 2, 0]
    first, second = parent.turns[1].subagents
    assert (first.session_id, second.session_id) == ("trace_x/sub-2", "trace_x/sub-3")
    assert [t.at_s for t in first.turns] == [9.0, 11.5]
    assert [t.delay_s for t in first.turns] == [0.0, 2.5]  # no think_time: the gap in t
    assert second.turns[0].at_s == 9.5
    assert [s.session_id for s in first.turns[0].subagents] == ["trace_x/sub-2/sub-1"]
    assert first.turns[0].subagents[0].turns[0].at_s == 10.0
    assert (
        len(work.all_sessions()) == 5 and work.meta["subagents"] == 4 and work.meta["detached_subagents"] == 1
    )
    # Local scope: the subagent's blocks 1..4 are the parent's blocks 1..4 (its prompt's tail is not).
    assert common_prefix(first.turns[0].prompt_ids, parent.turns[1].prompt_ids) == 4
    # Per-context scope: each session has its own ids.
    per_context = load_weka(
        _write(tmp_path, json.loads(path.read_text())["requests"], hash_id_scope="per_context"), 64, VOCAB
    )
    child = per_context.sessions[0].turns[1].subagents[0]
    assert common_prefix(child.turns[0].prompt_ids, per_context.sessions[0].turns[1].prompt_ids) == 0


def test_weka_copies_are_salted_apart_and_named_per_copy(tmp_path):
    path = _write(
        tmp_path, [_request(0.0, 3, think=0.0), _subagent(1.0, [_request(0.0, 2)]), _request(2.0, 5)]
    )
    one, three = load_weka(path, 64, VOCAB), load_weka(path, 64, VOCAB, copies=3)
    assert [s.session_id for s in three.sessions] == [f"trace_x/copy{k}" for k in range(3)]
    subagents = [s.turns[0].subagents[0].session_id for s in three.sessions]
    assert subagents == [f"trace_x/sub-1/copy{k}" for k in range(3)]
    assert three.meta["copies"] == 3 and "copies" not in one.meta
    lengths = [len(t.prompt_ids) for t in one.sessions[0].turns]
    assert all([len(t.prompt_ids) for t in s.turns] == lengths for s in three.sessions)
    firsts = [s.turns[0].prompt_ids for s in three.sessions]
    assert max(common_prefix(a, b) for a in firsts for b in firsts if a is not b) == 0  # salted apart
    for session in three.sessions:  # within a copy the later turn still extends the first one's blocks
        assert common_prefix(session.turns[0].prompt_ids, session.turns[1].prompt_ids) == 3
    with pytest.raises(ValueError, match="copies: must be a positive integer, got 0"):
        load_weka(path, 64, VOCAB, copies=0)


def test_weka_subagents_of_a_dropped_turn_attach_to_the_last_kept_turn(tmp_path):
    path = _write(tmp_path, [_request(0.0, 2), _request(1.0, 50), _subagent(2.0, [_request(0.0, 2)])])
    work = load_weka(path, 64, VOCAB, max_input_tokens=10)
    (session,) = work.sessions
    assert len(session.turns) == 1 and [s.session_id for s in session.turns[0].subagents] == ["trace_x/sub-1"]
    assert work.meta["dropped_turns"] == 1


# ---- errors ----


def test_missing_trace_file_names_it(tmp_path):
    with pytest.raises(ValueError, match="nope.jsonl"):
        load_mooncake(tmp_path / "nope.jsonl", 1, VOCAB)
    with pytest.raises(ValueError, match="nope.json"):
        load_weka(tmp_path / "nope.json", 1, VOCAB)
    with pytest.raises(ValueError, match="nope.json"):
        build_workload("trace", path=str(tmp_path / "nope.json"), vocab=VOCAB)


@pytest.mark.parametrize(
    "line,match",
    [
        ("{not json", r"bad\.jsonl:2: not JSON"),
        (
            '{"timestamp": 0, "output_length": 1, "hash_ids": [1]}',
            r"bad\.jsonl:2: missing field 'input_length'",
        ),
        (
            '{"timestamp": 0, "input_length": -4, "output_length": 1, "hash_ids": [1]}',
            "'input_length' must be",
        ),
        ('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": ["a"]}', "'hash_ids' must be"),
        ('{"timestamp": "x", "input_length": 4, "output_length": 1, "hash_ids": [1]}', "'timestamp' must be"),
        ("[1, 2]", r"bad\.jsonl:2: expected a JSON object"),
    ],
    ids=["not-json", "missing-field", "negative", "bad-hash-ids", "bad-timestamp", "not-object"],
)
def test_malformed_mooncake_line_names_file_line_and_field(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n' + line + "\n"
    )
    with pytest.raises(ValueError, match=match):
        load_mooncake(path, 1, VOCAB)


@pytest.mark.parametrize(
    "requests,top,match",
    [
        ([{"t": 0, "type": "n", "in": "x", "out": 1, "hash_ids": []}], {}, r"requests\[0\]: field 'in'"),
        ([{"t": 0, "type": "n", "in": 1, "hash_ids": []}], {}, r"requests\[0\]: missing field 'out'"),
        ([{"t": 0, "type": "q", "in": 1, "out": 1, "hash_ids": []}], {}, r"requests\[0\]: field 'type'"),
        (
            [{"type": "subagent", "t": 0, "requests": [{"t": 0, "in": 1, "out": 1}]}],
            {},
            r"requests\[0\]\.requests\[0\]: missing field 'hash_ids'",
        ),
        ([{"type": "subagent", "t": 0}], {}, r"requests\[0\]\.requests: must be a list"),
        ([], {"hash_id_scope": "galactic"}, "hash_id_scope"),
    ],
    ids=["bad-in", "missing-out", "unknown-type", "nested-missing", "subagent-no-requests", "bad-scope"],
)
def test_malformed_weka_entry_names_file_and_field(tmp_path, requests, top, match):
    path = _write(tmp_path, requests, **top)
    with pytest.raises(ValueError, match=match) as error:
        load_weka(path, 1, VOCAB)
    assert "trace_x.json" in str(error.value)


def test_trace_format_detection(tmp_path):
    assert trace_format(TRACES / MOONCAKE[0]) == "mooncake" and trace_format(TRACES / WEKA[0]) == "weka"
    other = tmp_path / "other.json"
    other.write_text('{"rows": []}')
    for path in (other, tmp_path / "trace.txt"):
        with pytest.raises(ValueError, match="unknown trace format"):
            load_trace(path, VOCAB)
    with pytest.raises(ValueError, match="max_requests"):
        load_trace(TRACES / WEKA[0], VOCAB, max_requests=3)
    work = build_workload("trace", path=str(TRACES / MOONCAKE[1]), vocab=VOCAB, scale=64, max_requests=5)
    assert len(work.sessions) == 5 and work.meta["format"] == "mooncake"
