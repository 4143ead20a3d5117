"""What trust costs, side by side in one run: the public API's bearer token, the cluster secret and the
handoff checksum on time to first token, and the checksum beside the handoff's transfer time.

Clusters: two disaggregated clusters (one prefill, one decode worker each) on the same model, started
together, serving in turns (each arm goes first as often, one request in flight):

- ``open``: no token, no cluster secret, ``--no-handoff-checksum`` on the prefill worker;
- ``trusted``: the router's ``--auth-token-file`` (every request carries ``authorization: Bearer``),
  a cluster secret on every internal call, and the handoff checksum (hashed by the prefill worker while
  its write runs, checked by the decode worker before it decodes).

Each request is a fresh random prompt of ``prompt_tokens`` (no prefix hit: every one is handed off),
``max_tokens=2``; its time to first token is the client's, from sending to the first token, which the
decode worker streams after the handoff arrived and passed its check. The arms are checked to differ as
they claim to: the trusted router refuses a request without the token, and each decode worker's
``baton_handoff_checks_total`` / ``baton_handoff_check_seconds_total`` say how many handoffs it hashed
and how long that took (the trusted arm: every one; the open arm: none).

Data plane: for each handoff size, the median NIXL write time between two processes on the bench's
devices (``services.transfer.bandwidth``) and the median checksum time of that many bytes on the
receiver's device (``handoff_checksum.rows_checksum``, 64 KiB rows: the Triton kernel on CUDA, torch on
the CPU), and of its last part (``handoff.PART_BYTES`` at most). The prefill side's hash runs during the
write and the decode side hashes each part while the next lands, so what a handoff waits for is the
last part's hash: its cost is ``last part / transfer``. A write between two processes of one GPU is a
device-local copy (NIXL over CUDA IPC), faster than any link between hosts, so the rows also give the
cost on links of ``links_gbps`` (computed: the last part's hash over the time that link takes for the
size). The goal for both is at most ``GOAL`` (2 %).

A parallel handoff (prefill ranks writing byte spans into decode ranks) is hashed by where its spans land
(``handoff_checksum.spans_checksum``), after the whole write and in one notification: its cost is the
whole size's span hash (``SPAN_BYTES`` spans at scattered addresses) over the write, the ``parallel``
columns.
"""

import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch

from common.byte_sizes import size_name
from common.cluster_secret import write_cluster_secret
from deploy.local.launcher import LocalCluster
from loadtest.scrape import scrape
from proto.baton.v1 import generation_pb2_grpc
from services.engine.handoff import PART_BYTES
from services.engine.handoff_checksum import rows_checksum, settled, span_address, spans_checksum
from services.engine.model.config_loader import load_model_config
from services.transfer import BLOCKS, STATE
from services.transfer.bandwidth import measure_bandwidth

from .request_timing import timed_generate

GOAL = 0.02
ARMS = ("open", "trusted")
ROW_BYTES = 64 << 10  # checksum rows of the data-plane rows (a pool row is tens of KiB)
SPAN_BYTES = 16 << 10  # a parallel handoff's spans (a field's rows of one block, or a head's state)
LINKS_GBPS = (50.0, 450.0)  # a 400 Gb/s NIC; NVLink 4 one way
TOKEN = "bench-trust-token"


@dataclass(frozen=True)
class DataPlaneRow:
    """One handoff size: the median write time, and the median checksum times of the whole handoff, of
    its last part and of the whole handoff as a parallel one's spans, in ms."""

    size_bytes: int
    transfer_ms: float
    checksum_ms: float
    last_part_ms: float
    spans_ms: float

    @property
    def parallel_cost(self) -> float:
        """What the check adds to a parallel handoff (the whole span hash), as a fraction of the write."""
        return self.spans_ms / self.transfer_ms

    @property
    def cost(self) -> float:
        """What the check adds to the handoff (the last part's hash), as a fraction of the write."""
        return self.last_part_ms / self.transfer_ms

    def cost_at(self, link_gbps: float) -> float:
        """The same over a write on a link of ``link_gbps`` GB/s."""
        return self.last_part_ms / (self.size_bytes / (link_gbps * 1e9) * 1e3)


