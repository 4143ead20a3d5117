"""``baton bench fuzz`` against a running router (``--target`` / ``--http-target``), and its refusal
of targets that are not loopback addresses."""

from cli.main import main


def test_bench_fuzz_against_given_targets_reports_and_passes(cluster, capsys):
    grpc_target, http_target = f"127.0.0.1:{cluster.router.port}", f"localhost:{cluster.router.http_port}"
    status = main(
        [
            "bench",
            "fuzz",
            "--cases",
            "40",
            "--seed",
            "3",
            "--target",
            grpc_target,
            "--http-target",
            http_target,
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.startswith("fuzz: 40 cases, seed 3")
    assert "findings: crash 0, 5xx 0, INTERNAL 0, UNKNOWN 0, UNAVAILABLE 0, hang 0, unnamed 0" in out
    assert "grpc INVALID_ARGUMENT" in out and "http 400" in out
    assert out.rstrip().endswith("serving after: OK (a normal request on every surface answered in full)")


def test_bench_fuzz_refuses_a_remote_target_unless_allowed(capsys):
    assert main(["bench", "fuzz", "--target", "10.1.2.3:50051"]) == 2
    assert "--target: 10.1.2.3 is not a loopback address; add --allow-remote" in capsys.readouterr().err
    assert main(["bench", "fuzz", "--http-target", "nothing"]) == 2
    assert "--http-target: expected host:port, got 'nothing'" in capsys.readouterr().err
