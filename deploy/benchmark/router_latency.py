"""The router's added latency: the same short request through the router and straight to the decode
worker, side by side in one run.

    (a) client ── Generate ──► router ── Decode(local_prefill) ──► decode worker
    (b) client ── Decode(local_prefill) ──────────────────────────► decode worker
    (c) client ── Reserve (prefill locally), Decode(local_prefill) ─► decode worker

One decode worker and a router in its own process (as deployed), colocated (the router's ``never`` mode:
the worker prefills every prompt, so the router sends the prompt with the Decode call and skips the
reservation), prompts of ``prompt_tokens`` and ``max_tokens=1``, one request in flight at a time, the
paths taking turns (each goes first as often) so all see the same machine. Each time is the client's,
from sending to the stream's end. The difference of the (a) and (b) percentiles is what the router adds;
the goal is at most ``GOAL_P50_MS`` at p50. (c) is the reservation round trip a prompt that may be
handed off pays on top of (b).
"""

import random
import time
import uuid
from dataclasses import dataclass

import grpc

from deploy.local.launcher import ManagedWorker
from deploy.local.router_process import RouterProcess
from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from services.config_flags import worker_config_from_flags
from services.engine.model.config_loader import load_model_config

from .worker_threads import worker_threads as torch_threads

GOAL_P50_MS = 1.0
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RouterLatencyReport:
    """Client-side milliseconds per request of each path, in the order sent."""

    model: str
    prompt_tokens: int
    router_ms: tuple[float, ...]
    direct_ms: tuple[float, ...]
    reserve_ms: tuple[float, ...] = ()  # (c): Reserve then Decode, straight to the worker

    def percentile(self, path: str, q: float) -> float:
        values = sorted(
            {"router": self.router_ms, "direct": self.direct_ms, "reserve": self.reserve_ms}[path]
        )
        return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]

    def added_ms(self, q: float) -> float:
        return self.percentile("router", q) - self.percentile("direct", q)

    @property
    def goal_met(self) -> bool:
        return self.added_ms(50) <= GOAL_P50_MS

    def as_dict(self) -> dict:
        row = {"model": self.model, "prompt_tokens": self.prompt_tokens, "requests": len(self.router_ms)}
        for q in PERCENTILES:
            row[f"router_p{q}_ms"] = round(self.percentile("router", q), 3)
            row[f"direct_p{q}_ms"] = round(self.percentile("direct", q), 3)
            row[f"reserve_then_decode_p{q}_ms"] = round(self.percentile("reserve", q), 3)
            row[f"added_p{q}_ms"] = round(self.added_ms(q), 3)
        row["goal_p50_ms"], row["goal_met"] = GOAL_P50_MS, self.goal_met
        return row

    def format_table(self) -> str:
        lines = [
            f"router latency: {self.model}, {len(self.router_ms)} requests per path, "
            f"{self.prompt_tokens}-token prompts, max_tokens=1, one in flight",
            f"{'path':<26}" + "".join(f"{f'p{q} ms':>10}" for q in PERCENTILES),
        ]
        paths = (
            ("router Generate", "router"),
            ("direct decode (local)", "direct"),
            ("direct reserve + decode", "reserve"),
        )
        for label, path in paths:
            lines.append(f"{label:<26}" + "".join(f"{self.percentile(path, q):>10.3f}" for q in PERCENTILES))
        lines.append(
            f"{'added by the router':<26}" + "".join(f"{self.added_ms(q):>10.3f}" for q in PERCENTILES)
        )
        verdict = "met" if self.goal_met else "NOT met"
        lines.append(
            f"goal: at most {GOAL_P50_MS:.1f} ms added at p50: {verdict} ({self.added_ms(50):.3f} ms)"
        )
        return "\n".join(lines)


