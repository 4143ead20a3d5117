"""PEM files given on the command line, read and checked at start: errors name the flag and the file,
never a stack trace (the router's public TLS, ``router/tls.py``, and the processes' internal mutual TLS,
``common/internal_tls.py``, share them)."""

import ssl


class TlsFileError(ValueError):
    """A TLS flag that is missing its pair, unreadable or does not load; the message names the flag."""


def read_pem(path: str, flag: str) -> bytes:
    """The bytes of ``path``.

    Raises:
        TlsFileError: naming ``flag``: the file cannot be read.
    """
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise TlsFileError(f"{flag}: cannot read {path} ({error.strerror or error})") from None


def check_certificates(pem: bytes, flag: str, path: str) -> None:
    """TlsFileError naming ``flag`` unless ``pem`` holds at least one PEM certificate that loads."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise TlsFileError(f"{flag}: {path} holds no usable PEM certificate ({reason})") from None


def check_key_pair(cert: str, key: str, cert_flag: str, key_flag: str) -> None:
    """TlsFileError naming ``key_flag`` unless ``key`` is the unencrypted PEM private key of ``cert``
    (a certificate that loads: ``check_certificates`` first)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=no_password)
    except _EncryptedKey:
        raise TlsFileError(f"{key_flag}: {key} is encrypted; give the key unencrypted (PEM)") from None
    except ssl.SSLError as error:  # the certificate loads (checked before): the key is at fault
        if "KEY_VALUES_MISMATCH" in str(error):
            raise TlsFileError(f"{key_flag}: {key} is not the private key of {cert_flag} {cert}") from None
        reason = error.reason or error
        raise TlsFileError(f"{key_flag}: {key} holds no usable PEM private key ({reason})") from None


class _EncryptedKey(Exception):
    pass


def no_password() -> bytes:
    """Called by ssl only for an encrypted key: refuse it rather than prompt on the terminal."""
    raise _EncryptedKey
