"""PCP prefill of tiny Kimi-Linear (KDA + MLA), DeepSeek-V3.2 (MLA + DSA) and K3 (KDA + MLA + DSA)
models on 2 gloo ranks against one rank (``CausalLM.forward_step``).

Steps: a ragged prefill of three prompts (37, 9 and 70 tokens: none a multiple of the 16-token
chunk, the 9-token one shorter than the 4 zigzag chunks, so rank 1 holds none of it), a second PCP
prefill continuing two of them after their cached prefix (20 and 5 tokens), then a plain decode step
of all three on each rank's own cache. Default numerics in float32: logits within 1e-5 and the
caches (MLA latents, rope keys, index keys, KDA recurrent and conv state) equal within 1e-5 after
each step. Batch-invariant numerics: the same, bitwise.
"""

import pytest
import torch

from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.checkpoint.loader import load_model
from services.engine.model import build_step_metadata
from services.engine.parallel.context import build_parallel_context
from services.engine.parallel.layout import ParallelLayout
from services.engine.parallel.pcp_prefill import pcp_forward_step
from tests.conftest import relative_error
from tests.parallel.gloo_ranks import run_ranks

WORLD = 2
FAMILIES = ("kimi_linear", "deepseek_v32", "k3")
MODES = ("default", "invariant")
# chunks[step][seq]: new tokens (0: the sequence sits the step out); the last step is a decode step.
CHUNKS = [[37, 9, 70], [20, 0, 5], [1, 1, 1]]


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


def _rank_body(rank: int, size: int, checkpoints: dict) -> dict:
    context = build_parallel_context(ParallelLayout(pcp=size))
    results = {}
    for family, path in checkpoints.items():
        model = load_model(path, dtype=torch.float32)
        for mode in MODES:
            model.set_batch_invariant(mode == "invariant")
            results[(family, mode, 1)] = _run(model, None)
            results[(family, mode, WORLD)] = _run(model, context)
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
        want_logits, want_cache = rank_results[rank][(family, mode, 1)]
        got_logits, got_cache = rank_results[rank][(family, mode, WORLD)]
        for step, (got, want) in enumerate(zip(got_logits, want_logits, strict=True)):
            assert got.shape == want.shape == (3 if step != 1 else 2, 1024)
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
