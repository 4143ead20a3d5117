"""``baton COMMAND`` imports only that command's module: a worker or a rank process (``python -m cli.main
worker``, ``generate``) does not pay every other command's imports at each start; help and a mistyped
command still see every command."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import COMMANDS, main, named_command

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv, command",
    [
        (["worker", "--config", "w.yaml"], "worker"),
        (["--log-level", "info", "generate", "--model", "m"], "generate"),
        (["--log-level=debug", "loadtest-compare"], "loadtest-compare"),
        (["--help"], None),
        (["-h", "worker"], None),
        (["wroker"], None),
        ([], None),
    ],
    ids=["plain", "log-level", "log-level-equals", "help", "help-first", "mistyped", "empty"],
)
def test_the_named_command_is_read_from_the_arguments_head(argv, command):
    assert named_command(argv) == command


def test_a_command_runs_with_only_its_module_imported():
    script = (
        "import sys\nfrom cli.main import main\n"
        "try:\n    main(['--log-level', 'error', 'checkpoint', 'init', '--help'])\n"
        "except SystemExit as done:\n    assert done.code == 0\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('cli.') and m.endswith('_command'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "usage: baton checkpoint init" in result.stdout
    assert result.stdout.splitlines()[-1] == "cli.checkpoint_command"  # the only command module imported


def test_help_and_a_mistyped_command_see_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert all(command in listed for command in COMMANDS)
    with pytest.raises(SystemExit) as exited:
        main(["wroker"])
    assert exited.value.code == 2
    assert "invalid choice: 'wroker'" in capsys.readouterr().err
