"""Parallel prefill of tiny Kimi-Linear (KDA + MLA), DeepSeek-V3.2 (MLA + DSA) and K3 (KDA + MLA + DSA)
models against one process (``CausalLM.forward_step``), every layout in one group of 4 gloo ranks
(starting ranks costs more than the cases): PCP 2 (ranks 0-1) and PP 2 (ranks 2-3) for every family,
PCP 4, PP 2 x PCP 2 and TP 2 x PCP 2 (all ranks) for K3.

PCP steps: a ragged prefill of three prompts (37, 9 and 50 tokens: none a multiple of the 16-token
chunk, the 9-token one shorter than the 2 x pcp zigzag chunks), a second PCP prefill continuing two
of them after their cached prefix (20 and 5 tokens), a third of 7 tokens of one sequence (every rank
but 0 holds no row and only joins the exchanges), then a plain decode step of all three on each
rank's own cache. Default numerics in float32: logits within 1e-5 and the caches (MLA latents, rope
keys, index keys, KDA recurrent and conv state) within 1e-5 after each step. Batch-invariant
numerics: the same, bitwise. The PCP KDA and MLA exchanges are counted, so a run that bypassed them
fails.

PP: the same three prompts as micro-batches of 16-token chunks through 2 stages (layers 0-1, 2-3),
each stage loading only its layers' weights (and the embedding or the head) and holding only their
caches: the last stage's logits and every stage's cache bitwise those of one process (the same ops
on the same rows), in both numerics. PP 2 x PCP 2: each micro-batch also split over the stage's 2
PCP ranks: within 1e-5 / bitwise as for PCP.
"""

import dataclasses

import pytest
import torch

from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.checkpoint.loader import load_model
from services.engine.model import SequenceStep, load_model_config
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import LAYER_KDA
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.layout import ParallelLayout
from services.engine.parallel.pcp_prefill import prepare_step
from services.engine.parallel.pipeline import held_by_other_stage, keep_stage, stage_position
from services.engine.parallel.zigzag import chunk_size, zigzag_plan
from tests.conftest import relative_error
from tests.parallel.gloo_ranks import run_ranks
from tests.parallel.prefill_ranks import CHUNKS, FAMILIES, MODES, PP_CHUNK, WORLD, rank_body


@pytest.fixture(scope="module")
def rank_results(tiny_checkpoint):
    return run_ranks(rank_body, WORLD, {family: tiny_checkpoint(family) for family in FAMILIES})


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype == torch.float32 else x


def _assert_close(got: torch.Tensor, want: torch.Tensor, bitwise: bool, what: str) -> None:
    assert got.shape == want.shape, what
    if bitwise:
        assert torch.equal(_bits(got), _bits(want)), f"{what}: not bitwise equal"
    else:
        err = relative_error(got, want)
        assert err <= 1e-5, f"{what}: relative error {err:.2e}"


def _kda_and_mla_layers(checkpoint) -> tuple[int, int]:
    types = load_model_config(checkpoint).layer_types
    kda = sum(1 for kind in types if kind == LAYER_KDA)
    return kda, len(types) - kda


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("family", "pcp"), [(f, 2) for f in FAMILIES] + [("k3", 4)], ids=str)
def test_pcp_matches_one_rank(rank_results, tiny_checkpoint, family, pcp, mode):
    want = rank_results[0][(family, mode, "pcp1")]
    kda_layers, mla_layers = _kda_and_mla_layers(tiny_checkpoint(family))
    pcp_steps = len(CHUNKS) - 1
    bitwise = mode == "invariant"
    for rank in range(pcp):
        got = rank_results[rank][(family, mode, f"pcp{pcp}")]
        # every PCP step ran the exchanges on every rank, the idle ones included
        assert got["calls"].get("PcpKda.forward", 0) == pcp_steps * kda_layers
        assert got["calls"].get("PcpKda.short_conv", 0) == pcp_steps * kda_layers
        assert got["calls"].get("PcpMlaLayerCache.write", 0) == pcp_steps * mla_layers
        for step, (got_logits, want_logits) in enumerate(zip(got["logits"], want["logits"], strict=True)):
            assert got_logits.shape == (sum(1 for n in CHUNKS[step] if n), 1024)
            _assert_close(got_logits, want_logits, bitwise, f"rank {rank} step {step} logits")
        for step, (got_cache, want_cache) in enumerate(zip(got["cache"], want["cache"], strict=True)):
            assert got_cache.keys() == want_cache.keys() and got_cache
            for name in want_cache:
                _assert_close(got_cache[name], want_cache[name], bitwise, f"rank {rank} step {step} {name}")


@pytest.mark.parametrize("mode", MODES)
def test_tp2_pcp2_matches_one_rank(rank_results, mode):
    """TP 2 x PCP 2 (ranks 0-1: PCP rank 0, TP ranks 0 and 1): logits and MLA rows as for PCP; each TP
    rank's KDA recurrent state is its half of the heads."""
    want = rank_results[0][("k3", mode, "pcp1")]
    bitwise = mode == "invariant"
    for rank in range(WORLD):
        got = rank_results[rank][("k3", mode, "tp2_pcp2")]
        assert got["calls"].get("PcpKda.forward", 0) > 0
        for step, (g, w) in enumerate(zip(got["logits"], want["logits"], strict=True)):
            _assert_close(g, w, bitwise, f"rank {rank} step {step} logits")
        got_cache, want_cache = got["cache"][-1], want["cache"][-1]
        assert got_cache.keys() == want_cache.keys()
        for name, value in got_cache.items():
            if name.endswith(".recurrent"):
                heads = value.shape[1]
                tp_rank = rank % 2
                expected = want_cache[name][:, tp_rank * heads : (tp_rank + 1) * heads]
                _assert_close(value, expected, bitwise, f"rank {rank}: {name}")
            elif not name.split(".")[1].startswith(("conv", "open")):
                _assert_close(value, want_cache[name], bitwise, f"rank {rank}: {name}")


