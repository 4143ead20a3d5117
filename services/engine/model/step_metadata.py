"""The step contract: one batch's inputs and attention metadata, built once per step, read by every layer.

```
 rows:             | seq 0: 5 new tokens | seq 1: 1 token | seq 2: 3 new tokens |
 query_start_loc:    0                     5                6                      9
 positions:          past0 .. past0+4      past1            past2 .. past2+2
 query_seq:          0 0 0 0 0             1                2 2 2
 slot_mapping:       block_tables[s][p // B] * B + p % B   for each row's (s, p)
```
A step with drafts (``SequenceStep.num_draft``: a speculative decoding verify step) also carries a
``SpecSplit`` (``spec_split``) for the KDA layers; a step without any keeps ``spec`` None.

The host builds every integer field into one byte buffer (pinned when the device is a GPU) and copies
it to the device once; the device fields are views into that copy. Layers never loop over sequences
on the fast path and never read a device value back; the ``*_host`` tuples are there for the
``reference`` backend (the oracle and CPU path), which may loop over sequences.
"""

from dataclasses import dataclass

import numpy as np
import torch

from .spec_split import SpecSplit, plan_split


@dataclass(frozen=True)
class SequenceStep:
    """One sequence's part of a step (host side).

    Attributes:
        token_ids: the new tokens (at least one).
        past: tokens already in the cache before this step.
        block_table: block ids covering every position this step writes.
        slot: the sequence's KDA state slot.
        adapter: the sequence's LoRA adapter slot (``AdapterRegistry``), 0 for the base model.
        num_draft: the last ``num_draft`` of ``token_ids`` are drafts to verify (0: an ordinary chunk);
            at least one token (the tail) precedes them.
        checkpoint_slot: with drafts (``--kda-rollback replay``), the state slot each KDA layer copies the
            sequence's state into once the tail is processed, before the drafts (``SpecSplit``); -1 without.
        draft_slots: with drafts (``--kda-rollback states``), the slot that receives the KDA state after
            each draft (one per draft; ``kernels/kda/token_slots.py``), the own slot keeping the state
            after the tail; empty without.
    """

    token_ids: tuple[int, ...]
    past: int
    block_table: tuple[int, ...]
    slot: int
    adapter: int = 0
    num_draft: int = 0
    checkpoint_slot: int = -1
    draft_slots: tuple[int, ...] = ()

    def token_slots(self, width: int) -> list[int]:
        """This sequence's row of ``StepMetadata.kda_token_slots``: the own slot for the tail (and the
        padding past its tokens), then ``draft_slots``."""
        tail = len(self.token_ids) - len(self.draft_slots)
        return [self.slot] * tail + list(self.draft_slots) + [self.slot] * (width - len(self.token_ids))


@dataclass(frozen=True)
class StepMetadata:
    """One step's device tensors (``N`` new tokens of ``S`` sequences) and their host-side sizes.

    Device tensors:
        input_ids: ``[N] int64``.
        positions: ``[N] int32``, each token's position in its sequence.
        logit_rows: ``[R] int64``, rows whose next-token logits the step wants.
        slot_mapping: ``[N] int64``, ``block * block_size + offset`` where each new token's cache row goes.
        query_start_loc: ``[S + 1] int32``, rows of sequence ``s`` are ``[qsl[s], qsl[s + 1])`` (cu_seqlens).
        seq_lens: ``[S] int32``, cached tokens once this step is written.
        past_lens: ``[S] int32``, cached tokens before this step.
        query_seq: ``[N] int32``, the sequence of each row.
        block_tables: ``[S, max_blocks] int32``, padded with block 0 (never read past ``seq_lens``).
        kda_slots: ``[S] int32``, each sequence's KDA state slot.
        has_state: ``[S] bool``, whether the slot holds state to continue (``past_lens > 0``).
        adapter_ids: ``[N] int32``, each row's LoRA adapter slot (0: the base model).
        kda_token_slots: ``[S, max_query_len] int32`` where the KDA layers keep the state after each
            token (``SequenceStep.token_slots``) when some sequence has ``draft_slots``, else None.
        packed: the device bytes every tensor above views (a CUDA graph's static buffer is refilled
            through it: ``build_step_metadata(..., out=meta.packed)``).

    Host values:
        block_size: tokens per block.
        max_query_len: most new tokens of one sequence.
        max_seq_len: an upper bound on ``seq_lens`` (exact in eager steps; the capture bound in a
            CUDA graph, where it must not change between replays).
        num_decode_tokens: sequences with exactly one new token after a cached prefix.
        index_topk: the DSA indexer's top-k budget (0 without an indexer).
        query_start_loc_host, past_lens_host, block_tables_host, kda_slots_host: host copies for the
            ``reference`` backend (block tables unpadded).
        seq_adapters_host: each sequence's adapter slot; the model groups rows by it once per step.
        spec: the KDA layers' split of a step with drafts, None when no sequence has drafts.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    logit_rows: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    past_lens: torch.Tensor
    query_seq: torch.Tensor
    block_tables: torch.Tensor
    kda_slots: torch.Tensor
    adapter_ids: torch.Tensor
    has_state: torch.Tensor
    packed: torch.Tensor
    block_size: int
    max_query_len: int
    max_seq_len: int
    num_decode_tokens: int
    index_topk: int
    query_start_loc_host: tuple[int, ...]
    past_lens_host: tuple[int, ...]
    block_tables_host: tuple[tuple[int, ...], ...]
    kda_slots_host: tuple[int, ...]
    seq_adapters_host: tuple[int, ...] = ()
    spec: SpecSplit | None = None
    kda_token_slots: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc_host[-1]

    @property
    def num_seqs(self) -> int:
        return len(self.past_lens_host)

    @property
    def any_fresh(self) -> bool:
        """Some sequence starts without state (a False in ``has_state``); host side, so kernels can skip
        work for fresh slots without reading the device. In a CUDA graph it is the capture's value."""
        return any(past == 0 for past in self.past_lens_host)

    @property
    def is_pure_decode(self) -> bool:
        """Every sequence brings exactly one token after a cached prefix (what CUDA graphs replay)."""
        return self.num_decode_tokens == self.num_seqs

    def rows(self, seq: int) -> slice:
        """Rows of sequence ``seq`` (host side)."""
        return slice(self.query_start_loc_host[seq], self.query_start_loc_host[seq + 1])

    def seq_len(self, seq: int) -> int:
        """Cached tokens of sequence ``seq`` once this step is written (host side)."""
        return self.past_lens_host[seq] + self.query_start_loc_host[seq + 1] - self.query_start_loc_host[seq]


