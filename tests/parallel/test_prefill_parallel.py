"""Parallel prefill of tiny Kimi-Linear (KDA + MLA), DeepSeek-V3.2 (MLA + DSA) and K3 (KDA + MLA + DSA)
models on 2 gloo ranks against one rank (``CausalLM.forward_step``): PCP 2 and PP 2 in one process
group (starting ranks costs more than the cases).

PCP steps: a ragged prefill of three prompts (37, 9 and 50 tokens: none a multiple of the 16-token
chunk, the 9-token one shorter than the 4 zigzag chunks, so rank 1 holds none of it), a second PCP
prefill continuing two of them after their cached prefix (20 and 5 tokens), a third of 7 tokens of
one sequence (rank 1 holds no row and only joins the exchanges), then a plain decode step
of all three on each rank's own cache. Default numerics in float32: logits within 1e-5 and the
caches (MLA latents, rope keys, index keys, KDA recurrent and conv state) equal within 1e-5 after
each step. Batch-invariant numerics: the same, bitwise. The zigzag split is checked to have given
both ranks rows, and the PCP KDA and MLA exchanges to have run.

PP: the same three prompts as micro-batches of 16-token chunks through 2 stages (layers 0-1, 2-3),
each stage holding only its layers' weights and caches: the last stage's logits and every stage's
cache equal to one process's bitwise (the same ops on the same rows), in both numerics.
"""

import pytest
import torch

from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.cache.layout import block_layout, slot_layout, stage_layout
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.loader import load_model
from services.engine.model import SequenceStep, build_step_metadata, load_model_config
from services.engine.model.config import LAYER_KDA
from services.engine.parallel.context import build_parallel_context
from services.engine.parallel.layout import ParallelLayout
from services.engine.parallel.pcp_cache import PcpMlaLayerCache
from services.engine.parallel.pcp_kda import PcpKda
from services.engine.parallel.pcp_prefill import pcp_forward_step
from services.engine.parallel.pipeline import PipelineStage, chunk_micro_batches
from services.engine.parallel.zigzag import chunk_size, zigzag_plan
from tests.conftest import relative_error
from tests.parallel.gloo_ranks import run_ranks

WORLD = 2
FAMILIES = ("kimi_linear", "deepseek_v32", "k3")
MODES = ("default", "invariant")
# chunks[step][seq]: new tokens (0: the sequence sits the step out); the last step is a decode step.
CHUNKS = [[37, 9, 50], [20, 0, 5], [0, 7, 0], [1, 1, 1]]


def _token_ids(seed: int = 5) -> list[list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (3, 100), generator=gen).tolist()
    used, steps = [0, 0, 0], []
    for counts in CHUNKS:
        steps.append([ids[seq][used[seq] : used[seq] + n] for seq, n in enumerate(counts)])
        used = [u + n for u, n in zip(used, counts, strict=True)]
    return steps


def _cache_contents(model, cache: ContiguousCache) -> dict[str, torch.Tensor]:
    """Every layer's cached rows of every sequence (MLA fields up to the longest sequence, KDA slots)."""
    out, length = {}, max(cache.num_tokens)
    for index, layer in enumerate(model.model.layers):
        if layer.is_kda:
            view = cache.kda(index)
            for name in ("recurrent", "conv", "open_k", "open_g", "open_delta", "open_count"):
                if getattr(view, name) is not None:
                    out[f"{index}.{name}"] = getattr(view, name).clone()
        else:
            view = cache.mla(index)
            for name in ("latent", "k_rope", "index_key"):
                if getattr(view, name) is not None:
                    out[f"{index}.{name}"] = getattr(view, name)[:, :length].clone()
    return out


