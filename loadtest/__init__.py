"""Load tests for agent-style traffic: workloads, drivers, clients, metrics and reports."""
