"""Tests of the torch-free layer the router, SDK and workers share (``common/``)."""
