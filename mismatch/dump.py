"""Log-prob dumps: one JSONL file per run, a header line then one record per request.

Both producers write through here: ``baton generate --out`` (the served side) and the trainer's
forward, so ``baton mismatch`` reads one format. Layout::

    line 1   {"baton_logprob_dump": 1, "environment": {...Environment...}}
    line 2+  {"id": "a", "path": "generate", "token_ids": [5, 9], "dtype": "float32",
              "logprobs": [-1.25, -0.5], "logprob_bits": ["bfa00000", "bf000000"],
              "mask": [1, 1], "prompt_ids": [3, 4], ...any other keys of the producer...}

``logprob_bits`` is the canonical value (``bits.py``: the original dtype's bits as fixed-width hex);
``logprobs`` is the same value as a JSON float for people and plain JSON tools (null where it is not
finite; JSON has no NaN or infinity) and, when present, must agree with the bits. A hand-written
record may give ``logprobs`` alone; they are then encoded, exactly, in ``dtype``. ``logprobs[i]`` is
the log-probability of ``token_ids[i]``; ``mask[i]`` (optional, 0 or 1) says whether position i counts
in a comparison (generated tokens only, a prompt scoring window). A record without log-probs has
neither key and a null ``dtype``.
"""

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import bits
from .environment import Environment

FORMAT_KEY = "baton_logprob_dump"
FORMAT_VERSION = 1
# The paths that produce dumps: the engine generating, the engine scoring given tokens (one prefill
# forward), the trainer's forward.
PATHS = ("generate", "score", "trainer")
SCHEMA_KEYS = ("id", "path", "token_ids", "dtype", "logprobs", "logprob_bits", "mask", "prompt_ids")


class DumpError(ValueError):
    """A dump that cannot be read or written; the message names the file, line and field."""


@dataclass(frozen=True)
class LogprobRecord:
    """One request's tokens and their log-probs, as bits of ``dtype``.

    Attributes:
        request_id: the request's id (string or integer), unique in a dump.
        path: which path computed the log-probs, one of ``PATHS``.
        token_ids: the tokens whose log-probs are listed.
        dtype: the log-probs' original dtype (``bits.DTYPES``); None when there are none.
        logprob_bits: per token, the unsigned bit pattern of its log-prob; None when not recorded.
        mask: per token, whether it counts in a comparison; None: all count.
        prompt_ids: the context before ``token_ids``, if the producer knows it.
        extra: the producer's other fields (``text``, ``finish_reason``, ...), kept as they are.
    """

    request_id: str | int
    path: str
    token_ids: tuple[int, ...]
    dtype: str | None = None
    logprob_bits: tuple[int, ...] | None = None
    mask: tuple[bool, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    extra: Mapping = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.request_id, (str, int)) or isinstance(self.request_id, bool):
            raise DumpError(f"id: expected a string or integer, got {self.request_id!r}")
        if self.path not in PATHS:
            raise DumpError(f"path: {self.path!r} is not one of {', '.join(PATHS)}")
        _check_ids(self.token_ids, "token_ids")
        if self.prompt_ids is not None:
            _check_ids(self.prompt_ids, "prompt_ids")
        if (self.dtype is None) != (self.logprob_bits is None):
            raise DumpError("dtype: given exactly when there are log-probs")
        if self.dtype is not None:
            if self.dtype not in bits.DTYPES:
                raise DumpError(f"dtype: {self.dtype!r} is not one of {', '.join(bits.DTYPES)}")
            _check_length(self.logprob_bits, len(self.token_ids), "logprob_bits")
            limit = 1 << bits.width(self.dtype)
            for i, pattern in enumerate(self.logprob_bits):
                if not isinstance(pattern, int) or isinstance(pattern, bool) or not 0 <= pattern < limit:
                    raise DumpError(f"logprob_bits[{i}]: expected an unsigned {self.dtype} pattern")
        if self.mask is not None:
            _check_length(self.mask, len(self.token_ids), "mask")
            if not all(isinstance(m, bool) for m in self.mask):
                raise DumpError("mask: expected booleans")
        clash = sorted(set(self.extra) & set(SCHEMA_KEYS))
        if clash:
            raise DumpError(f"{clash[0]}: an extra field may not reuse a schema key")

    @classmethod
    def from_values(
        cls,
        request_id: str | int,
        path: str,
        token_ids: Iterable[int],
        logprobs: Iterable[float] | None,
        dtype: str = "float32",
        **optional,
    ) -> "LogprobRecord":
        """A record from float values that are exactly ``dtype`` values (``tensor.tolist()``).
        ``optional``: ``mask``, ``prompt_ids``, ``extra``. NaN payloads are not kept by floats:
        use ``from_bits`` with ``tensor.view(torch.int32).tolist()`` where they matter."""
        if logprobs is None:
            return cls(request_id, path, tuple(token_ids), **_optional(optional))
        patterns = []
        for i, value in enumerate(logprobs):
            try:
                patterns.append(bits.to_bits(value, dtype))
            except ValueError as error:
                raise DumpError(f"logprobs[{i}]: {error}") from None
        return cls(request_id, path, tuple(token_ids), dtype, tuple(patterns), **_optional(optional))

    @classmethod
    def from_bits(
        cls,
        request_id: str | int,
        path: str,
        token_ids: Iterable[int],
        patterns: Iterable[int],
        dtype: str,
        **optional,
    ) -> "LogprobRecord":
        """A record from an integer view of the values, signed or unsigned
        (``tensor.view(torch.int16).tolist()`` for bfloat16)."""
        if dtype not in bits.DTYPES:
            raise DumpError(f"dtype: {dtype!r} is not one of {', '.join(bits.DTYPES)}")
        unsigned = []
        for i, pattern in enumerate(patterns):
            try:
                unsigned.append(bits.normalize(pattern, dtype))
            except ValueError as error:
                raise DumpError(f"logprob_bits[{i}]: {error}") from None
        return cls(request_id, path, tuple(token_ids), dtype, tuple(unsigned), **_optional(optional))

    @property
    def logprobs(self) -> tuple[float, ...] | None:
        """The values as floats (exact; NaN payloads are in ``logprob_bits`` only)."""
        if self.logprob_bits is None:
            return None
        return tuple(bits.from_bits(p, self.dtype) for p in self.logprob_bits)

    def to_json(self) -> dict:
        record = {"id": self.request_id, "path": self.path, "token_ids": list(self.token_ids)}
        record["dtype"] = self.dtype
        if self.logprob_bits is not None:
            record["logprobs"] = [v if v - v == 0 else None for v in self.logprobs]  # null: inf, nan
            record["logprob_bits"] = [bits.to_hex(p, self.dtype) for p in self.logprob_bits]
        if self.mask is not None:
            record["mask"] = [int(m) for m in self.mask]
        if self.prompt_ids is not None:
            record["prompt_ids"] = list(self.prompt_ids)
        record.update(self.extra)
        return record


