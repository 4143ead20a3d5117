"""A verify step's split of the KDA rows: each speculative sequence's tail ("head" rows), then a
checkpoint of its state, then its drafts.

```
 rows:          | seq 0 (plain): 4 | seq 1: tail 1, drafts 2 | seq 2: tail 3, drafts 4 |
                  h h h h            h  d d                   h h h  d d d d
 head_rows:       0 1 2 3            4                        7 8 9
 draft_rows:                            5 6                          10 11 12 13
 heads step:    seq 0 rows 0..3,  seq 1 row 4,  seq 2 rows 7..9       (past as in the step)
 drafts step:   seq 1 rows 5..6 (past + 1),  seq 2 rows 10..13 (past + 3), both continuing their state
```
A KDA layer runs its short conv and recurrence on the heads step, copies the speculative sequences'
layer fields from ``slots`` to ``checkpoint_slots`` (the state after the tail: where a rejected draft
restores from), then runs the drafts step. Rows of sequences without drafts are all head rows.
Attention layers need none of this: the chunk is causal.

With ``--kda-rollback states`` the sequences name a slot per draft instead (``draft_slots``): the KDA
kernels keep the state after every draft there (``StepMetadata.kda_token_slots``), on the recurrent
kernel only. Such a step is split only when it also holds a chunk longer than the recurrent kernel's
bound (a prompt chunk): the heads step is then every sequence without drafts (the chunked kernel),
the drafts step every sequence with drafts, whole (the recurrent kernel), and nothing is checkpointed.
"""

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import torch

from kernels.kda.varlen import RECURRENT_MAX_QUERY_LEN

from .layer_cache import KdaLayerCache

if TYPE_CHECKING:
    from .step_metadata import SequenceStep, StepMetadata


@dataclass(frozen=True)
class SpecSplit:
    """The split of one step with drafts (built by ``build_step_metadata``, on the host, once).

    Attributes:
        head_rows: ``[Nh] int64``, the step's rows of the heads step, in its row order.
        draft_rows: ``[Nd] int64``, the step's rows of the drafts step, in its row order.
        heads: the heads step (every sequence: its non-draft rows).
        drafts: the drafts step (the speculative sequences' drafts, continuing their state).
        slots: ``[Ss] int64``, the speculative sequences' state slots.
        checkpoint_slots: ``[Ss] int64``, where each one's state after its tail is copied.
    """

    head_rows: torch.Tensor
    draft_rows: torch.Tensor
    heads: "StepMetadata"
    drafts: "StepMetadata"
    slots: torch.Tensor
    checkpoint_slots: torch.Tensor

    def checkpoint(self, cache: KdaLayerCache) -> None:
        """Copy every field of one KDA layer (conv tail, recurrent state, CF-BI open rows when kept)
        from each speculative sequence's slot to its checkpoint slot (none in a per-token-states split)."""
        if not self.slots.numel():
            return
        for field in fields(cache):
            view = getattr(cache, field.name)
            if view is not None:
                view[self.checkpoint_slots] = view[self.slots]


@dataclass(frozen=True)
class SplitPlan:
    """The host side of a ``SpecSplit``: the sub-steps and the index lists its tensors are built from."""

    head_steps: list["SequenceStep"]
    draft_steps: list["SequenceStep"]
    head_rows: list[int]
    draft_rows: list[int]
    slots: list[int]
    checkpoint_slots: list[int]

    def indices(self) -> list[int]:
        """Every index list, concatenated (one host-to-device copy; ``SpecSplit`` views it)."""
        return self.head_rows + self.draft_rows + self.slots + self.checkpoint_slots


def plan_split(steps: list["SequenceStep"]) -> SplitPlan | None:
    """Split a step's sequences into heads and drafts, or None when no sequence has drafts.

    Raises:
        ValueError: a draft count outside ``[0, len(token_ids))`` (a verify step needs at least one
            tail token before its drafts), a speculative sequence without a checkpoint slot, or a
            checkpoint slot that is some sequence's slot or another's checkpoint.
    """
    if not any(step.num_draft for step in steps):  # the plain step's whole cost here
        return None
    if any(step.draft_slots for step in steps):
        return _plan_states_split(steps)
    plan = SplitPlan([], [], [], [], [], [])
    start = 0
    for seq, step in enumerate(steps):
        if not 0 <= step.num_draft < len(step.token_ids):
            raise ValueError(
                f"steps[{seq}].num_draft: {step.num_draft} drafts in {len(step.token_ids)} tokens; it "
                "must be in [0, len(token_ids)) (at least one tail token precedes the drafts)"
            )
        head = len(step.token_ids) - step.num_draft
        plan.head_steps.append(
            replace(step, token_ids=step.token_ids[:head], num_draft=0, checkpoint_slot=-1)
        )
        plan.head_rows.extend(range(start, start + head))
        if step.num_draft:
            if step.checkpoint_slot < 0:
                raise ValueError(
                    f"steps[{seq}].checkpoint_slot: a sequence with drafts needs a checkpoint slot, got "
                    f"{step.checkpoint_slot}"
                )
            drafts = replace(
                step, token_ids=step.token_ids[head:], past=step.past + head, num_draft=0, checkpoint_slot=-1
            )
            plan.draft_steps.append(drafts)
            plan.draft_rows.extend(range(start + head, start + len(step.token_ids)))
            plan.slots.append(step.slot)
            plan.checkpoint_slots.append(step.checkpoint_slot)
        start += len(step.token_ids)
    taken = {step.slot for step in steps}
    if len(set(plan.checkpoint_slots)) < len(plan.checkpoint_slots) or taken & set(plan.checkpoint_slots):
        raise ValueError(
            f"steps[*].checkpoint_slot: checkpoint slots {plan.checkpoint_slots} must be distinct and none "
            f"may be a sequence's slot ({sorted(taken)})"
        )
    return plan


def _plan_states_split(steps: list["SequenceStep"]) -> SplitPlan | None:
    """A step whose drafts keep per-token states: split only around a chunk longer than the recurrent
    kernel takes (see the module docstring), else None.

    Raises:
        ValueError: a sequence with drafts whose ``draft_slots`` are not one per draft, a checkpoint slot
            beside them, or draft slots that are not distinct or are some sequence's own slot.
    """
    taken, named = {step.slot for step in steps}, []
    for seq, step in enumerate(steps):
        if len(step.draft_slots) != step.num_draft or step.checkpoint_slot >= 0:
            raise ValueError(
                f"steps[{seq}].draft_slots: {len(step.draft_slots)} slots for {step.num_draft} drafts (and "
                f"checkpoint_slot {step.checkpoint_slot}); a step keeping per-token states needs one slot "
                "per draft and no checkpoint slot"
            )
        if step.num_draft >= len(step.token_ids):
            raise ValueError(
                f"steps[{seq}].num_draft: {step.num_draft} drafts in {len(step.token_ids)} tokens"
            )
        named.extend(step.draft_slots)
    if len(set(named)) < len(named) or taken & set(named):
        raise ValueError(
            f"steps[*].draft_slots: {named} must be distinct and none may be a sequence's slot "
            f"({sorted(taken)})"
        )
    if max(len(step.token_ids) for step in steps) <= RECURRENT_MAX_QUERY_LEN:
        return None
    plan = SplitPlan([], [], [], [], [], [])
    start = 0
    for step in steps:
        rows = range(start, start + len(step.token_ids))
        (plan.draft_rows if step.num_draft else plan.head_rows).extend(rows)
        (plan.draft_steps if step.num_draft else plan.head_steps).append(step)
        start += len(step.token_ids)
    return plan if plan.head_steps and plan.draft_steps else None
