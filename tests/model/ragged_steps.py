"""Ragged steps on a paged cache, for comparing kernel backends layer by layer (CPU and GPU tests).

The steps mix what a serving batch holds: prefill chunks, a chunk continuing a cached prefix,
single-token decodes and a sequence sitting a step out. The cache has small blocks handed out
round-robin, so every sequence's block table is scattered (multi-block, non-contiguous ids)::

    step 0: seq0 [0, 13)   seq1 [0, 1)    seq2 [0, 30)     prefill chunks
    step 1: seq0 [13, 30)  seq1 decode    seq2 sits out    a chunk after a cached prefix
    step 2: seq0 decode    seq1 decode    seq2 decode      pure decode
    step 3: seq0 decode    seq1 [3, 20)   seq2 decode      decodes around a chunk
"""

import torch

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.cache.state_pool import StateSlotPool
from services.engine.model import SequenceStep, build_step_metadata
from services.engine.model.backends import KernelSet

BLOCK = 8


def ragged_chunks(seed: int = 5) -> list[list[list[int]]]:
    """``chunks[step][seq]``: the new tokens of each sequence in each step (empty: sits the step out)."""
    ids = torch.randint(0, 1024, (3, 40), generator=torch.Generator().manual_seed(seed)).tolist()
    return [
        [ids[0][:13], ids[1][:1], ids[2][:30]],
        [ids[0][13:30], ids[1][1:2], []],
        [ids[0][30:31], ids[1][2:3], ids[2][30:31]],
        [ids[0][31:32], ids[1][3:20], ids[2][31:32]],
    ]


def run_ragged(
    model,
    kernels: KernelSet,
    chunks: list[list[list[int]]],
    kv_format: str = "auto",
    forced_inputs: list[list[torch.Tensor]] | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor, list[list[torch.Tensor]]]:
    """Run ``chunks`` with ``kernels`` on a fresh paged cache in ``kv_format``.

    ``forced_inputs`` (another run's ``inputs``): every decoder layer takes that run's input of each
    step instead of its predecessor's output, and its MLP that run's MLP input instead of what this
    run's attention gave it, so each layer's attention and MLP are compared on equal input (a
    model-dtype difference upstream, or in the layer's own attention, cannot flip a DSA or expert top-k
    and show up as this layer's error: a bf16 attention's rounding flipped one row's experts in k3's
    last layer, a 0.5 relative error on that row).

    Returns:
        ``(layers, logits, inputs)``: every decoder layer's output rows of all steps (float32,
        ``[rows, D]`` each), the logits of every row (float32), and the inputs per step (in the model
        dtype, for ``forced_inputs``): the layers' (``inputs[i]``), then their MLPs'
        (``inputs[len(layers) + i]``).
    """
    model.kernels = kernels
    weight = model.lm_head.weight
    dtype, device = weight.dtype, weight.device
    seqs = len(chunks[0])
    totals = [sum(len(step[seq]) for step in chunks) for seq in range(seqs)]
    needed = [-(-total // BLOCK) for total in totals]
    layout = block_layout(model.config, BLOCK, dtype, kv_format)
    blocks = BlockPool(layout, BLOCK, num_blocks=sum(needed) + 1, device=device)
    slots = StateSlotPool(slot_layout(model.config, dtype), num_slots=seqs + 1, device=device)
    blocks.allocate(1)  # no table starts at block 0 (the padding id of block tables)
    slots.allocate()
    tables: list[list[int]] = [[] for _ in range(seqs)]
    for round_ in range(max(needed)):  # round-robin: each table scattered over the pool
        for seq in range(seqs):
            if round_ < needed[seq]:
                tables[seq] += blocks.allocate(1)
    seq_slots = [slots.allocate() for _ in range(seqs)]
    cache = PagedModelCache(blocks, slots, model.config, dtype)
    outputs: list[list[torch.Tensor]] = [[] for _ in model.model.layers]
    inputs: list[list[torch.Tensor]] = [[] for _ in range(2 * len(model.model.layers))]

    def take_input(index, args):
        if forced_inputs is not None:
            args = (forced_inputs[index][len(inputs[index])], *args[1:])
        inputs[index].append(args[0])
        return args

    hooks = (
        [
            layer.register_forward_hook(lambda _m, _a, out, i=i: outputs[i].append(out.float()))
            for i, layer in enumerate(model.model.layers)
        ]
        + [
            layer.register_forward_pre_hook(lambda _m, args, i=i: take_input(i, args))
            for i, layer in enumerate(model.model.layers)
        ]
        + [
            layer.mlp.register_forward_pre_hook(lambda _m, args, i=i: take_input(len(outputs) + i, args))
            for i, layer in enumerate(model.model.layers)
        ]
    )
    past, logits = [0] * seqs, []
    try:
        with torch.no_grad():
            for pieces in chunks:
                steps = [
                    SequenceStep(tuple(piece), past[seq], tuple(tables[seq]), seq_slots[seq])
                    for seq, piece in enumerate(pieces)
                    if piece
                ]
                rows = list(range(sum(len(p) for p in pieces)))
                meta = build_step_metadata(steps, BLOCK, device, logit_rows=rows, index_topk=model.index_topk)
                logits.append(model.forward_step(meta, cache).float())
                past = [p + len(piece) for p, piece in zip(past, pieces, strict=True)]
    finally:
        for hook in hooks:
            hook.remove()
    return [torch.cat(o) for o in outputs], torch.cat(logits), inputs
