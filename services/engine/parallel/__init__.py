"""Parallel layouts: the degrees and rank order (``layout``), one process's groups (``context``), and
the reductions model code uses across ranks (``collectives``, ``row_parallel``); prefill split over
ranks: by tokens (PCP: ``zigzag``, ``pcp_prefill``, ``pcp_cache``, ``pcp_kda``) and by layers (PP:
``pipeline``), both through the forward's parts in ``stage_forward``."""