# Fields in buffer order: int64 first, then int32, then bool, so every view is aligned.
_INT64 = ("input_ids", "slot_mapping", "logit_rows")
_INT32 = (
    "positions",
    "query_start_loc",
    "seq_lens",
    "past_lens",
    "query_seq",
    "block_tables",
    "kda_slots",
    "adapter_ids",
    "kda_token_slots",  # only in a step with draft slots
)


def build_step_metadata(
    steps: list[SequenceStep],
    block_size: int,
    device: str | torch.device,
    logit_rows: list[int] | None = None,
    index_topk: int = 0,
    max_blocks: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    token_slots: bool = False,
) -> StepMetadata:
    """Build a step's metadata on the host and copy it to ``device`` in one transfer.

    Args:
        steps: the step's sequences, in row order.
        block_size: tokens per block.
        device: where the tensors go.
        logit_rows: rows whose logits are wanted (default: every sequence's last row).
        index_topk: the DSA budget to record.
        max_blocks: width of ``block_tables`` (default: the widest table this step needs); CUDA graphs
            pass a fixed width.
        max_seq_len: the bound to record (default: the exact maximum).
        out: a device byte buffer of exactly the packed size to copy into (CUDA graphs' static
            buffer); a fresh one is allocated when None.
        token_slots: build ``kda_token_slots`` even when no sequence has ``draft_slots`` (verify graphs
            capture a step of padding sequences; the field must be in their static buffer).

    Raises:
        ValueError: no sequence, a sequence without new tokens, a block table too short for the
            positions it must hold, or drafts without a valid checkpoint slot (``plan_split``).
    """
    if not steps:
        raise ValueError("steps: a step needs at least one sequence")
    starts, ids, positions, query_seq, slot_mapping, tables = [0], [], [], [], [], []
    adapter_ids = []
    for seq, step in enumerate(steps):
        if not step.token_ids:
            raise ValueError(f"steps[{seq}]: every sequence in a step needs at least one new token")
        total = step.past + len(step.token_ids)
        needed = -(-total // block_size)
        if len(step.block_table) < needed:
            raise ValueError(
                f"steps[{seq}]: block table holds {len(step.block_table)} blocks, "
                f"{total} tokens need {needed}"
            )
        tables.append(tuple(step.block_table[:needed]))
        ids.extend(step.token_ids)
        for position in range(step.past, total):
            positions.append(position)
            query_seq.append(seq)
            adapter_ids.append(step.adapter)
            slot_mapping.append(step.block_table[position // block_size] * block_size + position % block_size)
        starts.append(len(ids))
    width = max_blocks if max_blocks is not None else max(len(t) for t in tables)
    if width < max(len(t) for t in tables):
        raise ValueError(f"max_blocks: {width} is narrower than the widest block table this step needs")
    past = [step.past for step in steps]
    lens = [step.past + len(step.token_ids) for step in steps]
    values = {
        "input_ids": ids,
        "slot_mapping": slot_mapping,
        "logit_rows": [end - 1 for end in starts[1:]] if logit_rows is None else logit_rows,
        "positions": positions,
        "query_start_loc": starts,
        "seq_lens": lens,
        "past_lens": past,
        "query_seq": query_seq,
        "block_tables": _padded_rows(tables, width),
        "kda_slots": [step.slot for step in steps],
        "adapter_ids": adapter_ids,
    }
    query_len = max(len(step.token_ids) for step in steps)
    if token_slots or any(step.draft_slots for step in steps):
        values["kda_token_slots"] = [slot for step in steps for slot in step.token_slots(query_len)]
    device = torch.device(device)
    host = _pack(values, [p > 0 for p in past], device.type == "cuda")
    if out is None:
        out = torch.empty(host.shape[0], dtype=torch.uint8, device=device)
    elif out.shape != host.shape:
        raise ValueError(f"out: expected {host.shape[0]} bytes for this step's shape, got {out.shape[0]}")
    out.copy_(host, non_blocking=True)
    views = _unpack(out, {name: len(v) for name, v in values.items()})
    views["block_tables"] = views["block_tables"].view(len(steps), width)
    if "kda_token_slots" in views:
        views["kda_token_slots"] = views["kda_token_slots"].view(len(steps), query_len)
    return StepMetadata(
        **views,
        has_state=out[out.shape[0] - len(steps) :].view(torch.bool),
        packed=out,
        block_size=block_size,
        max_query_len=query_len,
        max_seq_len=max(lens) if max_seq_len is None else max_seq_len,
        num_decode_tokens=sum(1 for step in steps if len(step.token_ids) == 1 and step.past > 0),
        index_topk=index_topk,
        query_start_loc_host=tuple(starts),
        past_lens_host=tuple(past),
        block_tables_host=tuple(tables),
        kda_slots_host=tuple(step.slot for step in steps),
        seq_adapters_host=tuple(step.adapter for step in steps),
        spec=_spec_split(steps, block_size, device, index_topk),
    )


def _spec_split(
    steps: list[SequenceStep], block_size: int, device: torch.device, index_topk: int
) -> SpecSplit | None:
    plan = plan_split(steps)
    if plan is None:
        return None
    host = torch.tensor(plan.indices(), dtype=torch.int64)
    indices = host.pin_memory() if device.type == "cuda" else host
    head_rows, draft_rows, slots, checkpoint_slots = indices.to(device, non_blocking=True).split(
        [len(plan.head_rows), len(plan.draft_rows), len(plan.slots), len(plan.checkpoint_slots)]
    )
    return SpecSplit(
        head_rows=head_rows,
        draft_rows=draft_rows,
        heads=build_step_metadata(plan.head_steps, block_size, device, index_topk=index_topk),
        drafts=build_step_metadata(plan.draft_steps, block_size, device, index_topk=index_topk),
        slots=slots,
        checkpoint_slots=checkpoint_slots,
    )


def _padded_rows(tables: list[tuple[int, ...]], width: int) -> np.ndarray:
    """The block tables as one flat int32 array of ``width``-wide rows, zero padded.

    Row by row through numpy, not one Python list of every entry: at batch 64 and 32K tokens a step's
    tables are 131K ids, which a flattened list and ``torch.tensor`` took ~70 ms a step to pack on the
    host (docs/performance.md, "Eight-GPU layouts").
    """
    rows = np.zeros((len(tables), width), dtype=np.int32)
    for row, table in zip(rows, tables, strict=True):
        row[: len(table)] = table
    return rows.reshape(-1)


def _pack(values: dict[str, list[int] | np.ndarray], has_state: list[bool], pin: bool) -> torch.Tensor:
    parts = [torch.as_tensor(values[name], dtype=torch.int64).view(torch.uint8) for name in _INT64]
    parts += [
        torch.as_tensor(values[name], dtype=torch.int32).view(torch.uint8)
        for name in _INT32
        if name in values
    ]
    parts.append(torch.tensor(has_state, dtype=torch.bool).view(torch.uint8))
    host = torch.cat(parts)
    return host.pin_memory() if pin else host


def _unpack(buffer: torch.Tensor, lengths: dict[str, int]) -> dict[str, torch.Tensor]:
    views, offset = {}, 0
    for names, dtype in ((_INT64, torch.int64), (_INT32, torch.int32)):
        for name in (name for name in names if name in lengths):
            size = lengths[name] * dtype.itemsize
            views[name] = buffer[offset : offset + size].view(dtype)
            offset += size
    return views