@dataclass(frozen=True)
class TrustCostReport:
    """Each arm's time to first token (ms, in the order sent), the bytes its handoffs moved, the checks
    its decode worker made and their total ms (timed requests only), and the data-plane rows."""

    model: str
    device: str
    prompt_tokens: int
    ttft_ms: dict[str, tuple[float, ...]]
    data_plane: tuple[DataPlaneRow, ...]
    refused_without_token: bool
    handoff_bytes: dict[str, int]
    checks: dict[str, int]
    check_ms: dict[str, float]
    links_gbps: tuple[float, ...] = LINKS_GBPS

    def mean_check_ms(self, arm: str) -> float:
        return self.check_ms[arm] / self.checks[arm] if self.checks[arm] else 0.0

    def percentile(self, arm: str, q: float) -> float:
        values = sorted(self.ttft_ms[arm])
        return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]

    def ttft_ratio(self, q: float = 50) -> float:
        """Trusted over open time to first token at percentile ``q``."""
        return self.percentile("trusted", q) / self.percentile("open", q)

    def check_share(self) -> float:
        """The decode worker's mean check over the trusted arm's mean time to first token."""
        return self.mean_check_ms("trusted") / statistics.fmean(self.ttft_ms["trusted"])

    def as_dict(self) -> dict:
        row = {
            "model": self.model,
            "device": self.device,
            "prompt_tokens": self.prompt_tokens,
            "requests": len(self.ttft_ms["open"]),
            "refused_without_token": self.refused_without_token,
            "goal": GOAL,
        }
        for arm in ARMS:
            for q in (50, 90):
                row[f"{arm}_ttft_p{q}_ms"] = round(self.percentile(arm, q), 3)
            row[f"{arm}_ttft_mean_ms"] = round(statistics.fmean(self.ttft_ms[arm]), 3)
            row[f"{arm}_handoff_bytes"] = self.handoff_bytes[arm]
            row[f"{arm}_checks"] = self.checks[arm]
            row[f"{arm}_mean_check_ms"] = round(self.mean_check_ms(arm), 4)
        row["ttft_ratio_p50"] = round(self.ttft_ratio(), 4)
        row["check_share_of_ttft"] = round(self.check_share(), 5)
        row["data_plane"] = [
            {
                "size_bytes": r.size_bytes,
                "transfer_ms": round(r.transfer_ms, 4),
                "checksum_ms": round(r.checksum_ms, 4),
                "last_part_ms": round(r.last_part_ms, 4),
                "cost": round(r.cost, 4),
                "spans_ms": round(r.spans_ms, 4),
                "parallel_cost": round(r.parallel_cost, 4),
                **{f"cost_at_{link:g}_gbps": round(r.cost_at(link), 4) for link in self.links_gbps},
            }
            for r in self.data_plane
        ]
        return row

    def format_table(self) -> str:
        lines = [
            f"trust cost: {self.model} on {self.device}, {len(self.ttft_ms['open'])} requests per arm, "
            f"{self.prompt_tokens}-token prompts handed off, one in flight, arms in turns",
            f"{'arm':<10}{'TTFT p50 ms':>14}{'p90 ms':>10}{'mean ms':>10}{'vs open':>10}"
            f"{'handoff KiB':>13}{'checks':>8}{'check ms':>10}",
        ]
        for arm in ARMS:
            mean = statistics.fmean(self.ttft_ms[arm])
            lines.append(
                f"{arm:<10}{self.percentile(arm, 50):>14.2f}{self.percentile(arm, 90):>10.2f}{mean:>10.2f}"
                f"{self.percentile(arm, 50) / self.percentile('open', 50):>9.3f}x"
                f"{self.handoff_bytes[arm] / len(self.ttft_ms[arm]) / 1024:>13.1f}{self.checks[arm]:>8}"
                f"{self.mean_check_ms(arm):>10.3f}"
            )
        refused = "yes" if self.refused_without_token else "NO"
        lines.append(f"trusted router refused a request without the token: {refused}")
        links = "".join(f"{f'at {link:g} GB/s':>14}" for link in self.links_gbps)
        header = f"{'handoff':>10}{'transfer ms':>14}{'checksum ms':>14}{'last part ms':>14}{'cost':>10}"
        lines.append(header + links + f"{'parallel ms':>14}{'cost':>10}")
        for r in self.data_plane:
            costs = "".join(f"{100 * r.cost_at(link):>13.2f}%" for link in self.links_gbps)
            lines.append(
                f"{size_name(r.size_bytes):>10}{r.transfer_ms:>14.3f}{r.checksum_ms:>14.3f}"
                f"{r.last_part_ms:>14.3f}{100 * r.cost:>9.2f}%{costs}"
                f"{r.spans_ms:>14.3f}{100 * r.parallel_cost:>9.2f}%"
            )
        ttft_change = self.ttft_ratio() - 1
        ttft_cost = max(ttft_change, self.check_share())
        largest = max(self.data_plane, key=lambda r: r.size_bytes)
        lines.append(
            f"goal, at most {100 * GOAL:.0f}%: TTFT {_verdict(ttft_cost)} ({100 * ttft_change:+.2f}% at p50, "
            f"the check {100 * self.check_share():.2f}% of it); the largest handoff "
            f"{_verdict(largest.cost)} on this host's write ({100 * largest.cost:.2f}%), "
            + ", ".join(
                f"{_verdict(largest.cost_at(link))} at {link:g} GB/s ({100 * largest.cost_at(link):.2f}%)"
                for link in self.links_gbps
            )
        )
        return "\n".join(lines)


