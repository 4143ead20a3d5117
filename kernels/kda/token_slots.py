"""Per-token state slots: where a step keeps the KDA state after each of a sequence's tokens.

Speculative verification (``--kda-rollback states``) runs a sequence's tail and its ``k`` drafts in one
step and must be able to continue from the state after any accepted draft. The short conv and the
recurrence therefore take ``token_slots [S, T]`` (int32) beside the sequences' own ``slots [S]``::

    row s:   | own own ... own | p0 p1 ... p(k-1) | (padding, unread) |
    tokens:  | tail (h_s >= 1) | drafts           |

The own slot is read as the starting state and ends holding the state after the tail's last token
(the last own column); column ``h_s + j`` names the slot that receives the state after draft ``j``.
Committing ``a`` accepted drafts then copies slot ``p(a-1)`` into the own slot (none for ``a = 0``). A
row of a sequence without drafts is all own columns: the step then equals one without ``token_slots``.
"""

import torch


def own_lengths(token_slots: torch.Tensor, slots: torch.Tensor, cu_seqlens: torch.Tensor) -> list[int]:
    """Each sequence's leading own columns ``h_s`` (host side; the references' check of the contract).

    Raises:
        ValueError: a row narrower than its sequence, a sequence whose first column is not its own slot,
            or an own column after another slot's.
    """
    bounds, own = cu_seqlens.tolist(), slots.tolist()
    rows = token_slots.tolist()
    lengths = []
    for seq, slot in enumerate(own):
        count = bounds[seq + 1] - bounds[seq]
        row = rows[seq]
        if len(row) < count:
            raise ValueError(f"token_slots[{seq}]: {len(row)} columns for {count} tokens")
        if count == 0:
            lengths.append(0)
            continue
        if row[0] != slot:
            raise ValueError(f"token_slots[{seq}][0]: {row[0]}, expected the sequence's own slot {slot}")
        length = next((t for t in range(count) if row[t] != slot), count)
        if slot in row[length:count]:
            raise ValueError(f"token_slots[{seq}]: the own slot {slot} after another slot's column")
        lengths.append(length)
    return lengths
