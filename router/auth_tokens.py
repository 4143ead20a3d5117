"""``TokenTable``: the bearer tokens of ``--auth-token-file``, compared in constant time, reloaded on change.

The file holds one token a line, optionally followed by the tenant the token binds::

    # a comment line (blank lines are ignored too)
    3f9c0b2e7d41a5c6...
    8a1d55c0e2b7f9d0...  acme

The second token makes its requests tenant ``acme``; the first binds none. A line is one or two
fields, nothing more (no comment after a token).

A token is printable ASCII without spaces (it travels in an HTTP header and gRPC metadata). A line
with more than two fields, a bad token or tenant, or a token listed twice is a ``TokenFileError``
naming the file and the line (never the token).

Reload: ``lookup`` checks the file's identity (mtime, size, inode) at most once every
``check_interval_s`` (default 1 s) on the request path, no watcher thread. A changed file is read
again; if it does not parse (or is gone) the previous tokens stay, the error is logged once per
change and ``on_reload_error`` is called (the router counts it in a metric). Replace the file
atomically (write a new one, then rename it over) so a reader never sees half of it.
"""

import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.limits import MAX_LABEL_CHARS

log = logging.getLogger(__name__)

DEFAULT_CHECK_INTERVAL_S = 1.0


class TokenFileError(ValueError):
    """An ``--auth-token-file`` that cannot be read or parsed; the message names the file and line."""


@dataclass(frozen=True)
class Caller:
    """Who a valid token says the caller is. ``tenant``: the tenant the token binds ("": none)."""

    tenant: str


@dataclass(frozen=True)
class _Entry:
    digest: bytes  # SHA-256 of the token: every comparison is over 32 bytes, whatever was presented
    caller: Caller


def parse_token_file(path: str) -> tuple[_Entry, ...]:
    """The entries of the token file at ``path``.

    Raises:
        TokenFileError: unreadable, not UTF-8, a malformed line or a duplicate token (naming the line),
            or no token at all.
    """
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TokenFileError(f"--auth-token-file: cannot read {path} ({error})") from None
    entries: list[_Entry] = []
    first_line: dict[bytes, int] = {}
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"--auth-token-file: {path} line {number}"
        if len(fields) > 2:
            raise TokenFileError(f"{where}: expected 'TOKEN' or 'TOKEN TENANT', got {len(fields)} fields")
        token = fields[0]
        if not all(0x21 <= ord(char) <= 0x7E for char in token):
            raise TokenFileError(f"{where}: the token must be printable ASCII without spaces")
        tenant = fields[1] if len(fields) == 2 else ""
        if len(tenant) > MAX_LABEL_CHARS:
            raise TokenFileError(f"{where}: the tenant is longer than {MAX_LABEL_CHARS} characters")
        digest = hashlib.sha256(token.encode()).digest()
        if digest in first_line:
            raise TokenFileError(f"{where}: the same token as line {first_line[digest]}")
        first_line[digest] = number
        entries.append(_Entry(digest, Caller(tenant)))
    if not entries:
        raise TokenFileError(f"--auth-token-file: {path} holds no token (every request would be refused)")
    return tuple(entries)


class TokenTable:
    """The tokens of one file, reloaded when it changes.

    Args:
        path: the ``--auth-token-file``; read here, so a bad file fails at start (TokenFileError).
        check_interval_s: the least time between two checks of the file on the request path.
        on_reload_error: called (no arguments) each time a changed file fails to load.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        path: str,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        on_reload_error: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.path = path
        self.check_interval_s = check_interval_s
        self._on_reload_error = on_reload_error
        self._clock = clock
        self._lock = threading.Lock()
        self._identity = self._file_identity()
        self._entries = parse_token_file(path)
        self._checked_at = clock()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token: str) -> Caller | None:
        """The caller ``token`` names, or None when no line holds it.

        Every entry is compared (``hmac.compare_digest`` on SHA-256 digests), match or not, so the
        time taken says nothing about which token, or how much of one, was right."""
        self._reload_if_changed()
        presented = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found = None
        for entry in self._entries:
            if hmac.compare_digest(entry.digest, presented) and found is None:
                found = entry.caller
        return found

    def _reload_if_changed(self) -> None:
        now = self._clock()
        if now - self._checked_at < self.check_interval_s:
            return
        with self._lock:
            if now - self._checked_at < self.check_interval_s:
                return  # another request checked meanwhile
            self._checked_at = now
            identity = self._file_identity()
            if identity == self._identity:
                return
            self._identity = identity  # a file that fails is reported once, not at every check
            try:
                entries = parse_token_file(self.path)
            except TokenFileError as error:
                log.error("%s; keeping the %d tokens loaded before", error, len(self._entries))
                self._on_reload_error()
                return
            self._entries = entries
            log.info("--auth-token-file: reloaded %s (%d tokens)", self.path, len(entries))

    def _file_identity(self) -> tuple[int, int, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino
