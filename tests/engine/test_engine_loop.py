"""The engine loop thread: commands from many threads, streamed deltas, errors handed back."""

import threading
from concurrent.futures import Future

import pytest

from services.engine import SamplingParams
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.engine_loop import EngineLoop


@pytest.fixture(scope="module")
def loop(tiny_checkpoint):
    engine_loop = EngineLoop(EngineCore(EngineConfig(model=str(tiny_checkpoint("k3")), dtype="float32")))
    yield engine_loop
    engine_loop.close()


def collect(stream, timeout_s=30):
    deltas = []
    while not deltas or deltas[-1].finish_reason is None:
        deltas.append(stream.get(timeout=timeout_s))
    return deltas


def test_streams_equal_the_offline_result(loop):
    params = SamplingParams(max_tokens=7, temperature=0, logprobs=0, ignore_eos=True)

    def start(engine, prompt, name):
        return loop.watch(engine.add_request(prompt, params, name))

    streams = [loop.call(lambda e, i=i: start(e, list(range(20 + i * 9)), f"s{i}")) for i in range(3)]
    results = [collect(stream) for stream in streams]
    for deltas in results:
        tokens = [t for d in deltas for t in d.token_ids]
        assert len(tokens) == 7 and deltas[-1].finish_reason == "length"
        assert len([p for d in deltas for p in d.logprobs]) == 7
    loop.call(lambda e: e.check_integrity())


def test_many_threads_submit_concurrently(loop):
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    outcomes = {}

    def client(index):
        stream = loop.call(lambda e: loop.watch(e.add_request([1, 2, index + 3], params, f"t{index}")))
        outcomes[index] = [t for d in collect(stream) for t in d.token_ids]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == list(range(6)) and all(len(tokens) == 3 for tokens in outcomes.values())
    loop.call(lambda e: e.check_integrity())


def test_errors_come_back_to_the_caller(loop):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        loop.call(lambda e: e.add_request([10**6], SamplingParams()))
    assert loop.call(lambda e: e.has_unfinished) is False


def test_abort_finishes_the_stream(loop):
    params = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    stream = loop.call(lambda e: loop.watch(e.add_request([5, 6, 7], params, "long")))
    stream.get(timeout=30)
    loop.call(lambda e: e.abort("long"))
    assert collect(stream)[-1].finish_reason == "abort"
    loop.call(lambda e: e.check_integrity())


@pytest.mark.parametrize(("read_only", "observed"), [(False, [False]), (True, [])])
def test_a_command_is_observed_before_its_caller_resumes_unless_read_only(read_only, observed):
    """``after_step`` runs between a command and its result (observers see its effect at once); a
    read-only command (a handoff's checksum) returns without waiting for them."""
    loop = EngineLoop.__new__(EngineLoop)  # the command runner alone, no thread
    future, seen = Future(), []
    loop.engine, loop.after_step = "engine", lambda _engine: seen.append(future.done())
    loop._run_command(lambda engine: engine.upper(), future, read_only)
    assert future.result(timeout=0) == "ENGINE" and seen == observed
