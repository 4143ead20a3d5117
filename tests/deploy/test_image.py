"""The container images, as far as they can be checked without building them."""

import json
import re

import pytest
import yaml

from tests.deploy import chart

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = chart.REPO
DOCKERFILES = ("Dockerfile", "Dockerfile.cpu")


def _instructions(name: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / name).read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            found.append((instruction.upper(), rest.strip()))
    return found


def _final_stage(name: str) -> list[tuple[str, str]]:
    steps = _instructions(name)
    last_from = max(i for i, (instruction, _) in enumerate(steps) if instruction == "FROM")
    return steps[last_from:]


def _copy_sources(name: str) -> list[str]:
    """Sources of the COPY instructions that read the build context (not ``--from=<stage>``)."""
    sources = []
    for instruction, rest in _instructions(name):
        if instruction == "COPY" and "--from=" not in rest:
            sources += rest.split()[:-1]
    return sources


def _ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context, as Docker decides: the last
    pattern matching the path or a folder above it wins; ``*`` stays within a folder, ``**`` does not."""
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for line in (line for line in lines if line and not line.startswith("#")):
        negated, pattern = line.startswith("!"), line.lstrip("!")
        if any(_glob(pattern).fullmatch(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def _glob(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex (Go's filepath.Match plus ``**``)."""
    out = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
    return re.compile(out.replace(r"\*", "[^/]*").replace(r"\?", "[^/]"))


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copy_sources_exist_and_are_in_the_build_context(name):
    sources = _copy_sources(name)
    assert sources
    for source in sources:
        assert (REPO / source).exists(), f"{name}: COPY {source}: no such file in the repository"
        assert not _ignored(source), f"{name}: COPY {source}: excluded by .dockerignore"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_python_package_goes_into_the_image(name):
    """Each package pyproject installs is copied (and kept by .dockerignore) before `pip install .`."""
    sources = _copy_sources(name)
    for pattern in _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*").replace(".", "/")
        if not (REPO / package).is_dir():
            continue
        assert package.split("/")[0] in sources, f"{name}: package {package} is not copied"
        assert not _ignored(f"{package}/__init__.py"), f"{package}/__init__.py is excluded by .dockerignore"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_entrypoint_is_the_baton_command(name):
    final = dict(_final_stage(name))
    assert json.loads(final["ENTRYPOINT"]) == ["baton"]
    assert _pyproject()["project"]["scripts"]["baton"] == "cli.main:main"
    assert final["USER"] not in ("root", "0")
    ports = {int(p) for p in final["EXPOSE"].split()}
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    assert set(values["router"]["ports"].values()) <= ports
    assert {values["decode"]["port"], values["decode"]["metricsPort"]} <= ports


@pytest.mark.parametrize(
    "name, base", [("Dockerfile", "nvidia/cuda:"), ("Dockerfile.cpu", "python:3.11-slim")]
)
def test_base_image_torch_and_generated_protos(name, base):
    steps = _instructions(name)
    text = (REPO / name).read_text()
    assert re.search(rf"^ARG \w+_IMAGE={re.escape(base)}", text, re.M)
    makefile = (REPO / "Makefile").read_text()
    torch = re.search(r"^TORCH_VERSION \?= (\S+)", makefile, re.M).group(1)
    assert f"ARG TORCH_VERSION={torch}" in text  # the version `make setup` tests with
    runs = " ".join(rest for instruction, rest in steps if instruction == "RUN")
    assert "make proto" in runs
    if name == "Dockerfile.cpu":
        assert "--index-url https://download.pytorch.org/whl/cpu" in runs


def test_dockerignore_keeps_local_state_out():
    for path in (".venv", ".cache", ".git", "proto/baton/v1/generation_pb2.py", "tests/deploy/chart.py"):
        assert _ignored(path), path
    for path in ("cli/main.py", "deploy/__init__.py", "deploy/ray/__init__.py", "pyproject.toml"):
        assert not _ignored(path), path


def test_chart_default_image_is_this_project():
    project = _pyproject()["project"]
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert values["image"]["repository"].rsplit("/", 1)[-1] == project["name"]
    assert meta["appVersion"] == project["version"]
    assert re.search(r"^IMAGE \?= (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1) == project["name"]
