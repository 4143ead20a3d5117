"""``--cluster-secret-file``: the flag of ``baton router``, ``baton cache`` and ``baton serve``
(``baton worker`` has it as ``WorkerConfig.cluster_secret_file``)."""

import argparse

from common.cluster_secret import FLAG, MIN_SECRET_CHARS


def add_cluster_secret_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--cluster-secret-file FILE`` (dest ``cluster_secret_file``, default ""); ``what`` says
    what this command does with the secret."""
    parser.add_argument(
        FLAG,
        dest="cluster_secret_file",
        default="",
        metavar="FILE",
        help=f"a file holding the cluster secret (one secret, >= {MIN_SECRET_CHARS} characters): {what} "
        "(docs/authentication.md)",
    )
