"""The rank side of ``test_dcp_with_pcp_pp.py``: what each of the 4 gloo ranks runs (DCP 2 x PCP 2 and
DCP 2 x PP 2, each on all 4 ranks, and one rank's reference on rank 0), in a module the spawned ranks
import without the test suite's ``conftest``.

Every layout runs the engine's path for a PCP / PP rank (``SplitStep.forward``) on a fresh paged pool of
``BLOCK``-token blocks whose tables are built for the virtual block size ``dcp * BLOCK``, and returns
each step's logits, what each MLA layer's pool holds at every cached position this rank owns, and how
often the DCP and PCP code paths ran.
"""

import torch
import torch.distributed as dist

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.loader import load_model
from services.engine.model import SequenceStep, build_step_metadata
from services.engine.parallel.context import ParallelContext, build_parallel_context
from services.engine.parallel.dcp_attention import DcpAttention
from services.engine.parallel.dcp_indexer import DcpIndexer
from services.engine.parallel.dcp_shard import DcpShard
from services.engine.parallel.layout import ParallelLayout
from services.engine.parallel.pcp_cache import GatheredDcpAttention, PcpMlaLayerCache
from services.engine.parallel.split_step import SplitStep

WORLD = 4
BLOCK = 4  # tokens per block of a rank's pool
FAMILIES = ("kimi_linear", "deepseek_v32", "k3")
LAYOUTS = {"dcp2_pcp2": ParallelLayout(dcp=2, pcp=2), "dcp2_pp2": ParallelLayout(dcp=2, pp=2)}
# which families run which layouts: PCP all three, PP (no collective of its own inside a stage) K3
RUNS = [(family, "dcp2_pcp2") for family in FAMILIES] + [("k3", "dcp2_pp2")]
# chunks[step][seq]: new tokens (0: the sequence sits the step out). Step 1 splits both prompts over
# the PCP ranks (37 tokens: chunks of 16, 16, 5; 9 tokens: all on PCP rank 0), step 2 continues them,
# step 3 has 7 tokens for one sequence (PCP rank 1 holds no row and only joins the exchanges), then
# a decode step (replicated over the PCP ranks, DCP decode on each).
CHUNKS = [[37, 9], [20, 5], [0, 7], [1, 1]]
COUNTED = (
    (DcpAttention, "forward"),
    (GatheredDcpAttention, "write"),
    (PcpMlaLayerCache, "write"),
    (DcpIndexer, "topk"),
)


def token_ids(seed: int = 7) -> list[list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (len(CHUNKS[0]), 100), generator=gen).tolist()
    used, steps = [0] * len(CHUNKS[0]), []
    for counts in CHUNKS:
        steps.append([ids[seq][used[seq] : used[seq] + n] for seq, n in enumerate(counts)])
        used = [u + n for u, n in zip(used, counts, strict=True)]
    return steps


def totals() -> list[int]:
    return [sum(step[seq] for step in CHUNKS) for seq in range(len(CHUNKS[0]))]


def _cached_rows(model, cache: PagedModelCache, tables, shard: DcpShard, virtual: int) -> dict:
    """``{(layer, field): [P, width]}``: each MLA layer's latent, rope key and index key at every
    position ``p`` this DCP rank owns, per sequence in position order (read through the virtual slots)."""
    out = {}
    for index, layer in enumerate(model.model.layers):
        if getattr(layer, "is_kda", True):
            continue  # a KDA layer, or another stage's (``pipeline._Absent``)
        view = cache.mla(index)
        for field in ("latent", "k_rope", "index_key"):
            tensor = getattr(view, field)
            if tensor is None:
                continue
            parts = []
            for table, total in zip(tables, totals(), strict=True):
                positions = torch.arange(total)
                virtual_slots = torch.tensor(table)[positions // virtual] * virtual + positions % virtual
                owned, local = shard.local_slots(virtual_slots, virtual)
                local = local[owned]
                parts.append(tensor[local // BLOCK, local % BLOCK].clone())
            out[(index, field)] = torch.cat(parts)
    return out


def run_layout(model, context: ParallelContext) -> dict:
    """Every step through ``SplitStep`` (``context`` None: one rank's ``forward_step`` path)."""
    dcp = context.layout.dcp if context is not None else 1
    virtual = dcp * BLOCK
    weight = next(model.parameters())
    needed = [-(-t // virtual) for t in totals()]
    layout = block_layout(model.config, BLOCK, weight.dtype)
    blocks = BlockPool(layout, BLOCK, sum(needed) + 1, weight.device)
    slots = StateSlotPool(slot_layout(model.config, weight.dtype), 3, weight.device)
    blocks.allocate(1)  # block 0 stays padding
    slots.allocate()
    tables = [tuple(blocks.allocate(n)) for n in needed]  # the same ids on every rank
    seq_slots = [slots.allocate() for _ in needed]
    cache = PagedModelCache(blocks, slots, model.config, weight.dtype)
    runner = SplitStep(model, virtual) if context is not None else None
    past, logits = [0] * len(needed), []
    with torch.no_grad():
        for pieces in token_ids():
            steps = [
                SequenceStep(tuple(p), past[s], tables[s], seq_slots[s]) for s, p in enumerate(pieces) if p
            ]
            ends = [sum(len(step.token_ids) for step in steps[: i + 1]) for i in range(len(steps))]
            rows = [end - 1 for end in ends]
            if runner is None:
                meta = build_step_metadata(steps, virtual, weight.device, rows, model.index_topk)
                out = model.forward_step(meta, cache)
            else:
                out = runner.forward(steps, rows, cache)
            logits.append(None if out is None else out.float().clone())
            past = [n + len(p) for n, p in zip(past, pieces, strict=True)]
    shard = DcpShard(context.coordinates.dcp, dcp) if context is not None else DcpShard(0, 1)
    return {"logits": logits, "rows": _cached_rows(model, cache, tables, shard, virtual)}


def _count_calls(counts: dict) -> None:
    """Count the DCP and PCP paths' calls into ``counts`` (a run that skipped them shows as 0)."""
    for cls, name in COUNTED:
        original = cls.__dict__[name]

        def counted(self, *args, _original=original, _key=f"{cls.__name__}.{name}", **kwargs):
            counts[_key] = counts.get(_key, 0) + 1
            return _original(self, *args, **kwargs)

        setattr(cls, name, counted)


def rank_body(rank: int, size: int, checkpoints: dict) -> dict:
    contexts = {name: build_parallel_context(layout) for name, layout in LAYOUTS.items()}
    calls: dict[str, int] = {}
    _count_calls(calls)
    results = {}
    for family, path in checkpoints.items():
        if rank == 0:
            results[(family, "one_rank")] = run_layout(load_model(path, dtype=torch.float32), None)
    for family, name in RUNS:
        calls.clear()
        context = contexts[name]
        model = load_model(
            checkpoints[family], dtype=torch.float32, parallel=context
        )  # PP: the stage's layers
        results[(family, name)] = {**run_layout(model, context), "calls": dict(calls)}
    dist.barrier()
    return results