def _run(model, context) -> tuple[list[torch.Tensor], list[dict]]:
    """Each step's logits and the cache afterwards; prefill steps through PCP when ``context`` is given."""
    weight = model.lm_head.weight
    cache = ContiguousCache(3, model.config, weight.dtype, weight.device, model.numerics.batch_invariant)
    logits, contents = [], []
    with torch.no_grad():
        for number, pieces in enumerate(_token_ids()):
            steps = cache.steps(pieces)
            if context is not None and number < len(CHUNKS) - 1:
                out = pcp_forward_step(model, steps, cache.block_size, cache, context)
            else:
                topk = model.index_topk
                meta = build_step_metadata(steps, cache.block_size, weight.device, index_topk=topk)
                out = model.forward_step(meta, cache)
            cache.advance(pieces)
            logits.append(out.clone())
            contents.append(_cache_contents(model, cache))
    return logits, contents


PP_CHUNK = 16
BLOCK = 16


def _stage_cache(model, layers: range, invariant: bool) -> PagedModelCache:
    """Pools of ``layers`` only: block 0 padding, then each prompt's blocks; slot ``s`` for prompt ``s``."""
    dtype, device = torch.float32, "cpu"
    blocks_layout = stage_layout(block_layout(model.config, BLOCK, dtype), layers)
    slots_layout = stage_layout(slot_layout(model.config, dtype, FIXED_CHUNK if invariant else 0), layers)
    blocks = BlockPool(blocks_layout, BLOCK, 1 + sum(_pp_blocks()), device)
    slots = StateSlotPool(slots_layout, len(CHUNKS[0]), device)
    blocks.allocate(1 + sum(_pp_blocks()))
    for _ in CHUNKS[0]:
        slots.allocate()
    return PagedModelCache(blocks, slots, model.config, dtype)


