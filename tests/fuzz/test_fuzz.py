"""Property: no request a client can send makes the router answer 5xx, INTERNAL or UNKNOWN, hang,
or refuse without naming the field; and afterwards it still serves. Cases come from the same
generator as ``baton bench fuzz``, driven by Hypothesis (fixed seed in CI, shrinking on failure)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy.benchmark.fuzz_cases import CHAT, COMPLETIONS, grpc_case, http_case

# derandomize: the same cases on every run, so CI is repeatable; a local run with a different
# --hypothesis-seed explores others.
_CASES = 200  # per surface
_SETTINGS = settings(
    max_examples=_CASES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_RANDOMS = st.randoms(use_true_random=False)


def _passes(cluster, case, ran: list) -> None:
    outcome = cluster.client.run(case)
    ran.append(outcome)
    assert outcome.finding is None, (outcome, case)


def test_http_bodies_never_5xx_and_refusals_name_the_field(cluster):
    ran = []

    @_SETTINGS
    @given(rng=_RANDOMS, chat=st.booleans())
    def check(rng, chat):
        _passes(cluster, http_case(rng, CHAT if chat else COMPLETIONS), ran)

    check()
    statuses = {outcome.status for outcome in ran}
    assert len(ran) >= _CASES
    # the paths under test ran: refusals of every kind, and some requests that generated
    assert {"http 200", "http 400", "http 415"} <= statuses, statuses


def test_grpc_messages_and_raw_bytes_never_internal(cluster):
    ran = []

    @_SETTINGS
    @given(rng=_RANDOMS)
    def check(rng):
        _passes(cluster, grpc_case(rng), ran)

    check()
    statuses = {outcome.status for outcome in ran}
    assert len(ran) >= _CASES
    assert {"grpc OK", "grpc INVALID_ARGUMENT"} <= statuses, statuses


def test_the_cluster_still_serves_after_the_fuzzing(cluster):
    assert cluster.client.check_serving() == []
    assert all(worker.worker.alive() for worker in cluster.workers)
