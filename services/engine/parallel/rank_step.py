"""``RankStep``: what rank 0 sends its followers per engine step so they run the same forward.

Rank 0 alone schedules and samples; a follower holds only its shard of the weights and of the cache
pools. The smallest thing that lets it run the step rank 0 runs is the host side of the step, the
list of ``SequenceStep`` entries the model runner turns into ``StepMetadata`` (token ids, past
lengths, block tables, KDA slots) and which rows' logits are wanted, plus the KDA state copies the
cache manager made since the last step (snapshot saves and restores move bytes between a request's
state slot and the snapshot pool, and every rank holds its own shard of those bytes)::

    rank 0:   schedule -> [state copies] + steps -> broadcast -> metadata -> forward -> sample
    rank k:                                 receive -> copies -> metadata -> forward (logits unused)

The message goes over a gloo group (host memory, also beside NCCL on GPUs) as one pickled object;
``None`` tells the followers to stop. The same group carries the handoff's messages
(``rank_handoff.py``), which every follower answers to rank 0 (``answer_rank_0`` / ``gather_answers``).
"""

from dataclasses import dataclass

import torch.distributed as dist

from services.engine.model.step_metadata import SequenceStep

SAVE = "save"  # state slot -> snapshot slot
RESTORE = "restore"  # snapshot slot -> state slot


@dataclass(frozen=True)
class StateCopy:
    """One KDA state copy between a request's slot and a snapshot slot, by physical index.

    Attributes:
        kind: ``SAVE`` (slot bytes into the snapshot) or ``RESTORE`` (snapshot bytes into the slot).
        slot: the index in the state-slot pool.
        snapshot: the index in the snapshot store's pool.
    """

    kind: str
    slot: int
    snapshot: int


@dataclass(frozen=True)
class RankStep:
    """One engine step as a follower runs it.

    Attributes:
        state_copies: KDA state copies to apply first, in the order rank 0 made them.
        steps: the step's sequences, in row order (``build_step_metadata``'s input).
        logit_rows: the rows whose logits the step computes (the sampling rows).
    """

    state_copies: tuple[StateCopy, ...]
    steps: tuple[SequenceStep, ...]
    logit_rows: tuple[int, ...]


def send_step(step: object, group: dist.ProcessGroup) -> None:
    """Rank 0: broadcast ``step`` (a ``RankStep``, a handoff message, or None: stop) to every rank of
    ``group``."""
    dist.broadcast_object_list([step], src=0, group=group)


def receive_step(group: dist.ProcessGroup) -> object:
    """A follower: wait for rank 0's next message (a ``RankStep``, a handoff message; None: stop)."""
    box = [None]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def answer_rank_0(answer: object, group: dist.ProcessGroup) -> None:
    """A follower: send its answer to the message just received (``gather_answers`` on rank 0)."""
    dist.gather_object(answer, None, dst=0, group=group)


def gather_answers(own: object, group: dist.ProcessGroup) -> list:
    """Rank 0: every rank's answer, in rank order (``own`` is rank 0's)."""
    answers = [None] * dist.get_world_size(group)
    dist.gather_object(own, answers, dst=0, group=group)
    return answers
