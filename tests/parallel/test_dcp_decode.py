"""DCP decode of tiny DeepSeek-V3.2 (MLA + DSA) and K3 (KDA + MLA + DSA) models on 4 gloo ranks, each
model loaded with its rank's ``ParallelContext``: DCP 2 (ranks 0 and 1) and DCP 4 give the logits of
DCP 1 (rank 0) within 1e-5 (float32), every rank of a group the same bits, each rank's pool holding
exactly its own tokens, and the indexer's exchanges counted.

Steps: a prefill of 21 and 4 tokens, a 5-token chunk of the second after its cached 4, then two decode
steps of both; the tiny preset's ``index_topk`` is 16, so every row past position 15 attends a strict
subset chosen by the distributed top-k.
"""

import pytest
import torch
import torch.distributed as dist

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import LATENT, block_layout, slot_layout
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.loader import load_model
from services.engine.model import SequenceStep, build_step_metadata
from services.engine.parallel.context import ParallelContext, build_parallel_context
from services.engine.parallel.dcp_indexer import DcpIndexer
from services.engine.parallel.layout import ParallelLayout
from tests.parallel.gloo_ranks import run_ranks
from tests.relative_error import relative_error  # not conftest: the spawned ranks import this module

WORLD = 4
BLOCK = 4  # tokens per block of a rank's pool
FAMILIES = ("deepseek_v32", "k3")
# chunks[step][seq]: new tokens (empty: the sequence sits the step out)
CHUNKS = [[21, 4], [0, 5], [1, 1], [1, 1]]


def _token_ids(seed: int = 3) -> list[list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (2, 40), generator=gen).tolist()
    used, steps = [0, 0], []
    for counts in CHUNKS:
        steps.append([ids[seq][used[seq] : used[seq] + n] for seq, n in enumerate(counts)])
        used = [u + n for u, n in zip(used, counts, strict=True)]
    return steps


def _run(model) -> tuple[torch.Tensor, PagedModelCache, DcpIndexer | None]:
    """Every step's logits (float32) on a fresh pool of ``BLOCK``-token blocks, tables shared by the
    ranks and built for the virtual block size ``dcp * BLOCK``."""
    virtual = model.parallel.layout.dcp * BLOCK
    chunks = _token_ids()
    totals = [sum(len(step[seq]) for step in chunks) for seq in range(2)]
    needed = [-(-t // virtual) for t in totals]
    weight = model.lm_head.weight
    blocks = BlockPool(block_layout(model.config, BLOCK, weight.dtype), BLOCK, sum(needed) + 1, weight.device)
    slots = StateSlotPool(slot_layout(model.config, weight.dtype), 3, weight.device)
    blocks.allocate(1)  # block 0 stays padding
    slots.allocate()
    tables = [tuple(blocks.allocate(n)) for n in needed]  # the same ids on every rank
    seq_slots = [slots.allocate() for _ in range(2)]
    cache = PagedModelCache(blocks, slots, model.config, weight.dtype)
    past, logits = [0, 0], []
    with torch.no_grad():
        for pieces in chunks:
            steps = [
                SequenceStep(tuple(p), past[s], tables[s], seq_slots[s]) for s, p in enumerate(pieces) if p
            ]
            meta = build_step_metadata(steps, virtual, weight.device, index_topk=model.index_topk)
            logits.append(model.forward_step(meta, cache).float())
            past = [n + len(p) for n, p in zip(past, pieces, strict=True)]
    indexer = model.kernels.indexer if isinstance(model.kernels.indexer, DcpIndexer) else None
    return torch.cat(logits), cache, indexer


def _written_rows(cache: PagedModelCache, layer: int) -> int:
    """How many latent rows of the pool hold anything (the pool starts zeroed)."""
    view = cache.blocks.view(layer, LATENT)
    return int((view != 0).any(-1).sum())


def _rank_body(rank: int, size: int, checkpoints: dict) -> dict:
    """DCP 1 on rank 0, DCP 2 on ranks 0 and 1, DCP 4 on all: each layout runs once."""
    pair = dist.new_group([0, 1])
    contexts = {4: build_parallel_context(ParallelLayout(dcp=4))}
    if rank < 2:  # a DCP 2 layout's context, its group a sub-group of this 4-rank world
        contexts[2] = ParallelContext(ParallelLayout(dcp=2), rank, dcp_group=pair)
    if rank == 0:
        contexts[1] = ParallelContext.single()
    results = {}
    for family, path in checkpoints.items():
        for dcp, context in contexts.items():
            model = load_model(path, dtype=torch.float32, parallel=context)
            logits, cache, indexer = _run(model)
            mla_layer = next(i for i, layer in enumerate(model.model.layers) if not layer.is_kda)
            results[(family, dcp)] = {
                "logits": logits,
                "rows": _written_rows(cache, mla_layer),
                "stats": None if indexer is None else indexer.stats,
            }
    try:
        model.set_batch_invariant(True)  # the last model ran as a DCP 4 rank on every rank but 0
    except ValueError as error:
        results["invariant_refusal"] = str(error)
    return results


@pytest.fixture(scope="module")
def rank_results(tiny_checkpoint):
    return run_ranks(_rank_body, WORLD, {family: tiny_checkpoint(family) for family in FAMILIES})


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dcp", [2, 4], ids=lambda d: f"dcp{d}")
def test_dcp_logits_match_one_rank(rank_results, family, dcp):
    want = rank_results[0][(family, 1)]["logits"]
    for rank in range(dcp):
        got = rank_results[rank][(family, dcp)]["logits"]
        assert got.shape == want.shape
        err = relative_error(got, want)
        print(f"{family} dcp{dcp} rank {rank}: logits relative error {err:.2e}")
        assert err <= 1e-5, f"rank {rank}: relative error {err:.2e}"
        assert torch.equal(got, rank_results[0][(family, dcp)]["logits"]), "a DCP group's ranks differ"


@pytest.mark.parametrize("family", FAMILIES)
def test_each_rank_stores_only_its_tokens(rank_results, family):
    totals = [sum(n for n, _ in CHUNKS), sum(n for _, n in CHUNKS)]
    assert rank_results[0][(family, 1)]["rows"] == sum(totals)
    for dcp in (2, 4):
        for rank in range(dcp):
            mine = sum(len(range(rank, total, dcp)) for total in totals)
            assert rank_results[rank][(family, dcp)]["rows"] == mine, f"dcp {dcp} rank {rank}"


def test_indexer_exchanges_are_counted(rank_results):
    for family in FAMILIES:
        assert rank_results[0][(family, 1)]["stats"] is None  # dcp 1: today's indexer, no exchange
        for dcp in (2, 4):
            stats = rank_results[0][(family, dcp)]["stats"]
            print(family, f"dcp{dcp}", stats)
            assert stats.calls > 0 and stats.rounds == stats.calls + stats.refills


def test_batch_invariant_dcp_is_refused_naming_the_flags(rank_results):
    message = rank_results[WORLD - 1]["invariant_refusal"]
    assert "--dcp 4" in message and "--batch-invariant" in message
