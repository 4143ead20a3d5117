"""A fault run end to end: clients, kills, the availability probe, the leak check, one request after.

    clients (own process)  ══ streams, cancels, deadlines ══▶ router ──▶ prefill / decode workers
    kill injector          ── SIGKILL at finished-request thresholds, waits for each restart
    availability probe     ── ListModels + health every 50 ms
    then: every worker's CheckIntegrity until nothing is held; one plain request

``run_faults`` drives a running ``LocalCluster``; ``measure_faults`` starts one (each prefill worker
with ``--fail-transfers``), runs, and stops it.
"""

import time

from deploy.local.launcher import LocalCluster
from sdk import Client
from sdk.errors import BatonError
from services.engine.model.config_loader import load_model_config

from ..worker_threads import worker_threads as torch_threads
from .availability_probe import AvailabilityProbe
from .fault_report import FaultReport
from .leak_check import wait_until_released
from .router_metrics import delta, requests_by_status
from .scenario import FaultScenario, plan_requests
from .traffic import TrafficProcess
from .worker_kill import KillInjector


def run_faults(
    cluster: LocalCluster, model: str, scenario: FaultScenario, leak_bound_s: float = 30.0
) -> FaultReport:
    """Run ``scenario`` against ``cluster`` (serving ``model``) and report.

    ``scenario.fail_transfers`` is the cluster's business (its prefill workers' flag); the report
    only names it. ``leak_bound_s``: how long after the last client's end (or the last killed
    worker's restart, if later) the workers have to let go of everything.

    Raises:
        RuntimeError, TimeoutError: the clients or a kill could not run (not a fault finding).
    """
    address = f"127.0.0.1:{cluster.port}"
    metrics_url = f"http://127.0.0.1:{cluster.router.metrics_port}/metrics"
    plans = plan_requests(scenario, load_model_config(model).vocab_size)
    before = requests_by_status(metrics_url)
    probe = AvailabilityProbe(address)
    started = time.monotonic()
    traffic = TrafficProcess(address, plans, scenario.concurrency, scenario.client_attempts)
    injector = KillInjector(cluster, scenario.kill_schedule(), traffic.finished, metrics_url)
    try:
        outcomes = traffic.outcomes(timeout_s=scenario.timeout_s + 600)
    except BaseException:
        injector.cancel()
        traffic.stop()
        probe.stop()
        raise
    clients_done = max((o.ended for o in outcomes), default=time.monotonic())
    kills = injector.join()
    # A worker still restarting after its SIGKILL cannot answer, but holds nothing either: the clock
    # starts once the last client is done and every killed worker is back.
    back = [kill.killed_at + kill.restarted_s for kill in kills if kill.restarted_s is not None]
    leaks = wait_until_released(cluster.workers, max([clients_done, *back]), leak_bound_s)
    availability = probe.stop()
    router_outcomes = delta(before, requests_by_status(metrics_url))
    served_after = _plain_request(address, load_model_config(model).vocab_size)
    return FaultReport(
        model=model,
        prefill_workers=sum(w.role == "prefill" for w in cluster.workers),
        decode_workers=sum(w.role == "decode" for w in cluster.workers),
        scenario=scenario,
        outcomes=tuple(outcomes),
        kills=tuple(kills),
        leaks=leaks,
        availability=availability,
        router_outcomes=router_outcomes,
        served_after=served_after,
        wall_s=time.monotonic() - started,
    )


def _plain_request(address: str, vocab_size: int) -> str:
    """``OK`` when a plain handed-off request completes once the run is over, else its status."""
    prompt = [(7 * i + 3) % (vocab_size - 3) + 3 for i in range(40)]  # long enough to be handed off
    try:
        with Client(address, timeout_s=120) as client:
            done = client.generate(prompt_ids=prompt, max_tokens=4, ignore_eos=True)
    except BatonError as error:
        return error.code.name
    return "OK" if done.finish_reason == "length" and len(done.token_ids) == 4 else "INCOMPLETE"


def fault_cluster(
    model: str,
    scenario: FaultScenario,
    prefill_workers: int = 2,
    decode_workers: int = 2,
    worker_args: tuple[str, ...] = (),
) -> LocalCluster:
    """A ``LocalCluster`` for ``scenario``: prefill workers with ``--fail-transfers``, decode workers
    with a seat for every concurrent request (so a full worker is not mistaken for a fault)."""
    return LocalCluster(
        model,
        port=0,
        prefill_workers=prefill_workers,
        decode_workers=decode_workers,
        worker_args=list(worker_args),
        role_args={
            "prefill": ["--fail-transfers", str(scenario.fail_transfers)],
            "decode": ["--max-num-seqs", str(max(64, scenario.concurrency))],
        },
    )


def measure_faults(
    model: str,
    scenario: FaultScenario,
    prefill_workers: int = 2,
    decode_workers: int = 2,
    worker_args: tuple[str, ...] = (),
    worker_threads: int = 1,
    leak_bound_s: float = 30.0,
) -> FaultReport:
    """Start a cluster for ``scenario`` (``fault_cluster``), ``run_faults`` on it, stop it."""
    with torch_threads(worker_threads):
        cluster = fault_cluster(model, scenario, prefill_workers, decode_workers, worker_args)
        try:
            return run_faults(cluster, model, scenario, leak_bound_s)
        finally:
            cluster.stop()
