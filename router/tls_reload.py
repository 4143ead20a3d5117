"""``ReloadingTls``: the router's TLS files, reloaded when they change, without a restart (a certificate
rotated by cert-manager, or by hand, is served to the next client that connects).

Both public ports ask at each handshake: gRPC through dynamic server credentials (its fetcher returns the
new configuration, or None for "unchanged"), the OpenAI HTTP port through its ``SSLContext``'s SNI
callback, which hands the connection the current context. The files' identity (mtime, size, inode of
each) is checked at most once every ``check_interval_s``; changed files are read and checked again as at
start (``tls.server_tls``). Files that do not load (a half-written pair, a key that is not the
certificate's) leave the previous certificate in place: the error is logged once per change and
``on_reload_error`` is called (the router counts it). Write the new files next to the old ones and
rename them over (a Kubernetes Secret volume swaps its folder the same way).
"""

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable

import grpc

from .tls import ServerTls, TlsFileError, server_tls

log = logging.getLogger(__name__)

FileIdentity = tuple[tuple[int, int, int] | None, ...]


class ReloadingTls:
    """The router's ``ServerTls``, reloaded on change (see the module docstring).

    Args:
        tls: the files as read and checked at start.
        check_interval_s: the longest a handshake goes without looking at the files.
        on_reload_error: called (no arguments) each time changed files fail to load.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        tls: ServerTls,
        check_interval_s: float = 1.0,
        on_reload_error: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.current = tls
        self.check_interval_s = check_interval_s
        self._on_reload_error = on_reload_error
        self._clock = clock
        self._lock = threading.Lock()
        self._identity = self._files_identity()
        self._checked_at = clock()
        self._served: ServerTls | None = tls  # what gRPC's fetcher last handed out
        self._http_context = tls.ssl_context()

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """The public gRPC port's credentials: the current certificate at every handshake."""
        return grpc.dynamic_ssl_server_credentials(
            _grpc_configuration(self.current),
            self._grpc_fetch,
            require_client_authentication=self.current.mutual,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The OpenAI HTTP port's context: its SNI callback (called at every handshake, with or without
        a server name) hands the connection the current context."""
        context = self.current.ssl_context()
        context.sni_callback = self._sni
        return context

    def reload_if_changed(self) -> bool:
        """Read the files again if they changed since the last look (at most once a
        ``check_interval_s``); returns whether a new certificate is now current."""
        now = self._clock()
        if now - self._checked_at < self.check_interval_s:
            return False
        with self._lock:
            if now - self._checked_at < self.check_interval_s:
                return False  # another handshake looked meanwhile
            self._checked_at = now
            identity = self._files_identity()
            if identity == self._identity:
                return False
            self._identity = identity  # files that fail are reported once, not at every handshake
            old = self.current
            try:
                fresh = server_tls(old.cert, old.key, old.client_ca)
                context = fresh.ssl_context()
            except TlsFileError as error:
                log.error(
                    "TLS files changed but do not load: %s; keeping the certificate loaded before", error
                )
                self._on_reload_error()
                return False
            self.current, self._http_context = fresh, context
            log.info("TLS: reloaded %s and %s", old.cert, old.key)
            return True

    def _grpc_fetch(self) -> grpc.ServerCertificateConfiguration | None:
        self.reload_if_changed()
        with self._lock:
            if self._served is self.current:
                return None  # unchanged: gRPC keeps the configuration it has
            self._served = self.current
            return _grpc_configuration(self.current)

    def _sni(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        self.reload_if_changed()
        connection.context = self._http_context

    def _files_identity(self) -> FileIdentity:
        paths = [self.current.cert, self.current.key] + (
            [self.current.client_ca] if self.current.client_ca else []
        )
        return tuple(_identity(path) for path in paths)


def _grpc_configuration(tls: ServerTls) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(tls.key_pem, tls.cert_pem)], root_certificates=tls.client_ca_pem
    )


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino
