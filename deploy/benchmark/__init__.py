"""Cluster benchmarks over the public gRPC API (``pd``: colocated against disaggregated decode latency)."""

from .pd_bench import measure_pd
from .pd_report import ModeReport, PDReport
from .pd_workload import PDWorkload

__all__ = ["ModeReport", "PDReport", "PDWorkload", "measure_pd"]
