"""Copy the canonical monitoring files into the Helm chart, which cannot read outside its folder.

Canonical (edited by hand or by their generators)          copy in the chart (`.Files.Get`)
  deploy/prometheus/**/*.yml|yaml with top-level `groups:`  -> deploy/helm/baton/files/prometheus/rules/NAME
  deploy/grafana/*.json                                      -> deploy/helm/baton/files/grafana/NAME

Prometheus files without `groups:` (promtool unit tests) are not rule files and are not copied.

    python deploy/tools/chart_files.py           # rewrite the copies (`make chart-files`)
    python deploy/tools/chart_files.py --check   # list differences, exit 1 if any (tests/deploy)
"""

import argparse
import shutil
import sys
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1]
CHART_FILES = DEPLOY / "helm" / "baton" / "files"
COPIED = ("prometheus", "grafana")  # the chart's files/ subfolders this script owns


def plan() -> dict[Path, Path]:
    """``{copy path: canonical path}`` for every file the chart must carry."""
    copies: dict[Path, Path] = {}
    for source in sorted((DEPLOY / "prometheus").rglob("*.y*ml")):
        if source.suffix in (".yml", ".yaml") and _is_rule_file(source):
            _add(copies, CHART_FILES / "prometheus" / "rules" / source.name, source)
    for source in sorted((DEPLOY / "grafana").glob("*.json")):
        _add(copies, CHART_FILES / "grafana" / source.name, source)
    return copies


def differences() -> list[str]:
    """What ``sync()`` would change, one line each; empty when the copies are current."""
    copies = plan()
    found = []
    for copy, source in copies.items():
        if not copy.exists():
            found.append(f"{_rel(copy)}: missing (copy of {_rel(source)})")
        elif copy.read_bytes() != source.read_bytes():
            found.append(f"{_rel(copy)}: differs from {_rel(source)}")
    for folder in COPIED:
        for copy in sorted((CHART_FILES / folder).rglob("*")):
            if copy.is_file() and copy not in copies:
                found.append(f"{_rel(copy)}: stale (no canonical file)")
    return found


def sync() -> None:
    """Rewrite the chart's copies from the canonical files; copies without a source go away."""
    for folder in COPIED:
        shutil.rmtree(CHART_FILES / folder, ignore_errors=True)
    for copy, source in plan().items():
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)


def _is_rule_file(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "groups" in data


def _add(copies: dict[Path, Path], copy: Path, source: Path) -> None:
    if copy in copies:
        raise SystemExit(f"chart_files: {_rel(source)} and {_rel(copies[copy])} would both be {_rel(copy)}")
    copies[copy] = source


def _rel(path: Path) -> str:
    return str(path.relative_to(DEPLOY.parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report differences (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        found = differences()
        for line in found:
            print(line)
        return 1 if found else 0
    sync()
    print(f"copied {len(plan())} files into {_rel(CHART_FILES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
