"""Block and state-slot pools: layouts, views that do not overlap, allocation and integrity."""

import pytest
import torch

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import (
    ALIGNMENT,
    CONV,
    INDEX_KEY,
    K_ROPE,
    LATENT,
    RECURRENT,
    block_layout,
    slot_layout,
)
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.presets import preset_config
from services.engine.model.config_loader import load_model_config


@pytest.fixture(scope="module")
def k3():
    return load_model_config(preset_config("k3", "tiny"))


def test_block_layout_holds_every_mla_layer(k3):
    layout = block_layout(k3, 16, torch.bfloat16)
    mla_layers = [i for i, kind in enumerate(k3.layer_types) if kind == "mla"]
    assert {(f.layer, f.kind) for f in layout.fields} == {
        (layer, kind) for layer in mla_layers for kind in (LATENT, K_ROPE, INDEX_KEY)
    }
    assert all(f.offset % ALIGNMENT == 0 for f in layout.fields)
    spans = sorted((f.offset, f.offset + f.nbytes) for f in layout.fields)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))
    per_token = (k3.kv_lora_rank + k3.qk_rope_head_dim + k3.indexer.head_dim) * 2 * len(mla_layers)
    assert layout.nbytes >= 16 * per_token


def test_deepseek_has_no_slot_fields_and_kimi_no_index_keys():
    deepseek = load_model_config(preset_config("deepseek_v32", "tiny"))
    kimi = load_model_config(preset_config("kimi_linear", "tiny"))
    assert slot_layout(deepseek, torch.float32).fields == ()
    assert all(f.kind != INDEX_KEY for f in block_layout(kimi, 16, torch.float32).fields)


def test_block_views_write_only_their_own_bytes(k3):
    layout = block_layout(k3, 4, torch.float32)
    pool = BlockPool(layout, 4, num_blocks=3, device="cpu")
    for field in layout.fields:
        before = pool.storage.clone()
        pool.view(field.layer, field.kind)[1] = 1.0
        changed = (pool.storage != before).nonzero()
        assert changed[:, 0].unique().tolist() == [1]
        columns = changed[:, 1]
        assert field.offset <= int(columns.min()) and int(columns.max()) < field.offset + field.nbytes


def test_slot_views_are_per_slot(k3):
    pool = StateSlotPool(slot_layout(k3, torch.bfloat16), num_slots=2, device="cpu")
    recurrent = pool.view(0, RECURRENT)
    assert recurrent.dtype == torch.float32 and recurrent.shape == (2, 4, 16, 16)
    assert pool.view(0, CONV).dtype == torch.bfloat16
    recurrent[1] = 2.0
    assert torch.all(pool.view(0, RECURRENT)[0] == 0)


def test_block_allocation_order_and_integrity(k3):
    pool = BlockPool(block_layout(k3, 16, torch.float32), 16, num_blocks=4, device="cpu")
    assert pool.allocate(3) == [0, 1, 2]
    assert not pool.can_allocate(2)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate(2)
    pool.free([1])
    assert pool.allocate(2) == [3, 1]
    pool.check_integrity()
    pool.free([0, 2, 3, 1])
    pool.check_integrity()
    assert pool.num_free == 4
    with pytest.raises(RuntimeError, match="not in use"):
        pool.free([0])


def test_integrity_check_catches_corruption(k3):
    pool = BlockPool(block_layout(k3, 16, torch.float32), 16, num_blocks=3, device="cpu")
    pool.allocate(1)
    pool.free_ids.append(0)  # a used block also listed free
    with pytest.raises(AssertionError, match="used block"):
        pool.check_integrity()
    slots = StateSlotPool(slot_layout(k3, torch.float32), num_slots=2, device="cpu")
    slots.allocate()
    slots.used.clear()  # a slot lost track of
    with pytest.raises(AssertionError, match="total"):
        slots.check_integrity()
