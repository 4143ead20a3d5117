"""Work to do when a server-side gRPC call ends (finished, failed, cancelled or past its deadline).

``context.add_callback`` has two traps this helper closes:

- it returns False, and never calls the callback, when the call has already ended: a cancellation
  that arrived before the callback was registered would otherwise be missed (a leaked reservation);
- the callback runs on the server's event thread, which every other call of the process also needs:
  a callback that waits (an RPC, an engine step) stalls health checks and unrelated calls. Callbacks
  given here must only hand work off (cancel a call, queue a command), never wait for it.
"""

from collections.abc import Callable

import grpc


def when_call_ends(context: grpc.ServicerContext, callback: Callable[[], object]) -> None:
    """Run ``callback`` when the call behind ``context`` ends, or now if it already has.

    ``callback`` must not block: it runs on gRPC's event thread (or the caller's, when the call is over).
    """
    if not context.add_callback(callback):
        callback()
