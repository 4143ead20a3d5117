"""``baton bench grammar``: what structured output costs per request and per token, for the two grammar
libraries Baton could use (xgrammar and llguidance), at Baton's vocabulary sizes.

For each tokenizer and library: the time to compile a JSON schema (and a regex) into a matcher, then a
valid output's tokens fed one by one, timing each step's host bitmask fill (the work that sits on the
decode step's path) and reporting its mean and p99. The outputs are fixed JSON documents tokenized with
the model's own tokenizer, so both libraries walk the same token sequence.

The large vocabulary is a byte-level BPE trained by ``common/tokenizer/builder.py`` on the demo corpus
plus generated identifier-like words (the Bibles alone hold ~17,000 word forms), to ``--big-vocab`` ids.
"""

from __future__ import annotations

import json
import pathlib
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

BENCH_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,3}$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "active": {"type": "boolean"},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "email", "tags", "address", "active", "score"],
    "additionalProperties": False,
}
BENCH_REGEX = r"[A-Z][a-z]{2,12}( [A-Z][a-z]{2,12}){0,3}, [0-9]{1,5} [A-Za-z ]{3,30}"


def _documents() -> list[str]:
    """Outputs valid under ``BENCH_SCHEMA`` in its property order (both libraries' compact form)."""
    rng = random.Random(0)
    words = ["alpha", "river", "stone", "light", "garden", "north", "silver", "morning", "house"]
    out = []
    for i in range(8):
        doc = {
            "name": f"{rng.choice(words).title()} {rng.choice(words).title()}",
            "age": rng.randint(1, 99),
            "email": f"{rng.choice(words)}@{rng.choice(words)}.org",
            "tags": [rng.choice(words) for _ in range(rng.randint(1, 6))],
            "address": {"city": rng.choice(words).title(), "zip": f"{rng.randint(0, 99999):05d}"},
            "active": bool(i % 2),
            "score": round(rng.random() * 100, 3),
        }
        out.append(json.dumps(doc, separators=(",", ":")))
    return out


