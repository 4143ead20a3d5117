"""Bearer-token flags: the router's ``--auth-token-file`` (``add_auth_token_file_flag``), and
``--token-file``, the token a client command sends to such a router (``read_token_file``).

A ``--token-file`` token is the first field of the file's first line that is neither blank nor a
``#`` comment, so a one-token file (``echo TOKEN > f``) and the router's own token file (``TOKEN
[TENANT]`` lines) both work; the rest of the file is ignored. The token never appears in output or
reports.
"""

import argparse


def add_auth_token_file_flag(parser: argparse.ArgumentParser) -> None:
    """``--auth-token-file`` on a command that runs the router (``baton router``, ``baton serve``)."""
    parser.add_argument(
        "--auth-token-file",
        default="",
        metavar="FILE",
        help="bearer tokens of the public API, one a line, optionally 'TOKEN TENANT'; reloaded on change "
        "(docs/authentication.md; default: no authentication)",
    )


def read_token_file(path: str | None, flag: str = "--token-file") -> str | None:
    """The token in ``path`` (None when no file was given).

    Raises:
        ValueError: naming ``flag``, when the file cannot be read or holds no token.
    """
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{flag}: cannot read {path} ({error})") from None
    for line in lines:
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            return fields[0]
    raise ValueError(f"{flag}: {path} holds no token (every line is blank or a # comment)")
