"""A small stdlib HTTP client for the OpenAI front: JSON requests, SSE streams, raw bodies."""

import http.client
import json
import socket
from typing import NamedTuple


class Reply(NamedTuple):
    status: int
    headers: dict
    body: dict


class Stream(NamedTuple):
    status: int
    content_type: str
    events: list[str]  # the ``data:`` payloads in order, ``[DONE]`` included

    def chunks(self) -> list[dict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]


def post(port: int, path: str, body, headers: dict | None = None, timeout: float = 60.0) -> Reply:
    """POST ``body`` (a dict as JSON, or raw bytes) and decode the JSON reply."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", path, raw, {"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return Reply(response.status, dict(response.getheaders()), json.loads(response.read()))
    finally:
        connection.close()


def get(port: int, path: str, timeout: float = 30.0, headers: dict | None = None) -> Reply:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, dict(response.getheaders()), json.loads(response.read()))
    finally:
        connection.close()


def stream(port: int, path: str, body: dict, timeout: float = 60.0) -> Stream:
    """POST with ``stream: true`` and read the whole SSE body, checking its framing: every event is
    one ``data: <payload>`` line followed by a blank line."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(
            "POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        text = response.read().decode()
        content_type = response.getheader("Content-Type", "")
    finally:
        connection.close()
    if response.status != 200:
        return Stream(response.status, content_type, [text])
    assert text.endswith("\n\n"), f"the stream does not end with a blank line: {text[-80:]!r}"
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return Stream(response.status, content_type, [e.removeprefix("data: ") for e in events])


class OpenStream:
    """A streaming request left open: read events one by one, then drop the connection."""

    def __init__(self, port: int, path: str, body: dict):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        raw = json.dumps({**body, "stream": True}).encode()
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        self.sock.sendall(head.encode() + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        self.file = self.sock.makefile("rb")
        status_line = self.file.readline().decode()
        self.status = int(status_line.split()[1])
        while self.file.readline() not in (b"\r\n", b""):
            pass  # headers

    def next_event(self) -> str | None:
        """The next ``data:`` payload, None at the end of the stream (chunked framing skipped)."""
        while True:
            line = self.file.readline()
            if not line:
                return None
            line = line.decode().strip()
            if line.startswith("data: "):
                return line.removeprefix("data: ")

    def close(self) -> None:
        self.file.close()
        self.sock.close()
