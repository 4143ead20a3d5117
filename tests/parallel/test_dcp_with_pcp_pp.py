"""DCP inside PCP and PP in one engine, on 4 gloo ranks (``dcp_mixed_ranks.py``): DCP 2 x PCP 2 for
tiny Kimi-Linear (KDA + MLA), DeepSeek-V3.2 (MLA + DSA) and K3 (KDA + MLA + DSA), DCP 2 x PP 2 for K3,
through ``SplitStep`` as an engine rank runs its steps: ragged PCP prefills (one step with a PCP rank
holding no row), then a DCP decode step replicated over the PCP ranks.

In float32 every step's logits are within 1e-5 of one rank's, every rank of a DCP group gets the same
bits, and each rank's pool holds exactly its DCP rank's tokens (``p % 2``), each within 1e-5 of one
rank's row: the PCP rows were gathered, then kept by DCP owner. The DCP attention, the distributed
top-k and the PCP gathers are counted, so a run that bypassed them fails.
"""

import pytest
import torch

from services.engine.model import load_model_config
from services.engine.model.config import LAYER_KDA
from services.engine.parallel.pipeline import stage_layers
from tests.conftest import relative_error
from tests.parallel.dcp_mixed_ranks import CHUNKS, FAMILIES, LAYOUTS, RUNS, WORLD, rank_body
from tests.parallel.gloo_ranks import run_ranks

PREFILL_STEPS = 3  # CHUNKS' steps with several new tokens for some sequence


@pytest.fixture(scope="module")
def rank_results(tiny_checkpoint):
    return run_ranks(rank_body, WORLD, {family: tiny_checkpoint(family) for family in FAMILIES})


def _logit_ranks(name: str) -> list[int]:
    """The ranks holding every step's logits: all of them under PCP; under PP the last stage's and
    rank 0 (which the last stage's rank of its pipeline sends them to)."""
    return list(range(WORLD)) if name == "dcp2_pcp2" else [0, 2, 3]


@pytest.mark.parametrize(("family", "name"), RUNS, ids=str)
def test_logits_match_one_rank(rank_results, family, name):
    want = rank_results[0][(family, "one_rank")]["logits"]
    assert [w.shape[0] for w in want] == [sum(1 for n in step if n) for step in CHUNKS]
    for rank in _logit_ranks(name):
        got = rank_results[rank][(family, name)]["logits"]
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.shape == w.shape, f"rank {rank} step {step}"
            err = relative_error(g, w)
            assert err <= 1e-5, f"rank {rank} step {step}: relative error {err:.2e}"
            assert torch.equal(g, rank_results[0][(family, name)]["logits"][step]), "ranks differ"


@pytest.mark.parametrize(("family", "name"), RUNS, ids=str)
def test_each_rank_holds_its_dcp_ranks_tokens(rank_results, tiny_checkpoint, family, name):
    layout = LAYOUTS[name]
    types = load_model_config(tiny_checkpoint(family)).layer_types
    reference = rank_results[0][(family, "one_rank")]["rows"]
    totals = [sum(step[seq] for step in CHUNKS) for seq in range(len(CHUNKS[0]))]
    for rank in range(WORLD):
        dcp_rank = layout.coordinates(rank).dcp
        rows = rank_results[rank][(family, name)]["rows"]
        stage = stage_layers(len(types), layout.pp, layout.coordinates(rank).pp)
        assert {layer for layer, _ in rows} == {i for i in stage if types[i] != LAYER_KDA}, rank
        # the one-rank rows at the positions this DCP rank owns, per sequence in position order
        owned = [p for total in totals for p in range(total) if p % 2 == dcp_rank]
        offsets = [0]
        for total in totals:
            offsets.append(offsets[-1] + total)
        index = torch.tensor(
            [offsets[s] + p for s, total in enumerate(totals) for p in range(dcp_rank, total, 2)]
        )
        assert len(owned) == index.numel()
        for key, got in rows.items():
            want = reference[key][index]
            assert got.shape == want.shape, f"rank {rank} {key}"
            assert bool((got != 0).any(-1).all()), f"rank {rank} {key}: a row it owns was not written"
            err = relative_error(got, want)
            assert err <= 1e-5, f"rank {rank} {key}: relative error {err:.2e}"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_dcp_and_pcp_paths_ran(rank_results, tiny_checkpoint, family):
    config = load_model_config(tiny_checkpoint(family))
    mla = sum(kind != LAYER_KDA for kind in config.layer_types)
    for rank in range(WORLD):
        calls = rank_results[rank][(family, "dcp2_pcp2")]["calls"]
        idle = LAYOUTS["dcp2_pcp2"].coordinates(rank).pcp == 1  # holds no row of step 3
        # every prefill step's MLA layers gathered their rows (the idle rank too); the rank attended
        # through DCP attention (and selected by the distributed top-k) in every step it held rows for
        assert calls.get("PcpMlaLayerCache.write") == PREFILL_STEPS * mla, rank
        assert calls.get("GatheredDcpAttention.write") == (PREFILL_STEPS - idle) * mla, rank
        assert calls.get("DcpAttention.forward") == (len(CHUNKS) - idle) * mla, rank
        topk = (len(CHUNKS) - idle) * mla if config.indexer is not None else None
        assert calls.get("DcpIndexer.topk") == topk, rank


def test_dcp_inside_pipeline_stages_ran_dcp_attention(rank_results, tiny_checkpoint):
    types = load_model_config(tiny_checkpoint("k3")).layer_types
    layout = LAYOUTS["dcp2_pp2"]
    for rank in range(WORLD):
        calls = rank_results[rank][("k3", "dcp2_pp2")]["calls"]
        stage = stage_layers(len(types), layout.pp, layout.coordinates(rank).pp)
        mla = sum(types[i] != LAYER_KDA for i in stage)
        assert calls.get("DcpAttention.forward", 0) == len(CHUNKS) * mla, rank
        assert "PcpMlaLayerCache.write" not in calls, rank
