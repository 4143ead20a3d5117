"""A fixed list of workers (``baton serve``, or addresses given on the command line)."""

from .base import Discovery, OnChange


class StaticDiscovery(Discovery):
    """The addresses it was given, reported once from ``start`` (before it returns).

    Args:
        prefill: ``host:port`` of each prefill worker.
        decode: ``host:port`` of each decode worker.
    """

    def __init__(self, prefill: list[str], decode: list[str]):
        self.prefill = list(prefill)
        self.decode = list(decode)

    def start(self, on_change: OnChange) -> None:
        on_change(list(self.prefill), list(self.decode))

    def stop(self) -> None:
        pass
