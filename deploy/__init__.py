"""Running the Baton cluster beyond one machine's processes (``deploy/ray``: on a Ray cluster), and the
cluster benchmarks over its public API (``deploy/benchmark``)."""
