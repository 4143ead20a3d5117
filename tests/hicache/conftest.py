"""A real redis-server for the cluster index tests (``make test`` installs Debian's; without the binary
these tests skip, saying so)."""

import itertools

import pytest

from deploy.local.redis_server import RedisServer

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def redis_server():
    """One redis-server on a free port per test module."""
    try:
        server = RedisServer().start()
    except FileNotFoundError as error:
        pytest.skip(f"{error}")
    yield server
    server.stop()


@pytest.fixture
def prefix():
    """A fresh key prefix per test: tests share one server and never see each other's nodes."""
    return f"test{next(_prefixes)}:"
