"""The client interface drivers use: one streamed generation filling one ``RequestRecord``."""

import abc
import asyncio

from loadtest.records import RequestRecord


class Client(abc.ABC):
    """Sends one generation and fills its record; created and used inside one event loop.

    Timing: the driver sets ``record.start_s`` (run clock) just before awaiting ``generate``; the
    client stamps every later time as ``record.start_s`` plus the loop time elapsed since the call
    began, so clients need no shared clock. Use as ``async with client: ...`` or ``await close()``.
    """

    @abc.abstractmethod
    async def generate(
        self, prompt_ids: tuple[int, ...], max_tokens: int, session_id: str, record: RequestRecord
    ) -> None:
        """Stream one generation (greedy, EOS ignored) and fill ``record``.

        Fills ``token_times_s`` (one entry per output token; the tokens of one streamed message
        share its arrival time), ``output_tokens``, ``cached_tokens``, ``end_s`` and, on failure,
        ``error`` as ``"CODE: details"`` (gRPC status code names; HTTP statuses are mapped to them).
        Never raises for a server or connection error. Cancelling the task cancels the request on
        the server and propagates ``CancelledError`` (the record is left without ``end_s``).
        """

    async def close(self) -> None:  # noqa: B027 (optional: a client may hold nothing)
        """Release connections (calls still running are cancelled)."""

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


class Stamper:
    """Run-clock times for one call: ``record.start_s`` plus the loop time elapsed since creation."""

    def __init__(self, record: RequestRecord):
        self._loop = asyncio.get_running_loop()
        self._began = self._loop.time()
        self._start_s = record.start_s

    def now(self) -> float:
        return self._start_s + (self._loop.time() - self._began)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters (error details go into CSV cells)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
