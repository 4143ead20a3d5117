"""``KubernetesDiscovery`` against a fake API server: list, watch events, re-list after a watch ends or
a 410 Gone, retries after server errors, the label selectors passed through."""

import threading
import time

import pytest
from kubernetes import client

from router.discovery.k8s import KubernetesDiscovery
from tests.router_discovery.fake_kubernetes import FakeKubernetes, endpoint_slice

NAMESPACE = "serving"
PREFILL = {"app.kubernetes.io/component": "prefill", "app.kubernetes.io/instance": "rel"}
DECODE = {"app.kubernetes.io/component": "decode", "app.kubernetes.io/instance": "rel"}
OTHER_RELEASE = {"app.kubernetes.io/component": "decode", "app.kubernetes.io/instance": "other"}
PREFILL_SELECTOR = "app.kubernetes.io/component=prefill,app.kubernetes.io/instance=rel"
DECODE_SELECTOR = "app.kubernetes.io/component=decode,app.kubernetes.io/instance=rel"


class Recorder:
    """The ``on_change`` callback: every call, and a wait for a wanted state."""

    def __init__(self, fail_first: int = 0):
        self.calls: list[tuple[list[str], list[str]]] = []
        self.fail_first = fail_first
        self._changed = threading.Condition()

    def __call__(self, prefill: list[str], decode: list[str]) -> None:
        with self._changed:
            self.calls.append((prefill, decode))
            self._changed.notify_all()
        if len(self.calls) <= self.fail_first:
            raise RuntimeError("the pool update failed")

    def wait_for(self, prefill: list[str], decode: list[str], timeout_s: float = 10.0) -> None:
        with self._changed:
            if not self._changed.wait_for(
                lambda: self.calls and self.calls[-1] == (prefill, decode), timeout_s
            ):
                pytest.fail(f"never reported {(prefill, decode)}; calls: {self.calls}")


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.02)


@pytest.fixture
def fake():
    server = FakeKubernetes(NAMESPACE)
    server.put(endpoint_slice("decode-a", DECODE, [("10.0.0.1", True), ("10.0.0.2", False)]))
    server.put(endpoint_slice("prefill-a", PREFILL, [("10.0.1.1", True)]))
    server.put(endpoint_slice("decode-other", OTHER_RELEASE, [("10.9.9.9", True)]))
    yield server
    server.close()


@pytest.fixture
def discover(fake):
    """``discover(**options) -> Recorder``: a started discovery over the fake, stopped afterwards."""
    started = []

    def start(recorder: Recorder | None = None, **options) -> Recorder:
        options = {"prefill_selector": PREFILL_SELECTOR, "decode_selector": DECODE_SELECTOR, **options}
        api = client.ApiClient(client.Configuration(host=fake.url))
        discovery = KubernetesDiscovery(NAMESPACE, api_client=api, backoff_s=(0.02, 0.1), **options)
        recorder = recorder or Recorder()
        discovery.start(recorder)
        started.append(discovery)
        return recorder

    yield start
    for discovery in started:
        discovery.stop()


def test_the_first_list_reports_ready_endpoints_of_the_selected_slices(fake, discover):
    changes = discover()
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000"])
    selectors = {query.get("labelSelector") for _, query in fake.requests}
    assert selectors == {PREFILL_SELECTOR, DECODE_SELECTOR}, "the label selectors reach the API as given"


def test_watch_events_add_and_remove_endpoints(fake, discover):
    changes = discover()
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000"])
    wait_until(lambda: fake.watches() >= 2)
    fake.put(endpoint_slice("decode-a", DECODE, [("10.0.0.1", False), ("10.0.0.2", True)]))  # MODIFIED
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.2:9000"])
    fake.put(endpoint_slice("decode-b", DECODE, [("10.0.0.3", True)]))  # ADDED
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.2:9000", "10.0.0.3:9000"])
    fake.delete("prefill-a")  # DELETED
    changes.wait_for([], ["10.0.0.2:9000", "10.0.0.3:9000"])
    fake.put(endpoint_slice("decode-other", OTHER_RELEASE, [("10.9.9.8", True)]))  # not selected
    fake.delete("decode-b")
    changes.wait_for([], ["10.0.0.2:9000"])
    assert all("10.9.9" not in address for _, decode in changes.calls for address in decode)


def test_unchanged_sets_are_not_reported_again(fake, discover):
    changes = discover()
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000"])
    wait_until(lambda: fake.watches() >= 2)
    before = len(changes.calls)
    fake.put(endpoint_slice("decode-a", DECODE, [("10.0.0.1", True), ("10.0.0.2", False)]))  # same sets
    fake.put(endpoint_slice("decode-c", DECODE, [("10.0.0.4", True)]))
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000", "10.0.0.4:9000"])
    assert len(changes.calls) == before + 1


