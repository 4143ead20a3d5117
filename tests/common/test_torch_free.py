"""The router, its HTTP front and the SDK load only ``common/`` and the protos (no torch, nothing of
``services/``), and ``common/`` imports none of the engine."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE_SIDE = ("torch", "services", "kernels")
COMMON_MUST_NOT_IMPORT = ("torch", "services", "kernels")


def _loaded(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The modules in (or under) ``packages`` that importing ``modules`` in a fresh interpreter loads."""
    probe = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"under = lambda m: any(m == p or m.startswith(p + '.') for p in {packages!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if under(m))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(result.stdout)


@pytest.mark.parametrize("module", ["router.server", "router.openai.app", "sdk", "common.tokenizer"])
def test_router_front_and_sdk_load_without_torch_or_services(module):
    assert _loaded([module], ENGINE_SIDE) == []


def test_common_modules_import_nothing_of_the_engine():
    """Every import statement in ``common/`` (inside functions too) names neither torch, services nor
    kernels."""
    offending = []
    for path in sorted((REPO / "common").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] in COMMON_MUST_NOT_IMPORT:
                    offending.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    assert offending == []


def test_every_common_module_loads_without_the_engine():
    modules = sorted(
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for path in (REPO / "common").rglob("*.py")
    )
    assert _loaded(modules, COMMON_MUST_NOT_IMPORT) == []