def measure_router_latency(
    model: str,
    requests: int = 200,
    prompt_tokens: int = 8,
    warmup: int = 20,
    worker_args: tuple[str, ...] = (),
    worker_threads: int = 1,
    seed: int = 0,
    timeout_s: float = 60.0,
) -> RouterLatencyReport:
    """Start one decode worker and a router process over it, time ``requests`` requests on each path.

    Raises:
        ValueError: a bad argument (named as its ``baton bench router-latency`` flag).
        grpc.RpcError: a request failed (the cluster is stopped either way).
    """
    for flag, value in (("--requests", requests), ("--prompt-tokens", prompt_tokens)):
        if value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    if warmup < 0:
        raise ValueError(f"--warmup: must be >= 0, got {warmup}")
    vocab = load_model_config(model).vocab_size
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(prompt_tokens)] for _ in range(warmup + requests)]
    flags = ["--role", "decode", "--name", "decode-bench", "--model", model, *worker_args]
    decode_worker = ManagedWorker(worker_config_from_flags(flags))
    with torch_threads(worker_threads):
        decode_worker.start(ready_timeout_s=120)
    # The router in its own process, as deployed (in this one it would share the client's GIL).
    router_process = RouterProcess(model, [], [decode_worker.address], "--colocated")
    try:
        router_process.start()
        with (
            grpc.insecure_channel(f"127.0.0.1:{router_process.port}") as router_channel,
            grpc.insecure_channel(decode_worker.address) as decode_channel,
        ):
            router = generation_pb2_grpc.GenerationStub(router_channel)
            decode = workers_pb2_grpc.DecodeWorkerStub(decode_channel)
            paths = [
                (lambda p: _through_router(router, p, timeout_s), []),
                (lambda p: _straight_to_decode(decode, p, timeout_s), []),
                (lambda p: _reserve_then_decode(decode, p, timeout_s), []),
            ]
            for index, prompt in enumerate(prompts):
                shift = index % len(paths)  # each path goes first as often as the others
                for call, times in paths[shift:] + paths[:shift]:
                    elapsed = call(prompt)
                    if index >= warmup:
                        times.append(elapsed)
    finally:
        if router_process.process is not None:
            router_process.stop()
        decode_worker.stop()
    (_, router_ms), (_, direct_ms), (_, reserve_ms) = paths
    return RouterLatencyReport(model, prompt_tokens, tuple(router_ms), tuple(direct_ms), tuple(reserve_ms))


def _sampling() -> generation_pb2.SamplingParameters:
    return generation_pb2.SamplingParameters(max_tokens=1, ignore_eos=True)


def _through_router(stub, prompt: list[int], timeout_s: float) -> float:
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt), sampling=_sampling()
    )
    start = time.perf_counter()
    for _ in stub.Generate(request, timeout=timeout_s):
        pass
    return 1000 * (time.perf_counter() - start)


def _straight_to_decode(stub, prompt: list[int], timeout_s: float) -> float:
    local = workers_pb2.LocalPrefill(prompt_ids=prompt, sampling=_sampling())
    request = workers_pb2.DecodeRequest(request_id=f"bench-{uuid.uuid4().hex}", local_prefill=local)
    start = time.perf_counter()
    for _ in stub.Decode(request, timeout=timeout_s):
        pass
    return 1000 * (time.perf_counter() - start)


def _reserve_then_decode(stub, prompt: list[int], timeout_s: float) -> float:
    """What the router sends in colocated mode: a Reserve the worker answers with ``prefill_locally``."""
    request_id = f"bench-{uuid.uuid4().hex}"
    reserve = workers_pb2.ReserveRequest(
        request_id=request_id, prompt_ids=prompt, sampling=_sampling(), local_prefill_max_tokens=2**32 - 1
    )
    local = workers_pb2.LocalPrefill(prompt_ids=prompt, sampling=_sampling())
    start = time.perf_counter()
    for answer in stub.Reserve(reserve, timeout=timeout_s):
        if not answer.prefill_locally:
            raise RuntimeError("the worker reserved room instead of prefilling locally")
    for _ in stub.Decode(
        workers_pb2.DecodeRequest(request_id=request_id, local_prefill=local), timeout=timeout_s
    ):
        pass
    return 1000 * (time.perf_counter() - start)
