"""The failures that cross a process boundary: raised in a worker or the router, mapped to one gRPC
status code each by ``common/rpc/errors.py`` (and back to a typed error by the SDK)."""


class NoCapacity(RuntimeError):
    """No room right now: a worker has no seat, blocks or state slot for a reservation, or the router's
    queue is full. RESOURCE_EXHAUSTED: try another worker, or later."""


class InUse(RuntimeError):
    """A change refused because something in flight still uses its object (unloading a LoRA adapter
    that a request is using). FAILED_PRECONDITION: retry once it is done."""


class TransferError(RuntimeError):
    """A transfer (or the peer behind it) could not be set up or did not complete; the message names
    what failed. UNAVAILABLE."""
