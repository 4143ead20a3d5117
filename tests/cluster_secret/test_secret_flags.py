"""``--cluster-secret-file`` on ``baton worker``, ``router``, ``cache`` and ``serve``: a file that cannot
be used stops the command before anything starts, with an error naming the flag and the file (never the
secret); ``write_cluster_secret`` makes a private file."""

import stat

import pytest

from cli.main import main
from common.cluster_secret import read_cluster_secret, write_cluster_secret

BAD_FILES = {
    "missing": (None, "cannot read"),
    "empty": (" \n\n", "is empty"),
    "short": ("s3cret-but-only-31-characters-x\n", "has 31 characters; it needs at least 32"),
    "inner-space": ("a" * 20 + " " + "b" * 20, "whitespace or control characters"),
}


def commands(model: str) -> dict[str, list[str]]:
    return {
        "worker": ["worker", "--role", "decode", "--model", model, "--transfer-backend", "grpc_bytes"],
        "router": ["router", "--model", model, "--decode", "127.0.0.1:1", "--colocated"],
        "cache": ["cache", "--kv-gib", "0.001", "--port", "0"],
        "serve": ["serve", "--model", model, "--no-redis", "--port", "0"],
    }


@pytest.mark.parametrize("command", ["worker", "router", "cache", "serve"])
@pytest.mark.parametrize("bad", list(BAD_FILES))
def test_a_bad_secret_file_is_an_error_naming_the_flag(command, bad, tmp_path, tiny_checkpoint, capsys):
    text, message = BAD_FILES[bad]
    path = tmp_path / "cluster-secret"
    if text is not None:
        path.write_text(text)
    argv = [*commands(str(tiny_checkpoint("k3")))[command], "--cluster-secret-file", str(path)]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"baton {command}: error: --cluster-secret-file: ") and str(path) in error
    assert message in error
    if text is not None and text.strip():
        assert text.strip() not in error


def test_a_written_secret_is_private_random_and_read_back(tmp_path):
    first = write_cluster_secret(tmp_path / "a")
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    secret = read_cluster_secret(first)
    assert len(secret) >= 32 and secret != read_cluster_secret(write_cluster_secret(tmp_path / "b"))
    with pytest.raises(FileExistsError):
        write_cluster_secret(first)  # never overwrites
    (tmp_path / "padded").write_text(f"\n  {secret}\t\n")
    assert read_cluster_secret(tmp_path / "padded") == secret
