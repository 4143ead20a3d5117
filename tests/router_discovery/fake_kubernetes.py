"""A fake Kubernetes API server: EndpointSlice list and watch, exactly what ``KubernetesDiscovery`` calls.

    GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=S
        -> EndpointSliceList with metadata.resourceVersion
    GET ...same...&watch=true&resourceVersion=R
        -> 200, chunked JSON lines {"type": ADDED|MODIFIED|DELETED|ERROR, "object": ...}: the events
           after R, then live ones until ``end_watches`` or the server closes

Every change bumps one resourceVersion counter and is kept in a history, so a watch from an older
version replays what it missed (as the real API server does). Test hooks: ``fail_next`` (HTTP 500s),
``expire_next_watches`` (a 410 Gone ERROR event), ``gone_status_next_watches`` (HTTP 410), and
``requests`` (each request's path and query).
"""

import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

API_PREFIX = "/apis/discovery.k8s.io/v1/namespaces/"


def endpoint_slice(
    name: str, labels: dict, endpoints: list[tuple[str, bool | None]], port: int = 9000, port_name="grpc"
) -> dict:
    """An EndpointSlice object as the API returns it; ``endpoints``: ``(ip, ready)`` pairs."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": dict(labels)},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [ip], "conditions": {} if ready is None else {"ready": ready}}
            for ip, ready in endpoints
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


def _matches(selector: str, labels: dict) -> bool:
    """Equality-based selectors only (``a=b,c=d``): all the router uses."""
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def _status_object(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubernetes:
    """The fake API server on ``url`` (``http://127.0.0.1:PORT``); ``close()`` when done."""

    def __init__(self, namespace: str = "serving"):
        self.namespace = namespace
        self.version = 100
        self.slices: dict[str, dict] = {}
        self.history: list[tuple[int, str, dict]] = []  # (resourceVersion, event type, object)
        self.requests: list[tuple[str, dict]] = []
        self.fail_next = 0
        self.expire_next_watches = 0
        self.gone_status_next_watches = 0
        self._lock = threading.Lock()
        self._watchers: list[queue.Queue] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_port}"

    def put(self, item: dict) -> None:
        """Create or replace a slice (ADDED or MODIFIED to open watches)."""
        with self._lock:
            name = item["metadata"]["name"]
            kind = "MODIFIED" if name in self.slices else "ADDED"
            self.slices[name] = self._record(kind, item)

    def delete(self, name: str) -> None:
        with self._lock:
            self._record("DELETED", self.slices.pop(name))

    def end_watches(self) -> None:
        """Close every open watch stream cleanly (as the API server does at ``timeoutSeconds``)."""
        with self._lock:
            for watcher in self._watchers:
                watcher.put(None)

    def lists(self) -> int:
        return sum(1 for _, query in self.requests if "watch" not in query)

    def watches(self) -> int:
        return sum(1 for _, query in self.requests if "watch" in query)

    def close(self) -> None:
        self.end_watches()
        self._server.shutdown()
        self._server.server_close()

    def _record(self, kind: str, item: dict) -> dict:
        """Stamp a change with the next resourceVersion, keep it, tell open watches; the stamped copy."""
        self.version += 1
        item = json.loads(json.dumps(item))
        item["metadata"]["resourceVersion"] = str(self.version)
        self.history.append((self.version, kind, item))
        for watcher in self._watchers:
            watcher.put((self.version, kind, item))
        return item

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urlparse(self.path)
                query = {key: values[0] for key, values in parse_qs(url.query).items()}
                fake.requests.append((url.path, query))
                if url.path != f"{API_PREFIX}{fake.namespace}/endpointslices":
                    return self._status(404, "NotFound", f"no route {url.path}")
                if fake.fail_next > 0:
                    fake.fail_next -= 1
                    return self._status(500, "InternalError", "the fake is failing on purpose")
                selector = query.get("labelSelector", "")
                if query.get("watch") in ("true", "1", "True"):
                    return self._watch(selector, int(query.get("resourceVersion") or 0))
                with fake._lock:
                    items = [s for s in fake.slices.values() if _matches(selector, s["metadata"]["labels"])]
                    body = {
                        "apiVersion": "discovery.k8s.io/v1",
                        "kind": "EndpointSliceList",
                        "metadata": {"resourceVersion": str(fake.version)},
                        "items": items,
                    }
                self._json(200, body)

            def _watch(self, selector: str, since: int):
                if fake.gone_status_next_watches > 0:
                    fake.gone_status_next_watches -= 1
                    return self._status(410, "Expired", "too old resource version")
                events = queue.Queue()
                with fake._lock:
                    for version, kind, item in fake.history:
                        if version > since:
                            events.put((version, kind, item))
                    if fake.expire_next_watches > 0:
                        fake.expire_next_watches -= 1
                        events = queue.Queue()
                        events.put("expired")
                    fake._watchers.append(events)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    while True:
                        event = events.get()
                        if event is None:
                            break
                        if event == "expired":
                            status = _status_object(410, "Expired", "too old resource version")
                            self._chunk({"type": "ERROR", "object": status})
                            break
                        _, kind, item = event
                        if _matches(selector, item["metadata"]["labels"]):
                            self._chunk({"type": kind, "object": item})
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass  # the client went away
                finally:
                    with fake._lock:
                        fake._watchers.remove(events)
                self.close_connection = True

            def _chunk(self, event: dict):
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _status(self, code: int, reason: str, message: str):
                self._json(code, _status_object(code, reason, message))

            def _json(self, code: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