@dataclass(frozen=True)
class Dump:
    """A whole dump: where it was computed and its records, in file order."""

    environment: Environment
    records: tuple[LogprobRecord, ...]

    def by_id(self) -> dict[str | int, LogprobRecord]:
        return {record.request_id: record for record in self.records}


def write_dump(path: str | Path, environment: Environment, records: Iterable[LogprobRecord]) -> int:
    """Write the header then one line per record (parent folders made); returns the record count.
    DumpError on a repeated request id."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    seen = set()
    count = 0
    with path.open("w") as sink:
        header = {FORMAT_KEY: FORMAT_VERSION, "environment": environment.to_json()}
        sink.write(json.dumps(header, allow_nan=False) + "\n")
        for record in records:
            if record.request_id in seen:
                raise DumpError(f"{path}: id: {record.request_id!r} is written twice")
            seen.add(record.request_id)
            sink.write(json.dumps(record.to_json(), allow_nan=False) + "\n")
            count += 1
    return count


def read_dump(path: str | Path) -> Dump:
    """Read a dump. DumpError ``"<file> line <n>: <field>: <what is wrong>"`` on bad input."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DumpError(f"{path}: cannot read ({error})") from None
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise DumpError(f"{path}: empty (expected a header line, then one record per line)")
    environment = _read_header(path, *numbered[0])
    records, lines_of = [], {}
    for number, line in numbered[1:]:
        where = f"{path} line {number}"
        try:
            record = _parse_record(_load(line))
        except DumpError as error:
            raise DumpError(f"{where}: {error}") from None
        if record.request_id in lines_of:
            raise DumpError(f"{where}: id: {record.request_id!r} repeats line {lines_of[record.request_id]}")
        lines_of[record.request_id] = number
        records.append(record)
    return Dump(environment, tuple(records))


