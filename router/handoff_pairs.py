"""Which prefill workers can hand a request off into which decode worker, from the handoff layouts their
load feeds report (``LoadUpdate.layout``), so the router never sends a request into a pair the decode
worker would refuse at Reserve.

This is the router's torch-free view of the workers' own check (``check_sender`` in
``services/engine/parallel/group_handoff.py``): the same fields, but not the part that needs the model's
config (a ``--tp`` that divides the KDA heads), which every worker checks of itself at start. The decode
worker's Reserve (``ReserveRequest.prefill_layout``) and the prefill worker's Prefill still check the
whole pair: a layout the router has not heard yet passes here and is judged there.
"""

from proto.baton.v1 import workers_pb2

# What the bytes mean: equal on both sides of any handoff.
_MEANING = ("model", "dtype", "kv_format", "numerics")
# One rank's pool: equal only where whole rows are copied (two single-rank workers).
_ROWS = ("block_size", "block_layout", "slot_layout")


class NoMappablePair(ValueError):
    """No prefill worker's layout maps into any decode worker that takes work (INVALID_ARGUMENT): the
    message names, for each decode worker, the field that refused it."""


def pair_refusal(
    prefill: workers_pb2.CacheLayout | None, decode: workers_pb2.CacheLayout | None
) -> str | None:
    """Why a worker of layout ``prefill`` cannot write into one of layout ``decode`` (naming the field
    or flag), or None when it can, or when either layout is not known yet."""
    if prefill is None or decode is None:
        return None
    for name in ("pp", "pcp"):
        degree = getattr(decode.parallel, name)
        if degree > 1:
            return f"decode --{name} {degree}: a handoff target is a tp x dcp group; serve it with --{name} 1"
    fields = _MEANING + (_ROWS if _single_rank(prefill) and _single_rank(decode) else ())
    for name in fields:
        theirs, ours = getattr(decode, name), getattr(prefill, name)
        if theirs != ours:
            return f"layout.{name}: decode worker has {theirs!r}, prefill worker has {ours!r}"
    return None


def _single_rank(layout: workers_pb2.CacheLayout) -> bool:
    degrees = layout.parallel  # unset: one rank (every degree reads 0)
    return max(degrees.tp, 1) * max(degrees.dcp, 1) * max(degrees.pcp, 1) * max(degrees.pp, 1) == 1