def test_a_watch_that_ends_is_followed_by_a_new_list_and_watch(fake, discover):
    changes = discover()
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000"])
    wait_until(lambda: fake.watches() >= 2)
    lists = fake.lists()
    fake.end_watches()
    wait_until(lambda: fake.lists() >= lists + 2 and fake.watches() >= 4)
    last_watch = [query for _, query in fake.requests if "watch" in query][-1]
    assert last_watch["resourceVersion"] == str(fake.version), "the watch resumes from the list's version"
    fake.put(endpoint_slice("decode-b", DECODE, [("10.0.0.3", True)]))
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000", "10.0.0.3:9000"])


@pytest.mark.parametrize("how", ["error-event", "http-status"])
def test_410_gone_lists_again(fake, discover, how):
    changes = discover()
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000"])
    wait_until(lambda: fake.watches() >= 2)
    if how == "error-event":
        fake.expire_next_watches = 2
    else:
        fake.gone_status_next_watches = 2
    lists = fake.lists()
    fake.end_watches()  # each role lists, its watch is refused with 410, it lists again
    fake.put(endpoint_slice("decode-b", DECODE, [("10.0.0.3", True)]))
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000", "10.0.0.3:9000"])
    wait_until(
        lambda: fake.lists() >= lists + 4 and fake.expire_next_watches + fake.gone_status_next_watches == 0
    )
    fake.delete("decode-a")  # and the watch after the 410 works
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.3:9000"])


def test_server_errors_are_retried_until_the_api_answers(fake, discover):
    fake.fail_next = 6
    changes = discover()
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000"])
    assert fake.fail_next == 0
    wait_until(lambda: fake.watches() >= 2)
    fake.fail_next = 4
    fake.end_watches()  # re-lists fail four times between them, then succeed
    fake.put(endpoint_slice("decode-b", DECODE, [("10.0.0.3", True)]))
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000", "10.0.0.3:9000"])


def test_an_unreachable_api_is_retried_without_raising(fake):
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))
    discovery = KubernetesDiscovery(NAMESPACE, "", DECODE_SELECTOR, api_client=api, backoff_s=(0.01, 0.05))
    changes = Recorder()
    discovery.start(changes)
    time.sleep(0.5)
    assert all(thread.is_alive() for thread in discovery._threads)
    discovery.stop()
    assert changes.calls == []


def test_a_failing_on_change_does_not_stop_discovery(fake, discover):
    changes = discover(Recorder(fail_first=1))
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000"])
    wait_until(lambda: fake.watches() >= 2)
    fake.put(endpoint_slice("decode-b", DECODE, [("10.0.0.3", True)]))
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000", "10.0.0.3:9000"])


def test_port_by_name_ipv6_unknown_readiness_and_colocated(fake, discover):
    fake.put(endpoint_slice("decode-a", DECODE, [("10.0.0.1", None), ("fd00::7", True)], port=9100))
    fake.put(endpoint_slice("decode-m", DECODE, [("10.0.0.5", True)], port=9200, port_name="metrics"))
    changes = discover(prefill_selector="")  # colocated: prefill workers are not watched
    changes.wait_for([], ["10.0.0.1:9100", "[fd00::7]:9100"])
    assert {query.get("labelSelector") for _, query in fake.requests} == {DECODE_SELECTOR}


def test_stop_ends_reporting(fake, discover):
    api = client.ApiClient(client.Configuration(host=fake.url))
    discovery = KubernetesDiscovery(NAMESPACE, PREFILL_SELECTOR, DECODE_SELECTOR, api_client=api)
    changes = Recorder()
    discovery.start(changes)
    changes.wait_for(["10.0.1.1:9000"], ["10.0.0.1:9000"])
    started = time.monotonic()
    discovery.stop()
    assert time.monotonic() - started < 3.0
    calls = len(changes.calls)
    fake.put(endpoint_slice("decode-b", DECODE, [("10.0.0.3", True)]))
    time.sleep(0.3)
    assert len(changes.calls) == calls


@pytest.mark.parametrize(
    "options, words",
    [
        ({"namespace": ""}, "namespace:"),
        ({"decode_selector": ""}, "decode_selector:"),
        ({"port_name": ""}, "port_name:"),
    ],
    ids=["no-namespace", "no-decode-selector", "no-port-name"],
)
def test_bad_settings_name_the_field(options, words):
    settings = {"namespace": NAMESPACE, "prefill_selector": "", "decode_selector": DECODE_SELECTOR}
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:1"))
    with pytest.raises(ValueError, match=words):
        KubernetesDiscovery(**{**settings, **options}, api_client=api)
