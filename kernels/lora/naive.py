"""Float32 reference of the segmented LoRA delta (``segmented.lora_delta_segmented``): a loop over slots.

``delta[n] = (x[n] @ A[s]^T) @ B[s]^T`` with ``s = slots[n]``, both products accumulated in float32;
rows with ``s < 0`` get zeros. Ranks are zero-padded to a common ``R`` in the stacks (zero columns add
nothing).
"""

import torch


def lora_delta_reference(
    x: torch.Tensor, slots: torch.Tensor, a_stack: torch.Tensor, b_stack: torch.Tensor
) -> torch.Tensor:
    """Per-row LoRA delta, one slot at a time.

    Args:
        x: ``[N, K]`` rows, any float dtype.
        slots: ``[N]`` int, each row's index into the stacks, -1 for none.
        a_stack: ``[S, R, K]`` float32.
        b_stack: ``[S, M, R]`` float32.

    Returns:
        ``[N, M]`` float32.
    """
    out = torch.zeros(x.shape[0], b_stack.shape[1], dtype=torch.float32, device=x.device)
    for slot in torch.unique(slots).tolist():
        if slot < 0:
            continue
        rows = (slots == slot).nonzero()[:, 0]
        h = x[rows].float() @ a_stack[slot].float().T
        out[rows] = h @ b_stack[slot].float().T
    return out
