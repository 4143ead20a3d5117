"""A local cluster for the load-test client and CLI tests: one prefill and one decode worker, a
router with its OpenAI front and metrics endpoint, on free ports (started once for the package)."""

import pytest

from deploy.local.launcher import LocalCluster


@pytest.fixture(scope="package")
def loadtest_cluster(tiny_checkpoint):
    """The running ``LocalCluster``: gRPC at ``.port``, HTTP at ``.router.http_port``, metrics at
    ``.router.metrics_port``."""
    model = tiny_checkpoint("k3")
    cluster = LocalCluster(
        str(model),
        port=0,
        prefill_workers=1,
        decode_workers=1,
        worker_args=["--dtype", "float32"],
        http_port=0,
    )
    try:
        yield cluster
    finally:
        cluster.stop()