def _synthetic_words(count: int, seed: int = 0) -> Iterator[str]:
    """Lines of identifier-like words (syllables, camelCase, numbers), each word twice so BPE keeps it."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + ["th", "st", "ing", "er", "on"]
    line: list[str] = []
    for i in range(count):
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 5)))
        if i % 7 == 0:
            word = word.capitalize() + rng.choice(syllables).capitalize()
        if i % 11 == 0:
            word += str(rng.randint(0, 9999))
        line += [word, word]
        if len(line) >= 64:
            yield " ".join(line)
            line = []
    if line:
        yield " ".join(line)


def build_big_tokenizer(out_dir: pathlib.Path, vocab_size: int) -> pathlib.Path:
    """A k3-family byte-level BPE of ``vocab_size`` ids in ``out_dir`` (kept: a second run reuses it)."""
    if (out_dir / "tokenizer.json").exists():
        return out_dir
    import itertools

    from common.tokenizer.builder import write_tokenizer
    from tools.demo_model import corpus

    documents = itertools.chain(corpus.train_documents(), _synthetic_words(vocab_size * 3))
    write_tokenizer(out_dir, "k3", vocab_size, documents)
    return out_dir


@dataclass(frozen=True)
class GrammarCost:
    """One library on one tokenizer (milliseconds)."""

    library: str
    vocab: int
    tokenizer_setup_ms: float  # once per process and tokenizer
    schema_compile_ms: float  # median over fresh compiles of BENCH_SCHEMA (no cache)
    regex_compile_ms: float
    mask_mean_ms: float  # one step's bitmask fill, over every token of every document
    mask_p99_ms: float
    first_mask_ms: float  # the first step after a compile (lazy work lands there)
    steps: int


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return (time.perf_counter() - start) * 1e3, value


def _measure(library: str, tokenizer_dir: pathlib.Path, docs: list[str], compiles: int) -> GrammarCost:
    from common.tokenizer.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    vocab = tokenizer.vocab_size
    sequences = [tokenizer.encode(doc) for doc in docs]
    schema = json.dumps(BENCH_SCHEMA)
    if library == "llguidance":
        import llguidance
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        text = (tokenizer_dir / "tokenizer.json").read_text()
        from common.structured_output import StructuredOutput

        eos = tokenizer.eos_token_ids
        setup, lltok = _ms(lambda: llguidance.LLTokenizer(text, n_vocab=vocab, eos_token=eos))
        grammar = StructuredOutput("json_schema", schema).grammar()  # what the engine compiles
        regex = StructuredOutput("regex", BENCH_REGEX).grammar()

        def new(g: str = grammar):
            return llguidance.LLMatcher(lltok, g, log_level=0)

        mask = allocate_token_bitmask(1, vocab)

        def fill(m) -> None:
            fill_next_token_bitmask(m, mask, 0)

        def accept(m, token: int) -> None:
            assert m.consume_token(token), m.get_error()

    elif library == "xgrammar":
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
        setup, info = _ms(
            lambda: xgr.TokenizerInfo.from_huggingface(
                hf, vocab_size=vocab, stop_token_ids=tokenizer.eos_token_ids
            )
        )
        compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)

        def new(g: str | None = None):
            if g == "regex":
                return xgr.GrammarMatcher(compiler.compile_regex(BENCH_REGEX))
            compact = compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
            return xgr.GrammarMatcher(compact)

        regex = "regex"
        mask = xgr.allocate_token_bitmask(1, vocab)

        def fill(m) -> None:
            m.fill_next_token_bitmask(mask, 0)

        def accept(m, token: int) -> None:
            assert m.accept_token(token)
    else:
        raise ValueError(f"--libraries: unknown grammar library {library!r} (xgrammar, llguidance)")

    compile_ms = statistics.median(_ms(new)[0] for _ in range(compiles))
    regex_ms = statistics.median(_ms(lambda: new(regex))[0] for _ in range(compiles))
    steps: list[float] = []
    firsts: list[float] = []
    for tokens in sequences:
        matcher = new()
        for i, token in enumerate(tokens):
            elapsed, _ = _ms(lambda m=matcher: fill(m))
            (firsts if i == 0 else steps).append(elapsed)
            accept(matcher, token)
    return GrammarCost(
        library=library,
        vocab=vocab,
        tokenizer_setup_ms=setup,
        schema_compile_ms=compile_ms,
        regex_compile_ms=regex_ms,
        mask_mean_ms=statistics.fmean(steps),
        mask_p99_ms=_percentile(steps, 0.99),
        first_mask_ms=statistics.fmean(firsts),
        steps=len(steps),
    )


def run_grammar_bench(
    tokenizer_dirs: list[pathlib.Path],
    libraries: tuple[str, ...] = ("xgrammar", "llguidance"),
    compiles: int = 5,
) -> list[GrammarCost]:
    """Every library on every tokenizer; each row measured in this process, one after another."""
    docs = _documents()
    return [_measure(lib, d, docs, compiles) for d in tokenizer_dirs for lib in libraries]


def default_big_tokenizer_dir(vocab_size: int) -> pathlib.Path:
    return pathlib.Path(tempfile.gettempdir()) / f"baton-grammar-bench-bpe-{vocab_size}"


def format_costs(costs: list[GrammarCost]) -> str:
    head = (
        "| library | vocab | tokenizer setup ms | schema compile ms | regex compile ms "
        "| first mask ms | mask mean ms | mask p99 ms | steps |"
    )
    rows = [head, "|" + "---|" * 9]
    for c in costs:
        rows.append(
            f"| {c.library} | {c.vocab:,} | {c.tokenizer_setup_ms:.1f} | {c.schema_compile_ms:.2f} "
            f"| {c.regex_compile_ms:.2f} | {c.first_mask_ms:.3f} | {c.mask_mean_ms:.4f} "
            f"| {c.mask_p99_ms:.4f} | {c.steps} |"
        )
    return "\n".join(rows)


def costs_json(costs: list[GrammarCost]) -> str:
    return json.dumps([asdict(c) for c in costs], indent=2)
