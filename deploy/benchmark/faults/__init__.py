"""The fault suite's driver: streaming clients that cancel and miss deadlines while workers are SIGKILLed
and handoffs fail, then a leak check of every worker and the router's availability (``baton bench faults``,
``tests/faults``); and HiCache's faults: the node's tier and Redis killed under multi-turn sessions
(``tier_faults.py``)."""

from .fault_report import FaultReport
from .fault_run import fault_cluster, measure_faults, run_faults
from .scenario import FaultScenario, RequestPlan, plan_requests
from .sessions import SessionPlan
from .tier_fault_report import TierFaultReport
from .tier_faults import TierFaultScenario, run_tier_faults, tier_fault_cluster

__all__ = [
    "FaultReport",
    "FaultScenario",
    "RequestPlan",
    "SessionPlan",
    "TierFaultReport",
    "TierFaultScenario",
    "fault_cluster",
    "measure_faults",
    "plan_requests",
    "run_faults",
    "run_tier_faults",
    "tier_fault_cluster",
]