def _verdict(cost: float) -> str:
    return "met" if cost <= GOAL else "NOT met"


def measure_trust_cost(
    model: str,
    requests: int = 40,
    warmup: int = 4,
    prompt_tokens: int = 256,
    sizes_bytes: tuple[int, ...] = (1 << 20, 16 << 20, 64 << 20),
    device: str = "cpu",
    worker_args: tuple[str, ...] = (),
    links_gbps: tuple[float, ...] = LINKS_GBPS,
    seed: int = 0,
    timeout_s: float = 120.0,
) -> TrustCostReport:
    """Start both clusters, time ``requests`` requests on each after ``warmup``, then the data plane.

    Raises:
        ValueError: a bad argument (named as its ``baton bench trust`` flag).
        grpc.RpcError: a request failed (the clusters are stopped either way).
    """
    for flag, value in (("--requests", requests), ("--prompt-tokens", prompt_tokens)):
        if value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    if warmup < 0:
        raise ValueError(f"--warmup: must be >= 0, got {warmup}")
    if not links_gbps or not all(link > 0 for link in links_gbps):
        raise ValueError(f"--links-gbps: need positive GB/s, got {list(links_gbps)}")
    if not sizes_bytes or any(size < ROW_BYTES or size % ROW_BYTES for size in sizes_bytes):
        raise ValueError(f"--sizes: need multiples of {ROW_BYTES >> 10}K, got {list(sizes_bytes)}")
    vocab = load_model_config(model).vocab_size
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(1, vocab) for _ in range(prompt_tokens)] for _ in range(2 * (warmup + requests))
    ]
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    handoff_bytes = dict.fromkeys(ARMS, 0)
    worker_args = ("--device", device, *worker_args)
    with tempfile.TemporaryDirectory() as scratch:
        clusters = _start_clusters(model, Path(scratch), list(worker_args))
        try:
            channels = {arm: grpc.insecure_channel(f"127.0.0.1:{c.port}") for arm, c in clusters.items()}
            stubs = {arm: generation_pb2_grpc.GenerationStub(channel) for arm, channel in channels.items()}
            metadata = {"open": (), "trusted": (("authorization", f"Bearer {TOKEN}"),)}
            refused = _refused_without_token(stubs["trusted"], prompts[0], timeout_s)
            before: dict[str, tuple[float, float]] = {}
            for index in range(warmup + requests):
                if index == warmup:  # the checks of timed requests only (no first-call compiles)
                    before = {arm: _decode_counters(cluster) for arm, cluster in clusters.items()}
                order = ARMS if index % 2 == 0 else ARMS[::-1]  # each arm goes first as often
                for arm in order:
                    prompt = prompts.pop()
                    record = timed_generate(stubs[arm], arm, prompt, 2, timeout_s, metadata[arm])
                    if index >= warmup:
                        times[arm].append(1000 * record.ttft)
                        handoff_bytes[arm] += record.transfer_bytes
            for channel in channels.values():
                channel.close()
            after = {arm: _decode_counters(cluster) for arm, cluster in clusters.items()}
        finally:
            for cluster in clusters.values():
                cluster.stop()
    rows = tuple(_data_plane_row(size, device) for size in sizes_bytes)
    return TrustCostReport(
        model,
        device,
        prompt_tokens,
        {arm: tuple(t) for arm, t in times.items()},
        rows,
        refused,
        handoff_bytes,
        {arm: int(after[arm][0] - before[arm][0]) for arm in ARMS},
        {arm: 1e3 * (after[arm][1] - before[arm][1]) for arm in ARMS},
        links_gbps,
    )


