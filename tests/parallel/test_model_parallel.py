"""TP and EP on the tiny checkpoints: every rank's logits match one process, bitwise when invariant.

Four gloo processes are spawned once for the file; each case picks the layout's ranks among them
(``build_parallel_context(layout, ranks)``), loads its shards, runs a 3-sequence prefill and two
decode steps through ``CausalLM.forward``, and compares with the one-process model it also runs.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from services.engine.parallel.layout import ParallelLayout
from tests.relative_error import relative_error  # not conftest: the spawned ranks import this module

FAMILIES = ("k3", "kimi_linear", "deepseek_v32")
LAYOUTS = {
    "tp2": ParallelLayout(tp=2),
    "tp2-ep2": ParallelLayout(tp=2, ep=2),
    "tp4-ep4": ParallelLayout(tp=4, ep=4),
}
WORLD = 4
PREFILL, DECODE_STEPS, SEQUENCES = 20, 2, 3  # 20 tokens: past the tiny DSA top-k of 16


def _run(model, ids: torch.Tensor, invariant: bool) -> torch.Tensor:
    """Prefill ``ids [B, PREFILL]`` then decode its next ``DECODE_STEPS`` columns one by one."""
    from services.engine.cache.contiguous_cache import ContiguousCache

    weight = model.lm_head.weight
    cache = ContiguousCache(
        ids.shape[0], model.config, weight.dtype, weight.device, invariant, model.parallel.tp
    )
    logits = [model.forward(ids[:, :PREFILL], cache)]
    for step in range(DECODE_STEPS):
        logits.append(model.forward(ids[:, PREFILL + step : PREFILL + step + 1], cache))
    return torch.cat(logits, 1)


def _worker(rank: int, store: str, checkpoints: dict[str, str], out_dir: str) -> None:
    from services.engine.checkpoint.loader import load_model
    from services.engine.parallel.context import build_parallel_context

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    ids = torch.randint(
        3, 1000, (SEQUENCES, PREFILL + DECODE_STEPS), generator=torch.Generator().manual_seed(7)
    )
    results = {}
    for family, path in checkpoints.items():
        if rank == 0:  # the one-process logits, once
            single = load_model(path)
            for invariant in (False, True):
                single.set_batch_invariant(invariant)
                results[(family, "single", invariant)] = {"logits": _run(single, ids, invariant)}
        for name, layout in LAYOUTS.items():
            context = build_parallel_context(layout, range(layout.world_size))
            if context is None:  # not in this layout: on to the next case's group creation
                continue
            model = load_model(path, parallel=context)
            for invariant in (False, True):
                model.set_batch_invariant(invariant)
                results[(family, name, invariant)] = {
                    "logits": _run(model, ids, invariant),
                    "o_proj_in": model.model.layers[2].self_attn.o_proj.weight.shape[1],
                    "local_experts": model.model.layers[1].mlp.experts.down_proj.shape[0],
                }
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def rank_results(tiny_checkpoint, tmp_path_factory):
    """``{rank: {(family, layout name, invariant): result}}`` from one spawn of ``WORLD`` processes."""
    from kernels.invariant.reproducible_blas import request_strict_mkl

    request_strict_mkl()  # the children inherit it: MKL's mode is fixed at its first call
    out = tmp_path_factory.mktemp("ranks")
    checkpoints = {family: str(tiny_checkpoint(family)) for family in FAMILIES}
    mp.spawn(_worker, args=(str(out / "store"), checkpoints, str(out)), nprocs=WORLD, join=True)
    return {rank: torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)}


@pytest.mark.parametrize("invariant", [False, True], ids=["default", "invariant"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("family", FAMILIES)
def test_parallel_logits_match_one_process(rank_results, family, layout, invariant):
    degrees = LAYOUTS[layout]
    want = rank_results[0][(family, "single", invariant)]["logits"]
    assert want.shape == (SEQUENCES, PREFILL + DECODE_STEPS, 1024) and want.abs().max() > 0
    for rank in range(degrees.world_size):
        result = rank_results[rank][(family, layout, invariant)]
        # The rank holds its shards: layer 2's MLA (64 = 4 heads x 16) cut by TP, 8 experts by EP.
        assert result["o_proj_in"] * degrees.tp == 64
        assert result["local_experts"] * degrees.ep == 8
        got = result["logits"]
        if invariant:
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (
                f"rank {rank}: relative error {relative_error(got, want):.3g}"
            )
        else:
            assert relative_error(got, want) <= 1e-5, (rank, relative_error(got, want))
