"""``--auth-token-file`` parsing and reload (``TokenTable``), the ``Authenticator``'s refusals, and the
flag errors of ``baton router`` / ``baton serve`` / ``baton loadtest`` / ``--token-file``, without a
server."""

import os

import pytest

from cli.main import main
from cli.token_file import read_token_file
from router.auth_tokens import Caller, TokenFileError, TokenTable, parse_token_file
from router.authentication import Authenticator, AuthRefused


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write(path, text: str) -> str:
    """Replace ``path`` atomically, as an operator should."""
    staged = f"{path}.new"
    with open(staged, "w") as file:
        file.write(text)
    os.replace(staged, path)
    return str(path)


def test_tokens_tenants_comments_and_blank_lines(tmp_path):
    path = write(
        tmp_path / "tokens", "# ops team\n\n  alpha-token  \nbeta-token\tacme\n   # indented comment\n"
    )
    table = TokenTable(path)
    assert len(table) == 2
    assert table.lookup("alpha-token") == Caller("")
    assert table.lookup("beta-token") == Caller("acme")
    assert table.lookup("beta-toke") is None and table.lookup("") is None and table.lookup("acme") is None


@pytest.mark.parametrize(
    "text, says",
    [
        ("ok-token\nbad-token acme extra\n", "line 2: expected 'TOKEN' or 'TOKEN TENANT', got 3 fields"),
        ("ok-token # trailing comment\n", "line 1: expected 'TOKEN' or 'TOKEN TENANT', got 4 fields"),
        ("# c\ntoken-é\n", "line 2: the token must be printable ASCII without spaces"),
        ("a-token\n\nb-token x\na-token y\n", "line 4: the same token as line 1"),
        ("t " + "x" * 257 + "\n", "line 1: the tenant is longer than 256 characters"),
        ("# only comments\n\n", "holds no token"),
    ],
    ids=["three-fields", "inline-comment", "non-ascii", "duplicate", "long-tenant", "empty"],
)
def test_a_bad_file_is_an_error_naming_the_file_and_line(tmp_path, text, says):
    path = write(tmp_path / "tokens", text)
    with pytest.raises(TokenFileError) as error:
        parse_token_file(path)
    message = str(error.value)
    assert message.startswith(f"--auth-token-file: {path}") and says in message
    assert "a-token" not in message and "bad-token" not in message  # never the token itself


def test_a_missing_file_is_an_error_naming_the_flag(tmp_path):
    with pytest.raises(TokenFileError, match=r"--auth-token-file: cannot read .*absent"):
        TokenTable(str(tmp_path / "absent"))


def test_reload_at_most_once_per_interval_keeping_the_old_tokens_on_error(tmp_path):
    clock, failures = Clock(), []
    path = write(tmp_path / "tokens", "old-token\n")
    table = TokenTable(path, on_reload_error=lambda: failures.append(1), clock=clock)
    write(path, "new-token acme\n")
    clock.now = 0.5  # within the interval: the file is not looked at
    assert table.lookup("old-token") == Caller("") and table.lookup("new-token") is None
    clock.now = 1.0
    assert table.lookup("old-token") is None and table.lookup("new-token") == Caller("acme")
    write(path, "new-token acme\nnew-token beta\n")  # a duplicate: refused, the table stays
    clock.now = 2.0
    assert table.lookup("new-token") == Caller("acme") and failures == [1]
    clock.now = 3.0  # the same broken file is reported once, not at every check
    assert table.lookup("new-token") == Caller("acme") and failures == [1]
    os.remove(path)
    clock.now = 4.0
    assert table.lookup("new-token") == Caller("acme") and failures == [1, 1]
    write(path, "third-token\n")
    clock.now = 5.0
    assert table.lookup("third-token") == Caller("") and table.lookup("new-token") is None


def test_the_authenticator_names_what_is_wrong_and_counts_refusals(tmp_path):
    reasons = []
    authenticator = Authenticator(TokenTable(write(tmp_path / "t", "tok-1\ntok-2 acme\n")), reasons.append)
    for value, reason, says in (
        (None, "missing", "authorization: missing"),
        ("", "missing", "authorization: missing"),
        ("tok-1", "malformed", "expected 'Bearer <token>'"),
        ("Bearer ", "malformed", "expected 'Bearer <token>'"),
        ("Bearer tok-3", "invalid", "the bearer token is not valid"),
    ):
        with pytest.raises(AuthRefused) as error:
            authenticator.authenticate(value)
        assert error.value.reason == reason and says in error.value.message and error.value.unauthenticated
    assert authenticator.authenticate("bearer  tok-2 ") == Caller("acme")  # the scheme is case-insensitive
    assert authenticator.tenant(Caller("acme"), "", "tenant") == "acme"
    assert authenticator.tenant(Caller("acme"), "acme", "tenant") == "acme"
    assert authenticator.tenant(Caller(""), "anyone", "tenant") == "anyone"
    with pytest.raises(AuthRefused) as error:
        authenticator.tenant(Caller("acme"), "beta", "X-Tenant")
    assert (
        error.value.message.startswith("X-Tenant: 'beta' is not the tenant")
        and not error.value.unauthenticated
    )
    assert reasons == ["missing", "missing", "malformed", "malformed", "invalid", "tenant"]


def test_token_file_flag_reads_the_first_token(tmp_path):
    assert read_token_file(None) is None
    assert read_token_file(write(tmp_path / "a", "\n# mine\n  tok-a  acme\ntok-b\n")) == "tok-a"
    assert read_token_file(write(tmp_path / "b", "tok-b\n")) == "tok-b"
    with pytest.raises(ValueError, match=r"^--token-file: .* holds no token"):
        read_token_file(write(tmp_path / "c", "# nothing\n\n"))
    with pytest.raises(ValueError, match=r"^--token-file: cannot read"):
        read_token_file(str(tmp_path / "absent"))


def test_commands_name_the_bad_file(tmp_path, capsys):
    bad = write(tmp_path / "bad", "tok-1\ntok-1\n")
    assert main(["router", "--model", str(tmp_path), "--decode", "127.0.0.1:1", "--colocated",
                 "--auth-token-file", bad]) == 2  # fmt: skip
    assert f"--auth-token-file: {bad} line 2: the same token as line 1" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path), "--auth-token-file", bad]) == 2
    assert f"--auth-token-file: {bad} line 2" in capsys.readouterr().err
    absent = str(tmp_path / "absent")
    loadtest = ["loadtest", "--target", "grpc://127.0.0.1:1", "--out", str(tmp_path / "out")]
    assert main([*loadtest, "--workload", "synthetic", "--token-file", absent]) == 2
    assert f"error: --token-file: cannot read {absent}" in capsys.readouterr().err
