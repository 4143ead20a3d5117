"""Workers from the Kubernetes API: the ready endpoints of the EndpointSlices a label selector picks.

Per role, one thread runs the list-then-watch loop of an informer:

    list (selector) ──▶ every slice, resourceVersion R ──▶ on_change(full sets)
    watch from R ──▶ ADDED / MODIFIED / DELETED ──▶ on_change(full sets) ...
    stream ends ──▶ short pause; 410 Gone (R too old) ──▶ list again
    any other error ──▶ wait (doubling, capped) ──▶ list again

Slices are kept as the API's JSON (``raw_object``), not the client's models, so the code reads the
same fields whichever ``kubernetes`` release generated them.
"""

import logging
import threading
import time

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from .base import Discovery, OnChange

log = logging.getLogger(__name__)
_GONE = 410
_LIST_TIMEOUT_S = 10.0
_STOP_WAIT_S = 2.0  # then stop() returns anyway; a thread still in a read can no longer report


class KubernetesDiscovery(Discovery):
    """Prefill and decode workers from ``discovery.k8s.io/v1`` EndpointSlices.

    The Helm chart gives each worker role a headless Service; its EndpointSlices carry the Service's
    labels (``app.kubernetes.io/component=decode,app.kubernetes.io/instance=REL``) and
    ``kubernetes.io/service-name``. An endpoint counts while its ``conditions.ready`` is not false
    (the API says to read a missing value as ready); its address is the first of ``addresses`` with
    the slice's port named ``port_name``.

    Args:
        namespace: the workers' namespace.
        prefill_selector: label selector of the prefill workers' slices; empty: none (colocated).
        decode_selector: label selector of the decode workers' slices.
        port_name: the name of the workers' gRPC port in the Service.
        api_client: a configured ``kubernetes.client.ApiClient``; None loads the in-cluster service
            account, or ``~/.kube/config`` when running outside a cluster.
        watch_timeout_s: how long the API server keeps one watch open before the loop lists again.
        backoff_s: ``(first, longest)`` wait after an error, doubling in between.

    Raises:
        ValueError: a missing namespace or decode selector, or no usable Kubernetes configuration.
    """

    def __init__(
        self,
        namespace: str,
        prefill_selector: str,
        decode_selector: str,
        port_name: str = "grpc",
        api_client=None,
        watch_timeout_s: int = 300,
        backoff_s: tuple[float, float] = (0.5, 30.0),
    ):
        if not namespace:
            raise ValueError("namespace: kubernetes discovery needs the workers' namespace")
        if not decode_selector:
            raise ValueError("decode_selector: kubernetes discovery needs the decode workers' label selector")
        if not port_name:
            raise ValueError("port_name: name the workers' gRPC port")
        self.namespace = namespace
        self.port_name = port_name
        self.selectors = {"decode": decode_selector}
        if prefill_selector:
            self.selectors["prefill"] = prefill_selector
        self.watch_timeout_s = int(watch_timeout_s)
        self.backoff_s = backoff_s
        self._client = api_client if api_client is not None else _default_client()
        self._api = client.DiscoveryV1Api(self._client)
        self._slices: dict[str, dict[str, dict]] = {role: {} for role in self.selectors}
        self._lock = threading.Lock()  # guards _slices, _last and the on_change calls
        self._last: tuple[list[str], list[str]] | None = None
        self._on_change: OnChange | None = None
        self._stopped = threading.Event()
        self._watches: dict[str, watch.Watch] = {}
        self._threads: list[threading.Thread] = []

    def start(self, on_change: OnChange) -> None:
        self._on_change = on_change
        for role, selector in self.selectors.items():
            thread = threading.Thread(
                target=self._run, args=(role, selector), name=f"discovery-{role}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopped.set()
        deadline = time.monotonic() + _STOP_WAIT_S
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                # Again and again: Watch.stop cuts the open stream, but a watch just starting resets it.
                for current in list(self._watches.values()):
                    current.stop()
                thread.join(0.05)
        with self._lock:
            self._on_change = None  # a thread still stuck in a read can no longer report

    def _run(self, role: str, selector: str) -> None:
        """List, then watch, until stopped; every failure is logged and retried, never raised."""
        delay = self.backoff_s[0]
        while not self._stopped.is_set():
            try:
                version = self._list(role, selector)
                delay = self.backoff_s[0]
                self._watch(role, selector, version)
                # The watch ended (its timeout, or the server closed it): list again, after a pause
                # so that a server closing every watch at once is not hammered.
                if self._stopped.wait(self.backoff_s[0]):
                    return
                continue
            except ApiException as error:
                if self._stopped.is_set():
                    return
                if error.status == _GONE:
                    log.info("discovery %s: watch expired (410 Gone); listing again", role)
                    continue
                log.warning(
                    "discovery %s: API error %s %s; retry in %.1fs", role, error.status, error.reason, delay
                )
            except Exception as error:  # unreachable API, bad response: keep trying, never crash
                if self._stopped.is_set():
                    return  # stop() cut the watch's connection
                log.warning("discovery %s: %s: %s; retry in %.1fs", role, type(error).__name__, error, delay)
            if self._stopped.wait(delay):
                return
            delay = min(delay * 2, self.backoff_s[1])

    def _list(self, role: str, selector: str) -> str:
        """Replace the role's slices with a fresh list; returns its resourceVersion."""
        listed = self._api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=selector, _request_timeout=_LIST_TIMEOUT_S
        )
        raw = self._client.sanitize_for_serialization(listed)
        slices = {item["metadata"]["name"]: item for item in raw.get("items") or []}
        self._publish(role, slices)
        return (raw.get("metadata") or {}).get("resourceVersion") or ""

    def _watch(self, role: str, selector: str, version: str) -> None:
        """Apply watch events from ``version`` until the stream ends; 410 raises ``ApiException``."""
        current = watch.Watch()
        self._watches[role] = current
        if self._stopped.is_set():
            return
        stream = current.stream(
            self._api.list_namespaced_endpoint_slice,
            self.namespace,
            label_selector=selector,
            resource_version=version,
            timeout_seconds=self.watch_timeout_s,
            _request_timeout=(_LIST_TIMEOUT_S, self.watch_timeout_s + _LIST_TIMEOUT_S),
        )
        for event in stream:
            if self._stopped.is_set():
                break
            kind, item = event.get("type"), event.get("raw_object") or {}
            name = (item.get("metadata") or {}).get("name")
            if kind not in ("ADDED", "MODIFIED", "DELETED") or not name:
                continue  # BOOKMARK: nothing changed
            slices = dict(self._slices[role])
            if kind == "DELETED":
                slices.pop(name, None)
            else:
                slices[name] = item
            self._publish(role, slices)

    def _publish(self, role: str, slices: dict[str, dict]) -> None:
        """Store a role's slices; call ``on_change`` when either address set changed."""
        with self._lock:
            self._slices[role] = slices
            state = tuple(
                sorted({a for item in self._slices.get(r, {}).values() for a in self._addresses(item)})
                for r in ("prefill", "decode")
            )
            if state == self._last or self._on_change is None:
                return
            self._last = state
            log.info("discovery: prefill %s, decode %s", ",".join(state[0]), ",".join(state[1]))
            try:
                self._on_change(list(state[0]), list(state[1]))
            except Exception:
                log.exception("discovery: updating the worker pool failed")

    def _addresses(self, item: dict) -> list[str]:
        """``host:port`` of each ready endpoint in one EndpointSlice (JSON)."""
        ports = [p.get("port") for p in item.get("ports") or [] if (p.get("name") or "") == self.port_name]
        if not ports or ports[0] is None:
            if item.get("endpoints"):
                log.warning(
                    "discovery: EndpointSlice %s has no port named %r",
                    item.get("metadata", {}).get("name"),
                    self.port_name,
                )
            return []
        found = []
        for endpoint in item.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            if (endpoint.get("conditions") or {}).get("ready") is False or not addresses:
                continue
            host = addresses[0]
            found.append(f"[{host}]:{ports[0]}" if ":" in host else f"{host}:{ports[0]}")
        return found


def _default_client():
    """An ``ApiClient`` from the pod's service account, else from the kubeconfig."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        try:
            config.load_kube_config(client_configuration=configuration)
        except (config.ConfigException, OSError) as error:
            raise ValueError(
                f"discovery: no in-cluster service account and no usable kubeconfig ({error})"
            ) from None
    return client.ApiClient(configuration)