# (rank, the stage's layers, whether it is the last stage) of each pipeline layout
STAGES = {
    "pp2": [(2, {0, 1}, False), (3, {2, 3}, True)],
    "pp2_pcp2": [(0, {0, 1}, False), (1, {0, 1}, False), (2, {2, 3}, True), (3, {2, 3}, True)],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("family", "layout"), [(f, "pp2") for f in FAMILIES] + [("k3", "pp2_pcp2")], ids=str)
def test_pp_matches_one_process(rank_results, tiny_checkpoint, family, layout, mode):
    want = rank_results[3][(family, mode, "pp1")]
    bitwise = layout == "pp2" or mode == "invariant"
    for rank, layers, last in STAGES[layout]:
        got = rank_results[rank][(family, mode, layout)]
        if not last:
            assert got["logits"] == []
        else:
            assert len(got["logits"]) == len(want["logits"]) == -(-max(CHUNKS[0]) // PP_CHUNK)
            for index, (g, w) in enumerate(zip(got["logits"], want["logits"], strict=True)):
                _assert_close(g, w, bitwise, f"rank {rank} micro-batch {index} logits")
        assert {int(name.split(".")[0]) for name in got["cache"]} == layers
        for name, value in got["cache"].items():
            _assert_close(value, want["cache"][name], bitwise, f"rank {rank}: {name}")
        # the stage holds only its layers' weights
        path = tiny_checkpoint(family)
        full = rank_results[rank][("parameters", path, "full")]
        layout_key = ParallelLayout(pp=2) if layout == "pp2" else ParallelLayout(pcp=2, pp=2)
        assert rank_results[rank][("parameters", path, layout_key)] < full


def test_pp_above_layers_is_refused(tiny_checkpoint):
    config = load_model_config(tiny_checkpoint("k3"))
    with pytest.raises(ValueError, match="--pp 5: more pipeline stages than the model's 4 layers"):
        ParallelLayout(pp=5).validate(config)


@pytest.mark.parametrize("pcp", [1, 2, 4], ids=lambda p: f"pcp{p}")
def test_zigzag_plan_covers_every_row_once(pcp):
    sizes = [(100, 0), (9, 16), (1, 3)]  # (new tokens, past)
    steps = [SequenceStep(tuple(range(n)), past, (0,), s) for s, (n, past) in enumerate(sizes)]
    plan = zigzag_plan(steps, pcp)
    rows = sorted(row for rank_rows in plan.global_rows for row in rank_rows)
    assert rows == list(range(110))
    assert chunk_size(100, pcp) % 16 == 0 and chunk_size(100, pcp) * 2 * pcp >= 100
    for seq in plan.pieces:
        assert [p.rank for p in seq] == [*range(pcp), *reversed(range(pcp))]
    for rank in range(pcp):  # each piece a step of its own, at its own positions
        local = plan.local_steps(rank)
        assert sum(len(s.token_ids) for s in local) == len(plan.global_rows[rank])
        for piece, step in zip(plan.rank_pieces(rank), local, strict=True):
            assert step.past == steps[piece.seq].past + piece.start
            assert step.token_ids == steps[piece.seq].token_ids[piece.start : piece.end]
    if pcp == 4:  # 100 tokens, chunk 16: chunk 6 holds 4 tokens (rank 1), chunk 7 none (rank 0)
        assert [len(r) for r in zigzag_plan(steps[:1], 4).global_rows] == [16, 20, 32, 32]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_stage_modules_and_tensors(tiny_checkpoint, tied):
    """Which modules each of 3 stages keeps and which checkpoint tensors it skips (4 layers: 2, 1, 1)."""
    config = dataclasses.replace(load_model_config(tiny_checkpoint("k3")), tie_word_embeddings=tied)
    kept = []
    for stage in range(3):
        context = ParallelContext(ParallelLayout(pp=3), stage)
        layers, first, last = stage_position(context, config.num_hidden_layers)
        with torch.device("meta"):
            model = CausalLM(config)
        keep_stage(model, layers, first, last)
        names = {name for name, _ in model.named_parameters()}
        kept.append({name.split(".")[2] for name in names if name.startswith("model.layers.")})
        assert ("model.embed_tokens.weight" in names) == (first or (last and tied))
        assert ("model.norm.weight" in names) == last
        assert any(name.startswith("lm_head.") for name in names) == (last and not tied)
        held = [(name, held_by_other_stage(name, context, config.num_hidden_layers, tied)) for name in names]
        assert not any(skipped for _, skipped in held), "a stage skips a tensor of its own"
        assert held_by_other_stage("model.layers.3.mlp.gate.weight", context, 4, tied) == (stage != 2)
        assert held_by_other_stage("lm_head.weight", context, 4, tied) == (stage != 2)
        # an index past the layers (multi-token prediction) is no stage's: the loader judges it
        assert not held_by_other_stage("model.layers.4.eh_proj.weight", context, 4, tied)
    assert kept == [{"0", "1"}, {"2"}, {"3"}]


def test_split_prefill_refuses_adapters(tiny_checkpoint):
    model = load_model(tiny_checkpoint("k3"), dtype=torch.float32)
    cache = ContiguousCache(1, model.config, torch.float32, "cpu")
    steps = [dataclasses.replace(step, adapter=1) for step in cache.steps([[1, 2, 3]])]
    with pytest.raises(ValueError, match="--pcp / --pp: prefill split over ranks does not run LoRA"):
        prepare_step(model, steps, cache.block_size, cache, ParallelContext.single())
