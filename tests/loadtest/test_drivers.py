"""Drivers against a fake client on a virtual clock: exact timings, no server, no real waiting."""

import asyncio
import io
import statistics

import pytest

from loadtest.drivers import (
    ConcurrencyDriver,
    Limits,
    Progress,
    RateDriver,
    ScheduleDriver,
    SessionSource,
    arrival_gaps,
)
from loadtest.workload import Session, Turn, Workload
from tests.loadtest.fake_client import BAD_ID, FakeClient, run_virtual

EPS = 1e-9
REQUEST_S = 0.1 + 3 * 0.01  # the fake's ttft + 3 gaps for 4 tokens


def make_session(name: str, turns: int = 3, delay_s: float = 0.5, **extra) -> Session:
    return Session(
        name, tuple(Turn((16 + i,) * (8 + i), 4, delay_s if i else 0.0, **extra) for i in range(turns))
    )


def workload(*sessions: Session) -> Workload:
    return Workload("test", tuple(sessions))


def run(driver, load: Workload):
    return run_virtual(driver.run(load))


def by_session(records):
    found: dict[str, list] = {}
    for record in sorted(records, key=lambda r: r.start_s):
        found.setdefault(record.session_id, []).append(record)
    return found


def max_overlap(spans) -> int:
    edges = sorted(
        [(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1])
    )
    live = most = 0
    for _, step in edges:
        live += step
        most = max(most, live)
    return most


def test_concurrency_keeps_n_sessions_live_and_never_more():
    client = FakeClient()
    load = workload(*(make_session(f"s{i}", turns=3, delay_s=0.25 * (i % 3)) for i in range(12)))
    result = run(ConcurrencyDriver(client, Limits(), [4]), load)
    assert len(result.records) == 36 and all(r.ok and r.concurrency == 4 for r in result.records)
    # A session is live from its first request to its last (think time included).
    spans = [(rs[0].start_s, rs[-1].end_s) for rs in by_session(result.records).values()]
    assert max_overlap([(a + EPS, b - EPS) for a, b in spans]) == 4
    assert result.windows[0].ended_by == "workload" and result.cancelled == 0


def test_turns_are_sequential_and_wait_their_delay():
    client = FakeClient()
    result = run(
        ConcurrencyDriver(client, Limits(), [2]), workload(*(make_session(f"s{i}") for i in range(3)))
    )
    for records in by_session(result.records).values():
        assert [r.turn for r in records] == [0, 1, 2]
        for before, after in zip(records, records[1:], strict=False):
            assert after.start_s == pytest.approx(before.end_s + 0.5, abs=EPS)
            assert before.e2e_s == pytest.approx(REQUEST_S, abs=EPS)


def test_time_scale_divides_delays():
    result = run(ConcurrencyDriver(FakeClient(), Limits(time_scale=5.0), [1]), workload(make_session("s")))
    first, second, _ = sorted(result.records, key=lambda r: r.turn)
    assert second.start_s == pytest.approx(first.end_s + 0.1, abs=EPS)


def test_subagents_start_after_their_turn_and_block_the_parent():
    children = (make_session("p/sub-1", turns=2, delay_s=0.2), make_session("p/sub-2", turns=1))
    parent = Session(
        "p", (Turn((20,) * 8, 4), Turn((20,) * 9, 4, 0.3, subagents=children), Turn((20,) * 10, 4, 1.0))
    )
    result = run(ConcurrencyDriver(FakeClient(), Limits(), [1]), workload(parent))
    records = by_session(result.records)
    spawner, last = records["p"][1], records["p"][2]
    sub1, sub2 = records["p/sub-1"], records["p/sub-2"]
    assert sub1[0].start_s == pytest.approx(spawner.end_s, abs=EPS)  # together, when the turn ends
    assert sub2[0].start_s == pytest.approx(spawner.end_s, abs=EPS)
    assert sub1[1].start_s == pytest.approx(sub1[0].end_s + 0.2, abs=EPS)
    assert last.start_s == pytest.approx(max(sub1[-1].end_s, sub2[-1].end_s) + 1.0, abs=EPS)


