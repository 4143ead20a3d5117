"""Load-test workloads, traces, drivers and reports, tested without a server."""
