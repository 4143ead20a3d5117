"""``SharedTransfer``: handoffs of different requests into one worker (and out of one) run in parallel,
writes of one request one after the other, and every row lands bit-exact.

Each write is slowed inside the backend, where the bytes would be in flight (NIXL: while the sender
waits for its posted transfer; gRPC bytes: between two streamed chunks, with the receiver's call
open), so a lock held across a write shows as the second write starting after the first ended.
"""

import threading
import time

import pytest
import torch

from common.errors import TransferError
from services.transfer import BLOCKS, make_backend
from services.transfer.backend import Notification
from services.transfer.inbox import SharedTransfer
from tests.transfer.receiver_peer import sentinel

ROWS, ROW_BYTES = 8, 256
DELAY_S = 0.6
PLANS = {"handoff-a": [(0, 4), (1, 5)], "handoff-b": [(2, 0), (3, 1)]}


def slow_down(backend, seconds: float) -> None:
    """Make each of ``backend``'s writes spend ``seconds`` with its bytes in flight."""
    if backend.name == "nixl":
        wait = backend._wait

        def slow_wait(*args):
            time.sleep(seconds)
            return wait(*args)

        backend._wait = slow_wait
    else:
        requests = backend._requests

        def slow_requests(*args):
            for index, message in enumerate(requests(*args)):
                if index == 1:
                    time.sleep(seconds)
                yield message

        backend._requests = slow_requests


@pytest.fixture(params=["grpc_bytes", "nixl"])
def link(request):
    """``(inbox, outbox, peer, target, source)``: one receiving and one sending ``SharedTransfer``."""
    receiver = make_backend(request.param, f"decode-par-{request.param}")
    sender = make_backend(request.param, f"prefill-par-{request.param}")
    target = sentinel((ROWS, ROW_BYTES), 3)
    source = torch.randint(
        0, 256, (ROWS, ROW_BYTES), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    receiver.register(BLOCKS, target)
    sender.register(BLOCKS, source)
    slow_down(sender, DELAY_S)
    inbox, outbox = SharedTransfer(receiver), SharedTransfer(sender)
    try:
        peer = outbox.connect(inbox.endpoint())
        yield inbox, outbox, peer, target, source
    finally:
        outbox.close()
        inbox.close()


def write_at_once(outbox, peer, plans: list[tuple[str, list]]) -> list[tuple[float, float]]:
    """Start every ``(message, rows)`` write on its own thread; their ``(start, end)`` times."""
    spans: list = [None] * len(plans)
    errors: list = []
    ready = threading.Barrier(len(plans))

    def write(index: int, message: str, rows) -> None:
        ready.wait()
        start = time.monotonic()
        try:
            outbox.write(peer, {BLOCKS: rows}, message=message, timeout_s=30)
        except Exception as error:  # surfaced below, on the test's thread
            errors.append(error)
        spans[index] = (start, time.monotonic())

    threads = [threading.Thread(target=write, args=(i, m, r)) for i, (m, r) in enumerate(plans)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return spans


def test_two_handoffs_into_one_worker_overlap_and_land_bit_exact(link):
    inbox, outbox, peer, target, source = link
    expected = target.clone()
    for rows in PLANS.values():
        for local, remote in rows:
            expected[remote] = source[local]
    spans = write_at_once(outbox, peer, list(PLANS.items()))
    (start_a, end_a), (start_b, end_b) = spans
    assert max(start_a, start_b) < min(end_a, end_b), f"the writes did not overlap: {spans}"
    assert max(end_a, end_b) - min(start_a, start_b) < 1.8 * DELAY_S, "the second write waited for the first"
    for message in PLANS:
        inbox.wait(message, timeout_s=10)
    assert torch.equal(target, expected)  # every written row exact, every other row untouched


def test_two_writes_of_one_request_run_one_after_the_other(link):
    inbox, outbox, peer, target, source = link
    rows = PLANS["handoff-a"]
    spans = write_at_once(outbox, peer, [("again", rows), ("again", rows)])
    (start_1, end_1), (start_2, end_2) = spans
    assert max(end_1, end_2) - min(start_1, start_2) >= 2 * DELAY_S, f"they overlapped: {spans}"
    inbox.wait("again", timeout_s=10)
    for local, remote in rows:
        assert torch.equal(target[remote], source[local])


class Notifying:
    """A backend stand-in whose peers' notifications arrive once, on the first poll."""

    name = "fake"

    def __init__(self, messages: list[str]):
        self.pending = [Notification("prefill-a", message) for message in messages]

    def poll_notifications(self) -> list[Notification]:
        arrived, self.pending = self.pending, []
        return arrived

    def close(self) -> None:
        pass


def test_notifications_nobody_waits_for_are_dropped():
    """A notification no one waited for within ``stale_after_s`` goes (its request is gone), a fresh one
    stays for its waiter; ``discard`` forgets a handoff's earlier parts at once."""
    inbox = SharedTransfer(Notifying(["r1/cap#0", "r1/cap#1", "r2/cap", "left/cap"]), stale_after_s=1000)
    try:
        assert inbox.wait("r2/cap", 5) == ["prefill-a"]  # every notification has arrived by now
        inbox.discard("r1/cap#")
        assert sorted(inbox._arrived) == ["left/cap"]
        inbox._drop_stale(time.monotonic())  # fresh: kept
        assert sorted(inbox._arrived) == ["left/cap"]
        inbox._drop_stale(time.monotonic() + 1000)  # as the poller would after stale_after_s
        assert inbox._arrived == {} and inbox._arrived_at == {}
        with pytest.raises(TransferError):
            inbox.wait("left/cap", 0.05)
    finally:
        inbox.close()
