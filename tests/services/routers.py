"""In-process routers over test workers: ``Router`` (server, stub, its metrics) and the factory the
router fixtures share, every router and channel closed when it ends."""

import contextlib
from collections.abc import Iterator
from typing import NamedTuple
from urllib.request import urlopen

import grpc
from prometheus_client.parser import text_string_to_metric_families

from proto.baton.v1 import generation_pb2_grpc
from router.server import RouterConfig, RouterServer


class Router(NamedTuple):
    server: RouterServer
    stub: generation_pb2_grpc.GenerationStub

    def metric(self, name: str, **labels) -> float:
        return scrape(self.server.metrics_port, name, **labels)


def scrape(metrics_port: int, name: str, **labels) -> float:
    """One sample of a process's ``/metrics`` (0 when absent)."""
    text = urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


@contextlib.contextmanager
def router_factory(model, **defaults) -> Iterator:
    """``make(prefill_workers, decode_workers, **RouterConfig options) -> Router`` over ``model``;
    ``defaults`` are options every router gets unless ``make`` overrides them."""
    made = []

    def make(prefill, decode, **options) -> Router:
        server = RouterServer(
            RouterConfig(
                model=str(model),
                prefill=tuple(p.address for p in prefill),
                decode=tuple(d.address for d in decode),
                port=0,
                **{**defaults, **options},
            )
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        made.append((server, channel))
        return Router(server, generation_pb2_grpc.GenerationStub(channel))

    try:
        yield make
    finally:
        for server, channel in made:
            channel.close()
            server.stop()
