"""Parallel layouts: the degrees and rank order (``layout``), one process's groups (``context``), and
the reductions model code uses across ranks (``collectives``, ``row_parallel``)."""
