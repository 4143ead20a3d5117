"""The scripted server each SDK test talks to, and a retry policy fast enough for tests."""

import pytest

from sdk import RetryPolicy
from tests.sdk.scripted_server import ScriptedServer

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture
def server():
    scripted = ScriptedServer()
    yield scripted
    scripted.stop()
