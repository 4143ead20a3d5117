"""The figures a fault run reads from a ``/metrics`` page: the router's outcomes by status and workers up;
the router's or the tier's Redis link up."""

from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families


def _samples(metrics_url: str, family: str) -> list:
    with urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return [
        sample
        for metric in text_string_to_metric_families(text)
        if metric.name == family
        for sample in metric.samples
    ]


def requests_by_status(metrics_url: str) -> dict[str, int]:
    """``baton_requests_total`` per ``status`` label (the router's count of finished requests)."""
    return {
        sample.labels["status"]: int(sample.value)
        for sample in _samples(metrics_url, "baton_requests")
        if sample.name == "baton_requests_total"
    }


def worker_up(metrics_url: str, role: str, address: str) -> float | None:
    """``baton_worker_up`` of one worker (1: the router believes it reachable), None if absent."""
    for sample in _samples(metrics_url, "baton_worker_up"):
        if sample.labels.get("role") == role and sample.labels.get("worker") == address:
            return sample.value
    return None


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """``after - before`` per status, zero differences dropped."""
    keys = sorted(set(before) | set(after))
    return {
        key: after.get(key, 0) - before.get(key, 0) for key in keys if after.get(key, 0) != before.get(key, 0)
    }


def redis_up(metrics_url: str, role: str) -> float | None:
    """``baton_hicache_redis_up`` of ``role`` (1: its Redis link answers, 0: down), None if absent."""
    for sample in _samples(metrics_url, "baton_hicache_redis_up"):
        if sample.labels.get("role") == role:
            return sample.value
    return None
