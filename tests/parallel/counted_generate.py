"""``python -m tests.parallel.counted_generate ARGS``: ``baton ARGS`` (``cli.main``) as rank 0 of a
PCP engine, with this rank's PCP exchanges counted (``prefill_ranks.count_calls``) and the counts
printed last on stderr (``pcp exchanges: {...}``), so a test sees that rank 0 ran the split prefill."""

import json
import sys

from cli.main import main
from tests.parallel.prefill_ranks import count_calls

EXCHANGES_PREFIX = "pcp exchanges: "


def run(argv: list[str]) -> int:
    counts: dict[str, int] = {}
    count_calls(counts)
    code = main(argv)
    print(EXCHANGES_PREFIX + json.dumps(counts), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
