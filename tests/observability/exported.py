"""What the Baton processes export and what the rules and the dashboard query (shared by the tests)."""

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
ROLES = ("router", "prefill", "decode", "cache")
BUILTIN = {"up"}  # series Prometheus itself writes for every target


@dataclass(frozen=True)
class Family:
    name: str  # as Prometheus stores it: counters with their ``_total``
    type: str  # counter, gauge or histogram
    labels: tuple[str, ...]


def exported(role: str) -> dict[str, Family]:
    """Every metric family ``Metrics(role)`` registers, by name."""
    registry = Metrics(role).registry
    families = {}
    for family in registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        # A labelled metric with no children yet has no samples to read its label names from.
        labels = tuple(registry._names_to_collectors[name]._labelnames)
        families[name] = Family(name, family.type, labels)
    return families


def series_names() -> set[str]:
    """Every series name a scrape of any Baton process can produce."""
    suffixes = {"counter": ("", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
    names = set()
    for role in ROLES:
        for family in exported(role).values():
            stem = family.name.removesuffix("_total") if family.type == "counter" else family.name
            for suffix in suffixes[family.type]:
                names.add(family.name if suffix == "" else stem + suffix)
    return names


def rule_groups(name: str) -> list[dict]:
    """The groups of ``deploy/prometheus/<name>``."""
    return yaml.safe_load((RULES / name).read_text())["groups"]


def recording_rules() -> dict[str, str]:
    """Recorded name -> expression (a name may be recorded by more than one rule: joined)."""
    rules: dict[str, str] = {}
    for group in rule_groups("recording.rules.yml"):
        for rule in group["rules"]:
            rules[rule["record"]] = (rules.get(rule["record"], "") + "\n" + rule["expr"]).strip()
    return rules


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads: ``baton_*``, recording rules (``a:b:c``) and ``up``."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges and subqueries
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    names = set()
    for match in re.finditer(r"(?<![\w:.$])[a-zA-Z_:][\w:]*", expr):
        token = match.group()
        followed_by_call = expr[match.end() :].lstrip().startswith("(")
        if followed_by_call:
            continue
        if token.startswith("baton_") or ":" in token or token in BUILTIN:
            names.add(token)
    return names