def _read_header(path: Path, number: int, line: str) -> Environment:
    where = f"{path} line {number}"
    try:
        header = _load(line)
    except DumpError as error:
        raise DumpError(f"{where}: {error}") from None
    if not isinstance(header, dict) or FORMAT_KEY not in header:
        raise DumpError(
            f"{where}: {FORMAT_KEY}: missing; not a log-prob dump header (files written by "
            "`baton generate --out` before dumps had one: run it again)"
        )
    if header[FORMAT_KEY] != FORMAT_VERSION:
        found = header[FORMAT_KEY]
        raise DumpError(f"{where}: {FORMAT_KEY}: version {found!r} (this reader: {FORMAT_VERSION})")
    if not isinstance(header.get("environment"), dict):
        raise DumpError(f"{where}: environment: expected an object, got {header.get('environment')!r}")
    try:
        return Environment.from_json(header["environment"])
    except (TypeError, ValueError) as error:
        raise DumpError(f"{where}: environment.{error}") from None


def _load(line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise DumpError(f"not valid JSON ({error.msg} at column {error.colno})") from None


def _parse_record(data) -> LogprobRecord:
    if not isinstance(data, dict):
        raise DumpError(f"expected an object, got {type(data).__name__}")
    for key in ("id", "path", "token_ids"):
        if key not in data:
            raise DumpError(f"{key}: missing")
    dtype = data.get("dtype")
    values, hexes = data.get("logprobs"), data.get("logprob_bits")
    count = len(data["token_ids"]) if isinstance(data["token_ids"], list) else None
    patterns = None
    if hexes is not None:
        _check_length(hexes, count, "logprob_bits")
        patterns = tuple(_field(f"logprob_bits[{i}]", bits.from_hex, h, dtype) for i, h in enumerate(hexes))
        if values is not None:
            _check_length(values, count, "logprobs")
            for i, (value, pattern) in enumerate(zip(values, patterns, strict=True)):
                _check_copy(i, value, pattern, dtype)
    elif values is not None:
        _check_length(values, count, "logprobs")
        patterns = tuple(_field(f"logprobs[{i}]", bits.to_bits, v, dtype) for i, v in enumerate(values))
    mask = data.get("mask")
    if mask is not None:
        if not isinstance(mask, list) or any(m not in (0, 1) or isinstance(m, float) for m in mask):
            raise DumpError("mask: expected a list of 0 and 1")
        mask = tuple(bool(m) for m in mask)
    extra = {key: value for key, value in data.items() if key not in SCHEMA_KEYS}
    return LogprobRecord(
        request_id=data["id"],
        path=data["path"],
        token_ids=_as_tuple(data["token_ids"]),
        dtype=dtype if patterns is not None else _no_dtype(dtype),
        logprob_bits=patterns,
        mask=mask,
        prompt_ids=_as_tuple(data.get("prompt_ids")),
        extra=extra,
    )


def _check_copy(i: int, value, pattern: int, dtype: str) -> None:
    """The JSON float beside the bits must spell the same value (null where it is not finite)."""
    decoded = bits.from_bits(pattern, dtype)
    if decoded - decoded != 0:  # inf or nan
        if value is not None:
            raise DumpError(f"logprobs[{i}]: {value!r} but logprob_bits[{i}] is {decoded!r} (expected null)")
        return
    if value is None or _field(f"logprobs[{i}]", bits.to_bits, value, dtype) != pattern:
        raise DumpError(f"logprobs[{i}]: {value!r} disagrees with logprob_bits[{i}] ({decoded!r})")


def _field(name: str, convert, value, dtype):
    if dtype is None:
        raise DumpError("dtype: missing (needed with log-probs)")
    if dtype not in bits.DTYPES:
        raise DumpError(f"dtype: {dtype!r} is not one of {', '.join(bits.DTYPES)}")
    try:
        return convert(value, dtype)
    except ValueError as error:
        raise DumpError(f"{name}: {error}") from None


def _as_tuple(items):
    """Lists become tuples; anything else is left for ``LogprobRecord`` to refuse by name."""
    return tuple(items) if isinstance(items, list) else items


def _no_dtype(dtype):
    if dtype is not None:
        raise DumpError("dtype: given without logprobs or logprob_bits")
    return None


def _check_ids(ids, name: str) -> None:
    if not isinstance(ids, tuple) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise DumpError(f"{name}: expected a list of integers")


def _check_length(items, expected: int | None, name: str) -> None:
    if not isinstance(items, (list, tuple)):
        raise DumpError(f"{name}: expected a list, got {type(items).__name__}")
    if expected is not None and len(items) != expected:
        raise DumpError(f"{name}: {len(items)} entries for {expected} token_ids")


def _optional(options: dict) -> dict:
    unknown = sorted(set(options) - {"mask", "prompt_ids", "extra"})
    if unknown:
        raise TypeError(f"unexpected argument {unknown[0]!r}")
    out = dict(options)
    for name in ("mask", "prompt_ids"):
        if out.get(name) is not None:
            out[name] = tuple(bool(m) for m in out[name]) if name == "mask" else tuple(out[name])
    return out
