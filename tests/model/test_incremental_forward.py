"""Prefill-then-decode through ``ContiguousCache`` equals one full-sequence forward.

Decode steps run the single-token paths (recurrent KDA, absorbed MLA, indexer over cached keys);
prefill runs the chunked KDA and expanded MLA. Float32, relative max error <= 1e-5.
"""

import pytest
import torch

import services.engine.model.numerics as numerics_module
from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.checkpoint.loader import load_model
from tests.conftest import FAMILIES, relative_error

SPLITS = {
    "prefill-1-then-decode": [1] + [1] * 20,
    "prefill-13-then-decode": [13] + [1] * 8,
    "chunks-7-30-then-decode": [7, 30, 1, 1, 1],
}


@pytest.mark.parametrize("split", list(SPLITS), ids=list(SPLITS))
@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_equals_full(family, split, tiny_checkpoint, monkeypatch):
    model = load_model(tiny_checkpoint(family), dtype=torch.float32)
    calls = {"recurrent": 0, "absorbed": 0}

    def counting(name, function):
        def wrapper(*args):
            calls[name] += 1
            return function(*args)

        return wrapper

    monkeypatch.setattr(
        numerics_module, "kda_recurrent", counting("recurrent", numerics_module.kda_recurrent)
    )
    monkeypatch.setattr(
        numerics_module,
        "mla_attention_absorbed",
        counting("absorbed", numerics_module.mla_attention_absorbed),
    )
    sizes = SPLITS[split]
    ids = torch.randint(
        0, model.config.vocab_size, (2, sum(sizes)), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        full = model(ids)
        cache = ContiguousCache(2, model.config, torch.float32, "cpu")
        pieces, start = [], 0
        for size in sizes:
            pieces.append(model(ids[:, start : start + size], cache))
            start += size
    assert cache.num_tokens == [ids.shape[1]] * 2
    assert relative_error(torch.cat(pieces, dim=1), full) <= 1e-5
    decode_steps = sum(1 for i, s in enumerate(sizes) if s == 1 and i > 0)
    kinds = model.config.layer_types
    sequences = ids.shape[0]
    assert calls["absorbed"] == decode_steps * kinds.count("mla") * sequences
    assert calls["recurrent"] == decode_steps * kinds.count("kda") * sequences
    total = ids.shape[1]
    assert cache.block_size >= total
    for index, kind in enumerate(kinds):
        if kind == "kda":
            state = cache.kda(index).recurrent[1]
            assert state.dtype == torch.float32 and state.abs().sum() > 0
        else:
            latent = cache.mla(index).latent[1]  # sequence 1 owns block 1: every token, then unwritten rows
            assert bool((latent[:total] != 0).any(dim=-1).all()) and not latent[total:].any()
