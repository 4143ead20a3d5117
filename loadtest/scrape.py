"""Server counters around a run: read a Prometheus text endpoint (the router's ``/metrics``) before
and after, and report how much each counter grew.

    before = scrape(url); ...run...; server = counter_deltas(before, scrape(url))

The deltas kept: ``COUNTERS`` and every counter whose name contains ``accept`` (speculative
decoding acceptance, when a server has it). An unlabelled counter gives a number; a labelled one a
dict keyed by its label values (joined by ``/`` when there are several), e.g.
``{"baton_transfer_bytes_total": {"nixl": 1048576.0}}``. A counter that went down (the server
restarted) counts its value after the restart, as Prometheus' ``increase`` does.
"""

import urllib.error
import urllib.request
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from loadtest.clients.target import is_loopback

COUNTERS = (
    "baton_requests_total",
    "baton_prompt_tokens_total",
    "baton_cached_prompt_tokens_total",
    "baton_generation_tokens_total",
    "baton_transfer_bytes_total",
    "baton_handoff_fallbacks_total",
    "baton_local_prefills_total",
)

# sample name -> label values (in label-name order) -> value
Counters = dict[str, dict[tuple[str, ...], float]]


def metrics_url(text: str, *, explicit: bool, flag: str = "--metrics-url") -> str:
    """Check ``http://HOST:PORT[/PATH]`` (``/metrics`` when no path is given).

    Raises:
        ValueError: naming ``flag``: not http, no host or port, or a non-loopback host not given
            explicitly.
    """
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or not port:
        raise ValueError(f"{flag}: expected http://HOST:PORT[/metrics], got {text!r}")
    if not explicit and not is_loopback(parts.hostname):
        raise ValueError(f"{flag}: {parts.hostname} is not a loopback address; name it explicitly")
    return text if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


def parse_counters(text: str) -> Counters:
    """Every counter sample (``*_total``) of a Prometheus text exposition."""
    found: Counters = {}
    for family in text_string_to_metric_families(text):
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = tuple(value for _, value in sorted(sample.labels.items()))
                found.setdefault(sample.name, {})[key] = float(sample.value)
    return found


def scrape(url: str, timeout_s: float = 10.0) -> Counters:
    """Fetch ``url`` and parse its counters.

    Raises:
        OSError: the endpoint could not be read (``urllib.error.URLError`` is one).
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return parse_counters(reply.read().decode("utf-8"))


def counter_deltas(before: Counters, after: Counters) -> dict:
    """How much each kept counter grew between two scrapes (see the module docstring)."""
    kept = [name for name in after if name in COUNTERS or "accept" in name]
    deltas: dict = {}
    for name in sorted(kept, key=lambda n: (COUNTERS.index(n) if n in COUNTERS else len(COUNTERS), n)):
        grown = {}
        for labels, value in after[name].items():
            old = before.get(name, {}).get(labels, 0.0)
            grown[labels] = value - old if value >= old else value
        if list(grown) == [()]:
            deltas[name] = grown[()]
        else:
            deltas[name] = {"/".join(labels): value for labels, value in sorted(grown.items())}
    return deltas


def try_scrape(url: str | None) -> tuple[Counters | None, str | None]:
    """``(counters, None)``, or ``(None, error)`` when ``url`` could not be read; ``(None, None)``
    without a URL."""
    if url is None:
        return None, None
    try:
        return scrape(url), None
    except (OSError, urllib.error.URLError, ValueError) as error:
        return None, f"{url}: {error}"
