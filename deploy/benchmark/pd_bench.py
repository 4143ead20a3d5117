"""Decode latency under long prefills: a colocated cluster against a disaggregated one, side by side.

The claim measured: on a colocated engine, a long prompt's prefill shares the steps of the running
decodes and stalls them; with disaggregation it runs on a prefill worker and decode TPOT stays
steady. Both set-ups get the same number of worker processes (colocated: P + D decode workers;
disaggregated: P prefill + D decode workers), each with one torch thread, and the same requests
(``PDWorkload``). Each mode starts its own cluster, warms it up, runs the workload, and stops it:

    decode stream 0   [req][req][req][req]        new request as each finishes, ``rounds`` each
    ...
    decode stream N-1 [req][req][req][req]
    long prefills     [  prefill 0  ][  prefill 1  ][ ... ]   back to back, one in flight
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from deploy.local.launcher import LocalCluster
from proto.baton.v1 import generation_pb2_grpc
from services.engine.model.config_loader import load_model_config
from services.transfer import known_backends

from .pd_report import ModeReport, PDReport
from .pd_workload import LOCAL_PREFILL_TOKENS, PREFILL_MAX_TOKENS, PDWorkload
from .request_timing import RequestRecord, timed_generate
from .worker_threads import worker_threads as torch_threads

DISAGGREGATED_MODES = ("conditional", "always")
_WARMUP_DECODE_TOKENS = 4


def check_setup(
    prefill_workers: int, decode_workers: int, disaggregation: str, transfer_backend: str
) -> None:
    """Raise ``ValueError`` naming the ``baton bench pd`` flag when the clusters cannot be built."""
    if disaggregation not in DISAGGREGATED_MODES:
        raise ValueError(f"--disaggregation: expected one of {DISAGGREGATED_MODES}, got {disaggregation!r}")
    if transfer_backend not in known_backends():
        raise ValueError(f"--transfer-backend: expected one of {known_backends()}, got {transfer_backend!r}")
    for flag, value in (("--prefill-workers", prefill_workers), ("--decode-workers", decode_workers)):
        if value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")


def measure_pd(
    model: str,
    workload: PDWorkload | None = None,
    prefill_workers: int = 1,
    decode_workers: int = 1,
    disaggregation: str = "conditional",
    transfer_backend: str = "nixl",
    worker_args: tuple[str, ...] = (),
    worker_threads: int = 1,
    timeout_s: float = 600.0,
) -> PDReport:
    """Run ``workload`` on a colocated cluster, then on a disaggregated one, and report both.

    Args:
        model: checkpoint folder.
        workload: the requests, the same in both modes (default: ``PDWorkload()``).
        prefill_workers, decode_workers: the disaggregated cluster's workers; the colocated one has
            ``prefill_workers + decode_workers`` decode workers.
        disaggregation: the disaggregated router's mode, ``conditional`` (the product default: the
            short decode prompts prefill on the decode worker) or ``always``.
        transfer_backend: every worker's ``--transfer-backend`` (the handoffs' backend).
        worker_args: extra ``baton worker`` flags (``--dtype``, ``--max-num-batched-tokens``, ...).
        worker_threads: torch threads per worker process.
        timeout_s: deadline of each request.

    Raises:
        ValueError: a bad argument, naming its ``baton bench pd`` flag.
        grpc.RpcError, RuntimeError: a request failed (both clusters are stopped either way).
    """
    check_setup(prefill_workers, decode_workers, disaggregation, transfer_backend)
    workload = workload or PDWorkload()
    vocab_size = load_model_config(model).vocab_size
    decode, prefill, warmup = workload.prompts(vocab_size, warmups=prefill_workers + decode_workers)
    reports = {}
    with torch_threads(worker_threads):
        for mode, setting, prefills, decodes in (
            ("colocated", "never", 0, prefill_workers + decode_workers),
            ("disaggregated", disaggregation, prefill_workers, decode_workers),
        ):
            cluster = LocalCluster(
                model,
                port=0,
                prefill_workers=prefills,
                decode_workers=decodes,
                worker_args=["--transfer-backend", transfer_backend, *worker_args],
                disaggregation=setting,
                local_prefill_tokens=LOCAL_PREFILL_TOKENS,
            )
            try:
                with grpc.insecure_channel(f"127.0.0.1:{cluster.port}") as channel:
                    stub = generation_pb2_grpc.GenerationStub(channel)
                    _warm_up(stub, warmup, timeout_s)
                    start = time.perf_counter()
                    records = _run_workload(stub, workload, decode, prefill, timeout_s)
                    wall_s = time.perf_counter() - start
            finally:
                cluster.stop()
            reports[mode] = ModeReport(mode, setting, prefills, decodes, tuple(records), wall_s)
    return PDReport(
        str(model),
        workload,
        transfer_backend,
        worker_threads,
        tuple(worker_args),
        reports["colocated"],
        reports["disaggregated"],
    )


def _warm_up(stub, prompts: list[list[int]], timeout_s: float) -> None:
    """Send every warm-up prompt at once, so each worker has run a short and a long prompt."""
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        calls = [
            pool.submit(
                timed_generate,
                stub,
                "warmup",
                prompt,
                _WARMUP_DECODE_TOKENS if len(prompt) <= LOCAL_PREFILL_TOKENS else PREFILL_MAX_TOKENS,
                timeout_s,
            )
            for prompt in prompts
        ]
        for call in calls:
            call.result()


def _run_workload(
    stub, workload: PDWorkload, decode: list[list[list[int]]], prefill: list[list[int]], timeout_s: float
) -> list[RequestRecord]:
    """The decode streams and the long-prefill thread, started together; every record, in order."""
    start = threading.Barrier(workload.decode_streams + 1)

    def decode_stream(prompts: list[list[int]]) -> list[RequestRecord]:
        start.wait()
        return [timed_generate(stub, "decode", p, workload.decode_tokens, timeout_s) for p in prompts]

    def long_prefills() -> list[RequestRecord]:
        start.wait()
        return [timed_generate(stub, "prefill", p, PREFILL_MAX_TOKENS, timeout_s) for p in prefill]

    with ThreadPoolExecutor(max_workers=workload.decode_streams + 1) as pool:
        streams = [pool.submit(decode_stream, prompts) for prompts in decode]
        prefills = pool.submit(long_prefills)
        records = [record for stream in streams for record in stream.result()]
        return records + prefills.result()
