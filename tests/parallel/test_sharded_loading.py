"""The loader gives each rank exactly its shard of every checkpoint tensor (no processes needed)."""

import pytest
import torch

from services.engine.checkpoint.loader import load_model
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.layout import ParallelLayout
from services.engine.parallel.shard import Shard, model_shards


def test_shard_of_a_blocked_dim_is_cut_block_by_block():
    rows = torch.arange(12)
    assert Shard(0, 1, 2, blocks=3).take(rows).tolist() == [2, 3, 6, 7, 10, 11]
    assert Shard(0, 0, 4).take(rows).tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("family", "layout"),
    [("k3", "hub"), ("k3", "transformers"), ("deepseek_v32", "hub")],
    ids=["k3-hub", "k3-fused", "deepseek-hub"],
)
def test_each_rank_loads_its_shard_of_every_tensor(tiny_checkpoint, family, layout):
    path = tiny_checkpoint(family, layout)
    full = dict(load_model(path).named_parameters())
    for degrees, rank in ((ParallelLayout(tp=2, ep=2), 1), (ParallelLayout(tp=4, ep=2), 2)):
        model = load_model(path, parallel=ParallelContext(degrees, rank))
        shards = model_shards(model)
        kinds = {name.split("layers.")[-1].split(".", 1)[-1] for name in shards}
        assert {
            "self_attn.conv1d.weight",
            "self_attn.forget_gate.A_log",
            "mlp.experts.down_proj",
        } <= kinds or (family == "deepseek_v32" and "mlp.experts.gate_up_proj" in kinds)
        for name, param in model.named_parameters():
            want = shards[name].take(full[name]) if name in shards else full[name]
            assert torch.equal(param, want), name


def test_a_layout_that_does_not_fit_fails_before_any_weight(tiny_checkpoint, tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_checkpoint("kimi_linear") / "config.json").read_text())
    with pytest.raises(ValueError, match=r"--tp 3: does not divide 4 attention heads"):
        load_model(folder, parallel=ParallelContext(ParallelLayout(tp=3)))