def _start_clusters(model: str, scratch: Path, worker_args: list[str]) -> dict[str, LocalCluster]:
    """Both arms' clusters, started one after the other (a failed start stops the one before)."""
    token_file = scratch / "tokens"
    token_file.write_text(f"{TOKEN} bench\n")
    secret_file = write_cluster_secret(scratch / "cluster-secret")
    arms = {
        "open": dict(role_args={"prefill": ["--no-handoff-checksum"]}),
        "trusted": dict(auth_token_file=str(token_file), cluster_secret_file=str(secret_file)),
    }
    clusters: dict[str, LocalCluster] = {}
    try:
        for arm, options in arms.items():
            clusters[arm] = LocalCluster(
                model,
                port=0,
                prefill_workers=1,
                decode_workers=1,
                worker_args=worker_args,
                disaggregation="always",
                **options,
            )
    except BaseException:
        for cluster in clusters.values():
            cluster.stop()
        raise
    return clusters


def _refused_without_token(stub, prompt: list[int], timeout_s: float) -> bool:
    try:
        timed_generate(stub, "trusted", prompt, 2, timeout_s)
    except grpc.RpcError as error:
        return error.code() == grpc.StatusCode.UNAUTHENTICATED
    return False


def _decode_counters(cluster: LocalCluster) -> tuple[float, float]:
    """The decode worker's handoff checks and the seconds they took (its ``/metrics``)."""
    (decode,) = [worker for worker in cluster.workers if worker.role == "decode"]
    counters = scrape(f"http://127.0.0.1:{decode.ready['metrics_port']}/metrics")
    return tuple(
        counters.get(name, {}).get((), 0.0)
        for name in ("baton_handoff_checks_total", "baton_handoff_check_seconds_total")
    )


def _data_plane_row(size: int, device: str) -> DataPlaneRow:
    (measured,) = measure_bandwidth([size], "nixl", device=device)
    transfer_ms = size / (measured["transfer_gbps"] * 1e9) * 1e3
    storage = torch.randint(0, 256, (size // ROW_BYTES, ROW_BYTES), dtype=torch.uint8, device=device)
    last_part = min(size, PART_BYTES) // ROW_BYTES
    whole = _checksum_ms(storage, storage.shape[0])
    return DataPlaneRow(size, transfer_ms, whole, _checksum_ms(storage, last_part), _spans_ms(storage))


def _spans_ms(storage: torch.Tensor) -> float:
    """The median time of a parallel handoff's check over all of ``storage``: ``SPAN_BYTES`` spans, each
    at its own scattered address, hashed by ``spans_checksum`` and settled (one sync)."""
    source = storage.view(-1)
    offsets = torch.arange(0, source.numel(), SPAN_BYTES)
    addresses = span_address(1, STATE, torch.randperm(len(offsets)) * 3 * SPAN_BYTES)
    nbytes = torch.full_like(offsets, SPAN_BYTES)
    return _median_ms(
        lambda: settled([spans_checksum(source, offsets, addresses, nbytes, 0x9F1C0B7E5A3D2C1B)])
    )


def _median_ms(run) -> float:
    """The median of 6 timed calls of ``run`` after one warm-up, in ms."""
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return 1e3 * statistics.median(samples[1:])


def _checksum_ms(storage: torch.Tensor, rows: int) -> float:
    """The median time of ``rows_checksum`` over the first ``rows`` rows (a Python int: synchronised)."""
    ids, capability = {BLOCKS: list(range(rows))}, "9f1c0b7e5a3d2c1b" * 2
    return _median_ms(lambda: rows_checksum({BLOCKS: storage}, ids, capability))
