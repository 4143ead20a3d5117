"""Ways to run the Baton cluster beyond one machine's processes (``deploy/ray``: on a Ray cluster)."""
