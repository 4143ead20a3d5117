"""The fault suite's driver: streaming clients that cancel and miss deadlines while workers are SIGKILLed
and handoffs fail, then a leak check of every worker and the router's availability (``baton bench faults``,
``tests/faults``)."""

from .fault_report import FaultReport
from .fault_run import fault_cluster, measure_faults, run_faults
from .scenario import FaultScenario, RequestPlan, plan_requests

__all__ = [
    "FaultReport",
    "FaultScenario",
    "RequestPlan",
    "fault_cluster",
    "measure_faults",
    "plan_requests",
    "run_faults",
]
