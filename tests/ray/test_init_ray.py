"""``init_ray`` retries a local Ray start that timed out registering its node, and nothing else."""

import pytest

from deploy.ray import cluster

TIMEOUT = Exception("The current node timed out during startup. This could happen because ...")


class FakeRay:
    """Stands in for ``ray.init``/``ray.shutdown``: raises the given errors in turn, then succeeds."""

    def __init__(self, errors):
        self.errors = list(errors)
        self.inits: list[dict] = []
        self.shutdowns = 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        if self.errors:
            raise self.errors.pop(0)

    def shutdown(self):
        self.shutdowns += 1


@pytest.fixture
def fake_ray(monkeypatch):
    def install(errors):
        fake = FakeRay(errors)
        monkeypatch.setattr(cluster.ray, "init", fake.init)
        monkeypatch.setattr(cluster.ray, "shutdown", fake.shutdown)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        return fake

    return install


def test_a_start_that_timed_out_is_shut_down_and_started_again(fake_ray):
    fake = fake_ray([TIMEOUT, TIMEOUT])
    cluster.init_ray(num_cpus=2)
    assert len(fake.inits) == 3 and fake.shutdowns == 2
    assert fake.inits[-1] == {"address": None, "_system_config": {"worker_niceness": 0}, "num_cpus": 2}


def test_the_last_timeout_is_raised(fake_ray):
    fake = fake_ray([TIMEOUT] * 3)
    with pytest.raises(Exception, match="timed out during startup"):
        cluster.init_ray()
    assert len(fake.inits) == 3


def test_other_errors_and_remote_clusters_are_not_retried(fake_ray):
    fake = fake_ray([ValueError("bad option")])
    with pytest.raises(ValueError):
        cluster.init_ray()
    fake = fake_ray([TIMEOUT])
    with pytest.raises(Exception, match="timed out"):
        cluster.init_ray("ray://head:10001")
    assert fake.inits == [{"address": "ray://head:10001"}] and fake.shutdowns == 0
