"""A rolling restart under load loses no request: ``LocalCluster`` (2 prefill + 2 decode workers), 12
greedy streams at all times (several in each worker's batch), SIGTERM to a worker (it drains and exits
0, the launcher starts it again). As Kubernetes rolls the prefill and the decode Deployment at the same
time, one pod of each at a time, a prefill and a decode worker restart together: one such step of the
roll runs here (every further step is the same with other workers), until the router counts both back
and the restarted decode worker runs streams again. Every request ends OK with the undisturbed output;
streams that outlive a decode worker's grace period move to the other (``baton_migrations_total``).
"""

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.request import urlopen

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from deploy.local.launcher import LocalCluster
from proto.baton.v1 import generation_pb2, generation_pb2_grpc

CLIENTS = 12
PROMPTS = [[(k * 17 + 5 * i) % 93 + 2 for i in range(20 + 3 * k)] for k in range(6)]  # handed off
MAX_TOKENS = 16  # a stream outlives the 0.5 s grace period on a busy 2-core machine


def request_of(k: int) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=PROMPTS[k]),
        sampling=generation_pb2.SamplingParameters(max_tokens=MAX_TOKENS, ignore_eos=True),
    )


def tokens_of(stub, k: int) -> list[int]:
    return [t for m in stub.Generate(request_of(k), timeout=120) for t in m.token_ids]


def scrape(port: int, name: str, **labels) -> float:
    text = urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    samples = (s for family in text_string_to_metric_families(text) for s in family.samples)
    return next((s.value for s in samples if s.name == name and s.labels == labels), 0.0)


def serving(address: str) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def test_a_rolling_restart_under_load_loses_no_request(tiny_checkpoint, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # five processes on a small machine: no thread fights
    cluster = LocalCluster(
        str(tiny_checkpoint("k3")),
        port=0,
        prefill_workers=2,
        decode_workers=2,
        worker_args=["--batch-invariant", "--dtype", "float32"],  # a moved stream's tokens are exact
        grace_period_s=0.5,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{cluster.port}")
    stub = generation_pb2_grpc.GenerationStub(channel)
    stop, outcomes = threading.Event(), []

    def client(index: int) -> None:
        turn = index
        while not stop.is_set():
            k, turn = turn % len(PROMPTS), turn + 1
            try:
                outcomes.append((k, "OK", tokens_of(stub, k)))
            except grpc.RpcError as error:
                outcomes.append((k, error.code().name, error.details()))

    clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # batch-invariant: as each alone
            undisturbed = list(pool.map(lambda k: tokens_of(stub, k), range(len(PROMPTS))))
        for thread in clients:
            thread.start()
        time.sleep(1)  # every client has a stream going
        pair = [next(w for w in cluster.workers if w.role == role) for role in ("prefill", "decode")]
        old = {worker.name: worker.process for worker in pair}
        for worker in pair:
            worker.process.send_signal(signal.SIGTERM)
        for worker in pair:
            # On a saturated CI machine a drain's last steps and the server's shutdown were seen
            # to take over a minute; what this test asserts is a clean exit and no lost request.
            assert old[worker.name].wait(timeout=180) == 0, f"{worker.name} did not drain and exit 0"
        deadline = time.monotonic() + 180
        for worker in pair:
            while worker.process is old[worker.name] or not worker.alive() or not serving(worker.address):
                assert time.monotonic() < deadline, f"{worker.name} was not restarted"
                time.sleep(0.2)
        # The router re-probes a worker it marked down every probe_interval_s (1 s): the roll's next
        # step would go once it counts both back.
        for worker in pair:
            labels = {"role": worker.role, "worker": worker.address}
            while scrape(cluster.router.metrics_port, "baton_worker_up", **labels) != 1:
                assert time.monotonic() < deadline, f"the router did not take {worker.name} back"
                time.sleep(0.1)
        # The restarted decode worker (its new process's metrics) takes the clients' streams again.
        restarted_decode = int(pair[1].ready["metrics_port"])
        while scrape(restarted_decode, "baton_requests_running", role="decode") == 0:
            assert time.monotonic() < deadline, "the restarted decode worker ran no stream"
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=180)
        migrated = scrape(cluster.router.metrics_port, "baton_migrations_total", outcome="migrated")
        channel.close()
        cluster.stop()
    failures = [outcome for outcome in outcomes if outcome[1] != "OK"]
    assert not failures, failures[:5]
    wrong = [k for k, _, tokens in outcomes if tokens != undisturbed[k]]
    assert not wrong, f"{len(wrong)} of {len(outcomes)} requests gave other tokens"
    assert len(outcomes) >= 2 * CLIENTS
    assert migrated >= 1  # some streams outlived a decode worker's grace period and moved
    assert [worker.restarts for worker in cluster.workers] == [1, 0, 1, 0]  # prefill-0, -1, decode-0, -1
