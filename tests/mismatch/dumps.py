"""Small dumps for the mismatch tests, built without a model."""

from mismatch import Dump, Environment, LogprobRecord


def environment(**changes) -> Environment:
    fields = dict(
        python="3.11.7",
        platform="Linux-x86_64",
        libraries={"torch": "2.13.0", "fla": "0.6.0"},
        device="cpu: test",
        kernels="reference",
        numerics="batch_invariant",
        dtype="float32",
        kv_format="auto",
        checkpoint="abc",
        flags={"max_num_seqs": 4},
    )
    fields.update(changes)
    return Environment(**fields)


def record(request_id, logprobs, tokens=None, path="generate", dtype="float32", **optional) -> LogprobRecord:
    tokens = list(range(10, 10 + len(logprobs))) if tokens is None else tokens
    return LogprobRecord.from_values(request_id, path, tokens, logprobs, dtype, **optional)


def dump(*records: LogprobRecord, **environment_changes) -> Dump:
    return Dump(environment(**environment_changes), tuple(records))
