"""A progress line on stderr: tqdm when it is installed, else plain ``\\r`` text.

One bar per window (sweep level): requests finished, of ``--max-requests`` when given, with the
counts of errors and cached tokens so far. ``Progress(enabled=False)`` prints nothing (tests).
"""

import sys
import time
from typing import TextIO

from loadtest.records import RequestRecord

try:  # optional: never a dependency of Baton
    from tqdm import tqdm
except ImportError:  # pragma: no cover - depends on the environment
    tqdm = None

_PLAIN_EVERY_S = 0.1  # at most ten plain-text redraws a second


class Progress:
    """Shows how a run is going.

    Args:
        enabled: False prints nothing.
        stream: where to draw (stderr by default).
        use_tqdm: None uses tqdm when it can be imported.
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, use_tqdm: bool | None = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.use_tqdm = (tqdm is not None) if use_tqdm is None else (use_tqdm and tqdm is not None)
        self._bar = None
        self._label = ""
        self._total: int | None = None
        self._done = self._errors = self._cached = 0
        self._drawn_at = 0.0

    def start(self, label: str, total: int | None) -> None:
        """Begin a window's bar (``total``: requests expected, None when unknown)."""
        self.finish()
        self._label, self._total = label, total
        self._done = self._errors = self._cached = 0
        if self.enabled and self.use_tqdm:
            self._bar = tqdm(total=total, desc=label, unit="req", file=self.stream, leave=True)
        self._draw(force=True)

    def update(self, record: RequestRecord) -> None:
        """Count one finished request."""
        self._done += 1
        self._errors += record.error is not None
        self._cached += record.cached_tokens
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(errors=self._errors, cached_tokens=self._cached, refresh=False)
        self._draw()

    def finish(self) -> None:
        """End the current bar (a newline after plain text)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self._label:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
        self._label = ""

    def _draw(self, force: bool = False) -> None:
        if not self.enabled or self._bar is not None or not self._label:
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < _PLAIN_EVERY_S:
            return
        self._drawn_at = now
        of = f"/{self._total}" if self._total is not None else ""
        self.stream.write(
            f"\r{self._label}: {self._done}{of} requests, {self._errors} errors, {self._cached} cached tokens"
        )
        self.stream.flush()
