"""ParallelLayout: rank order, groups, and validation against a model config before any weight."""

from dataclasses import replace

import pytest

from services.engine.model.config_loader import load_model_config
from services.engine.parallel.context import ParallelContext, build_parallel_context
from services.engine.parallel.layout import ParallelLayout, RankCoordinates


def test_rank_order_is_tp_fastest_then_dcp_pcp_pp():
    layout = ParallelLayout(tp=2, dcp=1, pcp=2, pp=2, ep=2)
    assert layout.world_size == 8 and layout.stage_size == 4
    assert [layout.coordinates(r) for r in (0, 1, 2, 5, 7)] == [
        RankCoordinates(tp=0, dcp=0, pcp=0, pp=0, ep=0),
        RankCoordinates(tp=1, dcp=0, pcp=0, pp=0, ep=1),
        RankCoordinates(tp=0, dcp=0, pcp=1, pp=0, ep=0),
        RankCoordinates(tp=1, dcp=0, pcp=0, pp=1, ep=1),
        RankCoordinates(tp=1, dcp=0, pcp=1, pp=1, ep=1),
    ]
    for rank in range(8):
        c = layout.coordinates(rank)
        assert layout.rank_of(c.tp, c.dcp, c.pcp, c.pp) == rank
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("pcp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("ep") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert ParallelLayout(tp=2, dcp=2).groups("dcp") == [[0, 2], [1, 3]]


def test_single_context_has_no_groups():
    single = ParallelContext.single()
    assert single.layout.world_size == 1 and single.tp_rank == 0 and single.ep_rank == 0
    assert single.tp_group is None and single.ep_group is None


def test_context_needs_an_initialised_group_of_the_layout_size():
    with pytest.raises(RuntimeError, match="not initialised"):
        build_parallel_context(ParallelLayout(tp=2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 0}, r"--tp 0: a parallel degree must be an integer >= 1"),
        ({"tp": 2, "ep": 4}, r"--ep 4: .* must divide tp x dcp = 2"),
        ({"tp": 2, "pcp": 2, "ep": 4}, r"--ep 4: .* must divide tp x dcp = 2"),
    ],
    ids=["zero-degree", "ep-beyond-tp", "ep-across-pcp"],
)
def test_bad_degrees_name_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelLayout(**kwargs)


@pytest.mark.parametrize(
    ("family", "kwargs", "invariant", "message"),
    [
        ("kimi_linear", {"tp": 3}, False, r"--tp 3: does not divide 4 attention heads"),
        ("kimi_linear", {"tp": 8}, False, r"--tp 8: does not divide 4 attention heads"),
        ("deepseek_v32", {"tp": 8, "ep": 8}, False, r"--tp 8: does not divide 4 attention heads"),
        ("kimi_linear", {"tp": 4, "ep": 4}, False, None),
        ("k3", {"tp": 2, "ep": 2}, True, None),
    ],
    ids=["tp3", "tp8-heads", "tp8-deepseek", "tp4-ep4-ok", "k3-invariant-ok"],
)
def test_validation_against_the_tiny_configs(tiny_checkpoint, family, kwargs, invariant, message):
    config = load_model_config(tiny_checkpoint(family))
    layout = ParallelLayout(**kwargs)
    if message is None:
        layout.validate(config, batch_invariant=invariant)
    else:
        with pytest.raises(ValueError, match=message):
            layout.validate(config, batch_invariant=invariant)


def test_validation_of_kda_heads_experts_and_invariant_segments(tiny_checkpoint):
    config = load_model_config(tiny_checkpoint("kimi_linear"))
    six_kda_heads = replace(config, kda=replace(config.kda, num_heads=6))
    with pytest.raises(ValueError, match=r"--tp 4: does not divide 6 KDA heads"):
        ParallelLayout(tp=4).validate(six_kda_heads)
    six_experts = replace(config, moe=replace(config.moe, num_experts=6))
    with pytest.raises(ValueError, match=r"--ep 4: does not divide 6 routed experts"):
        ParallelLayout(tp=4, ep=4).validate(six_experts)
    wide = replace(
        config, num_attention_heads=12, kda=replace(config.kda, num_heads=12), intermediate_size=96
    )
    wide = replace(wide, moe=replace(config.moe, intermediate_size=24))
    ParallelLayout(tp=12, ep=4).validate(wide)
    with pytest.raises(ValueError, match=r"--tp 12: batch-invariant mode .* must divide 8"):
        ParallelLayout(tp=12, ep=4).validate(wide, batch_invariant=True)
    odd_width = replace(config, intermediate_size=132)
    ParallelLayout(tp=2).validate(odd_width)
    with pytest.raises(ValueError, match=r"width 132, not a multiple of 8 segments"):
        ParallelLayout(tp=2).validate(odd_width, batch_invariant=True)
    dense_only = replace(config, mlp_types=("dense",) * 4)
    with pytest.raises(ValueError, match=r"--ep 2: the model has no MoE layer"):
        ParallelLayout(tp=2, ep=2).validate(dense_only)