def _pp_blocks() -> list[int]:
    return [-(-n // BLOCK) for n in CHUNKS[0]]


def _pp_micro_batches():
    firsts = [1 + sum(_pp_blocks()[:s]) for s in range(len(CHUNKS[0]))]
    tables = [tuple(range(first, first + n)) for first, n in zip(firsts, _pp_blocks(), strict=True)]
    return chunk_micro_batches(_token_ids()[0], PP_CHUNK, tables, list(range(len(CHUNKS[0]))))


def _pp_run(model, stage: PipelineStage | None, invariant: bool) -> tuple[list[torch.Tensor], dict]:
    """Every micro-batch's logits (last stage, or one process) and the stage's cache fields by layer."""
    layers = stage.layers if stage is not None else range(len(model.model.layers))
    cache = _stage_cache(model, layers, invariant)
    with torch.no_grad():
        if stage is not None:
            logits = stage.prefill(_pp_micro_batches(), BLOCK, cache)
        else:
            logits = []
            for steps in _pp_micro_batches():
                meta = build_step_metadata(steps, BLOCK, "cpu", index_topk=model.index_topk)
                logits.append(model.forward_step(meta, cache))
    contents = {}
    for index in layers:
        fields = cache.kda(index) if model.config.layer_types[index] == LAYER_KDA else cache.mla(index)
        for name, value in vars(fields).items():
            if isinstance(value, torch.Tensor):
                contents[f"{index}.{name}"] = value.clone()
    return logits, contents


def _count_calls(cls, name: str, counts: dict) -> None:
    original = getattr(cls, name)

    def counted(self, *args, **kwargs):
        counts[f"{cls.__name__}.{name}"] = counts.get(f"{cls.__name__}.{name}", 0) + 1
        return original(self, *args, **kwargs)

    setattr(cls, name, counted)


def _rank_body(rank: int, size: int, checkpoints: dict) -> dict:
    pcp_context = build_parallel_context(ParallelLayout(pcp=size))
    pp_context = build_parallel_context(ParallelLayout(pp=size))
    calls: dict[str, int] = {}
    for cls, name in ((PcpKda, "forward"), (PcpKda, "short_conv"), (PcpMlaLayerCache, "write")):
        _count_calls(cls, name, calls)
    plans = [
        zigzag_plan([SequenceStep(tuple(t), 0, (s,), s) for s, t in enumerate(step) if t], size)
        for step in _token_ids()[:-1]
    ]
    results = {"rows": [plan.row_counts() for plan in plans], "calls": calls}
    for family, path in checkpoints.items():
        model = load_model(path, dtype=torch.float32)
        full_parameters = sum(p.numel() for p in model.parameters())
        for mode in MODES:
            invariant = mode == "invariant"
            model.set_batch_invariant(invariant)
            results[(family, mode, "pcp1")] = _run(model, None)
            results[(family, mode, "pcp2")] = _run(model, pcp_context)
            results[(family, mode, "pp1")] = _pp_run(model, None, invariant)
            staged = load_model(path, dtype=torch.float32)
            staged.set_batch_invariant(invariant)
            stage = PipelineStage.build(staged, pp_context)
            results[(family, mode, "pp2")] = _pp_run(staged, stage, invariant)
            results[(family, "parameters")] = (sum(p.numel() for p in staged.parameters()), full_parameters)
    return results


@pytest.fixture(scope="module")
def rank_results(tiny_checkpoint):
    return run_ranks(_rank_body, WORLD, {family: tiny_checkpoint(family) for family in FAMILIES})


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype == torch.float32 else x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_pcp2_matches_one_rank(rank_results, family, mode):
    for rank in range(WORLD):
        want_logits, want_cache = rank_results[rank][(family, mode, "pcp1")]
        got_logits, got_cache = rank_results[rank][(family, mode, "pcp2")]
        for step, (got, want) in enumerate(zip(got_logits, want_logits, strict=True)):
            rows = sum(1 for n in CHUNKS[step] if n)
            assert got.shape == want.shape == (rows, 1024)
            if mode == "invariant":
                assert torch.equal(_bits(got), _bits(want)), f"rank {rank} step {step}: logits differ"
            else:
                err = relative_error(got, want)
                assert err <= 1e-5, f"rank {rank} step {step}: logits relative error {err:.2e}"
        for step, (got, want) in enumerate(zip(got_cache, want_cache, strict=True)):
            assert got.keys() == want.keys() and got
            for name in want:
                if mode == "invariant":
                    same = torch.equal(_bits(got[name]), _bits(want[name]))
                    assert same, f"rank {rank} step {step}: {name}"
                else:
                    err = relative_error(got[name], want[name])
                    assert err <= 1e-5, f"rank {rank} step {step}: {name} relative error {err:.2e}"


def test_pcp_split_and_exchanges_ran(rank_results, tiny_checkpoint):
    rows = rank_results[0]["rows"]
    assert [sum(step) for step in rows] == [sum(step) for step in CHUNKS[:-1]]
    assert min(rows[0]) > 0 and min(rows[1]) > 0 and rows[2] == [7, 0], rows
    kda_layers = mla_layers = 0
    for family in FAMILIES:
        types = load_model_config(tiny_checkpoint(family)).layer_types
        kda_layers += sum(1 for kind in types if kind == LAYER_KDA)
        mla_layers += sum(1 for kind in types if kind != LAYER_KDA)
    pcp_steps = (len(CHUNKS) - 1) * len(MODES)
    for rank in range(WORLD):  # the idle rank of the third step joins every exchange too
        calls = rank_results[rank]["calls"]
        assert calls["PcpKda.forward"] == calls["PcpKda.short_conv"] == pcp_steps * kda_layers
        assert calls["PcpMlaLayerCache.write"] == pcp_steps * mla_layers


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_matches_one_process(rank_results, family, mode):
    want_logits, want_cache = rank_results[1][(family, mode, "pp1")]
    assert rank_results[0][(family, mode, "pp2")][0] == []
    got_logits = rank_results[1][(family, mode, "pp2")][0]
    assert len(got_logits) == len(want_logits) == -(-max(CHUNKS[0]) // PP_CHUNK)
    for got, want in zip(got_logits, want_logits, strict=True):
        assert torch.equal(_bits(got), _bits(want))
    stage_layers = [set(), set()]
    for rank in range(WORLD):
        got_cache = rank_results[rank][(family, mode, "pp2")][1]
        for name, value in got_cache.items():
            stage_layers[rank].add(int(name.split(".")[0]))
            assert torch.equal(_bits(value), _bits(want_cache[name])), f"stage {rank}: {name}"
        staged, full = rank_results[rank][(family, "parameters")]
        assert staged < full
    assert stage_layers == [{0, 1}, {2, 3}]


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