@pytest.mark.parametrize(
    "process, burstiness",
    [("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0)],
    ids=["poisson", "gamma-bursty", "gamma-even"],
)
def test_arrival_gaps_have_the_rate_and_spread(process, burstiness):
    gaps = arrival_gaps(8.0, process, burstiness, seed=3)
    sample = [next(gaps) for _ in range(40_000)]
    mean = statistics.fmean(sample)
    assert mean == pytest.approx(1 / 8.0, rel=0.03)
    cv = statistics.pstdev(sample) / mean
    assert cv == pytest.approx(1 / burstiness**0.5, rel=0.05)
    again = arrival_gaps(8.0, process, burstiness, seed=3)
    assert [next(again) for _ in range(5)] == sample[:5]
    other = arrival_gaps(8.0, process, burstiness, seed=4)
    assert [next(other) for _ in range(5)] != sample[:5]


@pytest.mark.parametrize(
    "flag, args", [("--rate", (0.0,)), ("--arrival", (1.0, "uniform")), ("--burstiness", (1.0, "gamma", 0.0))]
)
def test_arrival_arguments_are_checked(flag, args):
    with pytest.raises(ValueError, match=flag):
        next(arrival_gaps(*args))


def test_rate_driver_starts_a_session_at_each_arrival():
    load = workload(*(make_session(f"s{i}", turns=2, delay_s=0.05) for i in range(30)))
    result = run(RateDriver(FakeClient(), Limits(), rate=4.0, process="gamma", burstiness=0.5, seed=7), load)
    gaps = arrival_gaps(4.0, "gamma", 0.5, seed=7)
    expected, at = [], 0.0
    for _ in range(30):
        expected.append(at)
        at += next(gaps)
    starts = sorted(r.start_s for r in result.records if r.turn == 0)
    assert starts == pytest.approx(expected, abs=1e-6)
    assert len(result.records) == 60 and all(r.rate == 4.0 and r.concurrency is None for r in result.records)


def test_schedule_replays_timestamps_unless_the_session_is_busy():
    turns = (
        Turn((20,) * 8, 4, at_s=1.0),
        Turn((20,) * 9, 4, delay_s=0.1, at_s=3.0),  # on time
        Turn((20,) * 9, 4, delay_s=0.2, at_s=3.1),  # the previous turn is still running: waits
    )
    late = Session("b", (Turn((21,) * 8, 4, at_s=2.0),))
    result = run(ScheduleDriver(FakeClient(), Limits(time_scale=2.0)), workload(Session("a", turns), late))
    records = by_session(result.records)
    a = records["a"]
    assert [r.start_s for r in a[:2]] == pytest.approx([0.5, 1.5], abs=EPS)
    assert a[2].start_s == pytest.approx(a[1].end_s + 0.1, abs=EPS)  # max(1.55, 1.5 + 0.13 + 0.1)
    assert records["b"][0].start_s == pytest.approx(1.0, abs=EPS)
    assert all(r.concurrency is None and r.rate is None for r in result.records)


def test_duration_ends_the_run_and_drops_requests_in_flight():
    client = FakeClient(ttft_s=10.0)
    load = workload(*(make_session(f"s{i}", turns=3, delay_s=0.0) for i in range(4)))
    result = run(ConcurrencyDriver(client, Limits(duration_s=25.0), [2]), load)
    (window,) = result.windows
    assert window.ended_by == "duration" and window.end_s == pytest.approx(25.0, abs=1e-6)
    assert len(result.records) == 4 and all(r.ok for r in result.records)  # two turns of two sessions
    assert result.cancelled == client.cancelled == 2 and window.sent == 6
    assert window.measured_s == pytest.approx(25.0, abs=1e-6)


def test_max_requests_ends_the_run_after_the_last_one_finishes():
    client = FakeClient()
    load = workload(*(make_session(f"s{i}", turns=2, delay_s=0.3) for i in range(2)))
    result = run(ConcurrencyDriver(client, Limits(max_requests=7), [3]), load)
    (window,) = result.windows
    assert window.ended_by == "max_requests" and result.cancelled == 0
    assert len(result.records) == 7 and all(r.ok for r in result.records)
    assert window.end_s == pytest.approx(max(r.end_s for r in result.records), abs=EPS)
    assert {r.session_id for r in result.records} == {"s0", "s1", "s0~2", "s1~2"}  # cycled


def test_warmup_requests_and_seconds_are_flagged():
    load = workload(*(make_session(f"s{i}", turns=2, delay_s=0.0) for i in range(4)))
    result = run(ConcurrencyDriver(FakeClient(), Limits(warmup_requests=3), [1]), load)
    ordered = sorted(result.records, key=lambda r: r.start_s)
    assert [r.warmup for r in ordered] == [True] * 3 + [False] * 5
    assert result.windows[0].measured_start_s == ordered[3].start_s
    result = run(ConcurrencyDriver(FakeClient(), Limits(warmup_s=0.3), [1]), load)
    ordered = sorted(result.records, key=lambda r: r.start_s)
    assert [r.warmup for r in ordered] == [r.start_s < 0.3 for r in ordered] and ordered[3].warmup is False


def test_sweep_runs_levels_in_turn_with_their_own_windows():
    load = workload(*(make_session(f"s{i}", turns=2, delay_s=0.1) for i in range(40)))
    limits = Limits(max_requests=8, warmup_requests=2)
    result = run(ConcurrencyDriver(FakeClient(), limits, [1, 2, 4]), load)
    assert [w.concurrency for w in result.windows] == [1, 2, 4]
    for before, after in zip(result.windows, result.windows[1:], strict=False):
        assert after.start_s >= before.end_s
    for window in result.windows:
        level = [r for r in result.records if r.concurrency == window.concurrency]
        assert len(level) == 8 and sum(r.warmup for r in level) == 2
        assert all(window.start_s <= r.start_s and r.end_s <= window.end_s for r in level)
    assert not any("~" in r.session_id for r in result.records)  # levels continue, no repeats yet
    assert result.measured_s == pytest.approx(sum(w.measured_s for w in result.windows))


def test_sweep_levels_each_get_the_duration():
    load = workload(*(make_session(f"s{i}", turns=2, delay_s=0.1) for i in range(40)))
    result = run(ConcurrencyDriver(FakeClient(), Limits(duration_s=1.0), [1, 3]), load)
    assert [(w.ended_by, w.concurrency) for w in result.windows] == [("duration", 1), ("duration", 3)]
    assert [w.end_s - w.start_s for w in result.windows] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert all(r.end_s <= result.windows[0].end_s for r in result.records if r.concurrency == 1)


def test_stop_ends_the_run_and_keeps_what_finished():
    client = FakeClient()
    load = workload(*(make_session(f"s{i}", turns=3, delay_s=0.0) for i in range(50)))
    driver = ConcurrencyDriver(client, Limits(duration_s=100.0), [1, 2])

    async def interrupted():
        asyncio.get_running_loop().call_later(1.0, driver.stop)
        return await driver.run(load)

    result = run_virtual(interrupted())
    assert [w.ended_by for w in result.windows] == ["interrupted"] and result.interrupted
    assert result.windows[0].end_s == pytest.approx(1.0, abs=1e-6)
    assert len(result.records) == 7 and result.cancelled == 1  # 1.0 s / 0.13 s per request


def test_errors_are_records_not_exceptions():
    bad = Session("bad", (Turn((BAD_ID, 20), 4), Turn((20, 21), 4)))
    result = run(ConcurrencyDriver(FakeClient(), Limits(), [1]), workload(bad))
    assert [r.error is not None for r in sorted(result.records, key=lambda r: r.turn)] == [True, False]


def test_bad_settings_name_their_flag():
    with pytest.raises(ValueError, match="--sweep"):
        ConcurrencyDriver(FakeClient(), Limits(), [1, 2])
    with pytest.raises(ValueError, match="--concurrency"):
        ConcurrencyDriver(FakeClient(), Limits(), [0])
    with pytest.raises(ValueError, match="--max-requests"):
        Limits(max_requests=0)
    with pytest.raises(ValueError, match="--time-scale"):
        Limits(time_scale=0)
    with pytest.raises(ValueError, match="no requests"):
        run(ConcurrencyDriver(FakeClient(), Limits(), [1]), workload(Session("empty", ())))


def test_session_source_cycles_only_when_asked():
    load = [make_session("a"), make_session("b")]
    once = SessionSource(load, cycle=False)
    assert [once.next().session_id, once.next().session_id, once.next()] == ["a", "b", None]
    child = make_session("c/sub-1", turns=1)
    nested = Session("c", (Turn((20,), 1, subagents=(child,)),))
    cycled = SessionSource([nested], cycle=True)
    cycled.next()
    again = cycled.next()
    assert again.session_id == "c~2" and again.turns[0].subagents[0].session_id == "c/sub-1~2"


def test_plain_progress_line():
    stream = io.StringIO()
    load = workload(*(make_session(f"s{i}", turns=1) for i in range(3)))
    progress = Progress(stream=stream, use_tqdm=False)
    run(ConcurrencyDriver(FakeClient(), Limits(max_requests=3), [1], progress=progress), load)
    assert stream.getvalue().endswith("\rconcurrency 1: 3/3 requests, 0 errors, 0 cached tokens\n")
