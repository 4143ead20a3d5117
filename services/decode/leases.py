"""Reservation leases: a decode reservation lives as long as the caller's ``Reserve`` stream.

    Reserve stream open ──► reservation held ──► Decode call claims it   (the Decode stream owns it)
                                    │
                                    └─► caller gone / Release / TTL  (freed by the releaser)

Exactly one party ends a lease (``end`` returns True to it alone), and that party decides what
happens to the reservation; the others find it already ended and do nothing. Every method is
non-blocking, so a gRPC cancellation callback may call ``end``.
"""

import secrets
import threading
from enum import Enum


class LeaseEnd(Enum):
    CLAIMED = "claimed"  # a Decode call took the reservation over
    CALLER_GONE = "caller_gone"  # the Reserve stream ended first (cancel, deadline, router gone)
    RELEASED = "released"  # the router released it (Release)
    EXPIRED = "expired"  # the reservation TTL freed it


class Lease:
    """One reservation's lease. ``may_have_reached_caller``: the response was (or is being) sent, so a
    prefill worker may have been told where to write. ``capability``: the reservation's one-time random
    token (``handoff.handoff_tag``, the checksum's key). ``local``: the request as a ``LocalPrefill``
    message, for prefilling it here when its handoff is refused (set by the servicer)."""

    def __init__(self):
        self.may_have_reached_caller = False
        self.capability = secrets.token_hex(16)
        self.local = None
        self.end: LeaseEnd | None = None
        self._ended = threading.Event()

    def wait(self) -> LeaseEnd:
        """Block (the Reserve handler's thread) until the lease ends; returns how it ended."""
        self._ended.wait()
        return self.end


class Leases:
    """The open leases of one decode worker, by request id."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict[str, Lease] = {}

    def open(self, request_id: str) -> Lease:
        """A new open lease for a reservation just made.

        Raises:
            ValueError: ``request_id`` already has an open lease (ids are the router's, unique).
        """
        with self._lock:
            if request_id in self._open:
                raise ValueError(f"request_id: {request_id!r} already holds a reservation here")
            lease = self._open[request_id] = Lease()
            return lease

    def end(self, request_id: str, how: LeaseEnd) -> Lease | None:
        """End ``request_id``'s lease ``how``; returns the lease if this call ended it, else None
        (no such lease, or someone else ended it first)."""
        with self._lock:
            lease = self._open.pop(request_id, None)
        if lease is not None:
            lease.end = how
            lease._ended.set()
        return lease

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
