"""The cluster secret: one credential shared by a cluster's routers, workers and ``baton cache`` tiers.

Every internal gRPC call carries it as metadata ``x-baton-cluster-secret``; a server started with it
refuses calls without it (``common/rpc/cluster_secret_interceptor.py``). It is read from a file
(``--cluster-secret-file``) holding one secret of at least ``MIN_SECRET_CHARS`` printable characters,
surrounding whitespace stripped. The secret never appears in a log line or an error message.
"""

import hmac
import os
import secrets
from pathlib import Path

METADATA_KEY = "x-baton-cluster-secret"
MIN_SECRET_CHARS = 32
FLAG = "--cluster-secret-file"


def read_cluster_secret(path: str | Path, flag: str = FLAG) -> str:
    """The secret in ``path``, whitespace stripped.

    Raises:
        ValueError: naming ``flag`` and the file (never the secret): the file cannot be read, is
            empty, is shorter than ``MIN_SECRET_CHARS``, or holds whitespace or non-printable
            characters inside the secret (it travels as gRPC metadata).
    """
    try:
        text = Path(path).read_text(encoding="ascii")
    except UnicodeDecodeError:
        raise ValueError(
            f"{flag}: {path} holds non-ASCII bytes; the secret must be printable ASCII"
        ) from None
    except OSError as error:
        raise ValueError(f"{flag}: cannot read {path}: {error.strerror or error}") from None
    secret = text.strip()
    if not secret:
        raise ValueError(
            f"{flag}: {path} is empty; write one secret of at least {MIN_SECRET_CHARS} characters"
        )
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(
            f"{flag}: the secret in {path} has {len(secret)} characters; it needs at least "
            f"{MIN_SECRET_CHARS} "
            '(make one with: python -c "import secrets; print(secrets.token_urlsafe(32))")'
        )
    if not all("!" <= char <= "~" for char in secret):
        raise ValueError(f"{flag}: the secret in {path} has whitespace or control characters inside it")
    return secret


def write_cluster_secret(path: str | Path) -> Path:
    """Write a fresh random secret (``secrets.token_urlsafe(32)``) into a new file only its owner can
    read (mode 0600, created so; an existing file is an error). Returns the path."""
    path = Path(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        file.write(secrets.token_urlsafe(32) + "\n")
    return path


def secret_matches(presented: str | bytes | None, secret: str) -> bool:
    """Whether ``presented`` is ``secret``, compared in constant time (no early exit on a prefix)."""
    if presented is None:
        return False
    if isinstance(presented, str):
        presented = presented.encode("utf-8", errors="replace")
    return hmac.compare_digest(presented, secret.encode("ascii"))
