"""The ``Discovery`` interface: a source of the router's worker addresses."""

from abc import ABC, abstractmethod
from collections.abc import Callable

OnChange = Callable[[list[str], list[str]], None]
"""``on_change(prefill_addresses, decode_addresses)``: the full current sets, ``host:port`` each."""


class Discovery(ABC):
    """Tells the router which prefill and decode workers exist, now and whenever that changes.

    ``start(on_change)`` begins; ``on_change`` is then called with the full address lists (never a
    delta) each time they change, from any thread but never two calls at once. ``stop()`` ends it;
    no call follows its return. A source that cannot reach its backend keeps retrying and logs: it
    never raises into the router after ``start``.
    """

    @abstractmethod
    def start(self, on_change: OnChange) -> None:
        """Begin reporting addresses to ``on_change``."""

    @abstractmethod
    def stop(self) -> None:
        """Stop reporting; idempotent."""
