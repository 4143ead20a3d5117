"""Metrics catalogue, Prometheus rules, the Grafana dashboard and a real Prometheus scrape."""
