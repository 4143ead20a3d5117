"""DCP pieces without a process group: the token -> rank mapping, attention over a rank's shard merged
by LSE against attention over the whole sequence (reference and Triton kernels), a shard's index
scores, the top-k candidate merge against the single-rank rule, and the layout's refusal of DCP in
batch-invariant mode."""

import pytest
import torch

from kernels.dsa import paged_triton as indexer_triton  # tests/conftest.py chose the interpreter
from kernels.dsa.paged_naive import paged_indexer_scores, topk_by_score
from kernels.dsa.topk_merge import best_candidates, merge_candidates, needs_refill
from kernels.mla import paged_triton as attention_triton
from kernels.mla.lse_merge import merge_by_lse
from kernels.mla.paged_naive import paged_mla_decode
from services.engine.model import load_model_config
from services.engine.parallel.dcp_shard import DcpShard
from services.engine.parallel.layout import ParallelLayout
from tests.kernels.kernel_testing import assert_rel

DC, DR, HEADS, BLOCK = 16, 8, 3, 4
LENGTHS = (1, 9, 23)  # one sequence shorter than every degree: ranks > 0 hold nothing of it


def _tables(lengths, virtual_block: int) -> torch.Tensor:
    """Shared block tables over shuffled ids (block 0 left as padding)."""
    per_seq = [-(-n // virtual_block) for n in lengths]
    ids = (torch.randperm(sum(per_seq)) + 1).tolist()
    tables = torch.zeros(len(lengths), max(per_seq), dtype=torch.int32)
    for seq, count in enumerate(per_seq):
        tables[seq, :count] = torch.tensor([ids.pop() for _ in range(count)], dtype=torch.int32)
    return tables


def _virtual_slots(table: torch.Tensor, length: int, virtual_block: int) -> torch.Tensor:
    positions = torch.arange(length)
    return table.long()[positions // virtual_block] * virtual_block + positions % virtual_block


def _sharded_pools(rows, tables, size: int, virtual_block: int):
    """Each of ``size`` ranks' pools ``[num_blocks, virtual_block / size, dim]`` (NaN where unwritten),
    written through ``local_slots``."""
    num_blocks, block = int(tables.max()) + 1, virtual_block // size
    pools = []
    for rank in range(size):
        shard = DcpShard(rank, size)
        pool = torch.full((num_blocks * block, rows[0].shape[1]), float("nan"))
        for seq, seq_rows in enumerate(rows):
            owned, local = shard.local_slots(
                _virtual_slots(tables[seq], seq_rows.shape[0], virtual_block), virtual_block
            )
            assert not pool[local[owned]].isfinite().any(), "two tokens mapped to one local slot"
            pool[local[owned]] = seq_rows[owned]
        pools.append(pool.view(num_blocks, block, -1))
    return pools


@pytest.mark.parametrize("size", [2, 3, 4], ids=lambda s: f"dcp{s}")
def test_token_to_rank_mapping(size):
    positions = torch.arange(50)
    owners = torch.stack([DcpShard(r, size).owned(positions) for r in range(size)])
    assert (owners.sum(0) == 1).all() and (owners.float().argmax(0) == positions % size).all()
    for rank in range(size):
        shard = DcpShard(rank, size)
        expected_last = [sum(1 for p in range(q + 1) if p % size == rank) - 1 for q in range(50)]
        assert shard.last_local_position(positions).tolist() == expected_last
        lengths = torch.tensor([0, 1, 2, 7, 50])
        assert shard.local_lengths(lengths).tolist() == [
            sum(1 for p in range(n) if p % size == rank) for n in lengths.tolist()
        ]
        selection = torch.tensor([[0, 5, -1, 12, 13]])
        want = [[p // size if p >= 0 and p % size == rank else -1 for p in selection[0].tolist()]]
        assert shard.local_selection(selection).tolist() == want


def test_layout_validation_refuses_dcp_in_batch_invariant_mode(tiny_checkpoint):
    config = load_model_config(tiny_checkpoint("deepseek_v32"))
    ParallelLayout(dcp=2).validate(config, batch_invariant=False)
    ParallelLayout(dcp=1).validate(config, batch_invariant=True)
    with pytest.raises(ValueError, match="--dcp 2 with --batch-invariant"):
        ParallelLayout(dcp=2).validate(config, batch_invariant=True)


def test_bad_degree_and_block_size_name_the_field():
    with pytest.raises(ValueError, match="dcp"):
        DcpShard(0, 0)
    with pytest.raises(ValueError, match="dcp rank"):
        DcpShard(2, 2)
    with pytest.raises(ValueError, match="multiple of dcp 3"):
        DcpShard(0, 3).local_block_size(8)


def _step(sparse: bool):
    """A query at position 0 (only rank 0 has a key), decodes and a chunk; DSA selections optional."""
    query_seq = torch.tensor([0, 1, 1, 1, 2], dtype=torch.int32)
    query_pos = torch.tensor([0, 6, 7, 8, 22], dtype=torch.int32)
    if not sparse:
        return query_seq, query_pos, None
    topk = torch.full((5, 6), -1, dtype=torch.int32)
    topk[0, 0] = 0
    topk[1, :3] = torch.tensor([6, 2, 4])  # all on rank 0 at dcp 2: rank 1 attends nothing
    topk[2, :5] = torch.tensor([7, 0, 3, 5, 1])
    topk[3, :6] = torch.tensor([8, 1, 2, 3, 4, 5])
    topk[4, :6] = torch.tensor([22, 21, 0, 11, 17, 3])
    return query_seq, query_pos, topk


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "dsa"])
@pytest.mark.parametrize(
    "size, kernel",
    [(2, "reference"), (3, "reference"), (4, "reference"), (2, "triton")],
    ids=["dcp2", "dcp3", "dcp4", "dcp2_triton"],
)
def test_shard_attention_merged_by_lse_equals_full_attention(size, kernel, sparse):
    torch.manual_seed(size)
    latents = [torch.randn(n, DC) for n in LENGTHS]
    ropes = [torch.randn(n, DR) for n in LENGTHS]
    tables = _tables(LENGTHS, size * BLOCK)
    query_seq, query_pos, topk = _step(sparse)
    q_latent, q_rope = torch.randn(5, HEADS, DC), torch.randn(5, HEADS, DR)
    virtual = size * BLOCK
    # One rank: the whole sequences in a pool of virtual-size blocks (the dcp 1 layout).
    (full_latent,), (full_rope,) = (
        _sharded_pools(latents, tables, 1, virtual),
        _sharded_pools(ropes, tables, 1, virtual),
    )
    want_out, want_lse = paged_mla_decode(
        q_latent, q_rope, full_latent, full_rope, tables, query_seq, query_pos, topk, 0.3, 23
    )
    latent_pools = _sharded_pools(latents, tables, size, virtual)
    rope_pools = _sharded_pools(ropes, tables, size, virtual)
    outs, lses = [], []
    shard_kernel = attention_triton.paged_mla_decode if kernel == "triton" else paged_mla_decode
    for rank in range(size):
        shard = DcpShard(rank, size)
        out, lse = shard_kernel(
            q_latent,
            q_rope,
            latent_pools[rank],
            rope_pools[rank],
            tables,
            query_seq,
            shard.last_local_position(query_pos),
            None if topk is None else shard.local_selection(topk),
            0.3,
            shard.local_bound(23),
        )
        outs.append(out)
        lses.append(lse)
    assert torch.isneginf(torch.stack(lses)[1:, 0]).all(), "ranks > 0 hold no key of position 0"
    out, lse = merge_by_lse(torch.stack(outs), torch.stack(lses))
    assert_rel(out, want_out, 1e-5, "merged out")
    assert_rel(lse, want_lse, 1e-6, "merged lse")


def test_merge_ignores_what_an_empty_part_returns():
    out_a = torch.randn(2, HEADS, DC)
    lse_a = torch.randn(2, HEADS)
    lse_a[1] = float("-inf")
    garbage = torch.full((2, HEADS, DC), float("nan"))
    out, lse = merge_by_lse(
        torch.stack([garbage, out_a]), torch.stack([torch.full_like(lse_a, -torch.inf), lse_a])
    )
    assert torch.equal(out[0], out_a[0]) and torch.equal(lse[0], lse_a[0])
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isneginf(lse[1]).all()


def _tied_scores(rows: int, width: int, seed: int) -> torch.Tensor:
    """Scores from 5 values (many ties, zeros of both signs), some positions not visible."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 5, (rows, width), generator=gen).float()
    # Some zeros negative: -0.0 ties with +0.0, as in the reference's float sort.
    scores = torch.where((scores == 0) & (torch.rand(rows, width, generator=gen) < 0.5), -0.0, scores)
    return scores.masked_fill(torch.rand(rows, width, generator=gen) < 0.2, float("-inf"))


@pytest.mark.parametrize("topk", [1, 7, 40], ids=lambda k: f"k{k}")
def test_candidate_merge_equals_single_rank_topk(topk):
    size, width = 3, 30
    scores = _tied_scores(4, width, seed=topk)
    want = topk_by_score(scores, topk)
    sent_scores, sent_positions = [], []
    for rank in range(size):
        shard = DcpShard(rank, size)
        local = torch.arange(rank, width, size)
        positions = shard.global_positions(torch.arange(local.numel())).expand(4, -1)
        got = best_candidates(scores[:, local], positions, topk)
        sent_scores.append(got[0])
        sent_positions.append(got[1])
    merged = merge_candidates(torch.stack(sent_scores), torch.stack(sent_positions), topk)[1]
    assert torch.equal(merged, want)


def test_refill_is_detected_only_when_an_unsent_key_could_qualify():
    # Rank 0 sent [10, 12] of 5 keys held; rank 1 sent [11, 13] of 2 held.
    sent = torch.tensor([[[10, 12]], [[11, 13]]], dtype=torch.int32)
    held = torch.tensor([[5], [2]])
    assert needs_refill(sent, held, torch.tensor([[10, 11, 12]], dtype=torch.int32)).tolist() == [True]
    assert needs_refill(sent, held, torch.tensor([[10, 11, 13]], dtype=torch.int32)).tolist() == [False]
    held_all_sent = torch.tensor([[2], [2]])
    assert needs_refill(sent, held_all_sent, torch.tensor([[10, 11, 12]], dtype=torch.int32)).tolist() == [
        False
    ]


def test_shard_index_scores_triton_equal_reference_with_empty_rows():
    torch.manual_seed(7)
    size, index_dim, heads = 2, 16, 2
    keys = [torch.randn(n, index_dim) for n in LENGTHS]
    tables = _tables(LENGTHS, size * BLOCK)
    query_seq, query_pos, _ = _step(False)
    q, weights = torch.randn(5, heads, index_dim), torch.rand(5, heads)
    shard = DcpShard(1, size)
    pool = _sharded_pools(keys, tables, size, size * BLOCK)[1]
    local_pos = shard.last_local_position(query_pos)
    assert local_pos[0] == -1, "the query at position 0 sees no key of rank 1"
    args = (q, weights, pool, tables, query_seq, local_pos, 0.25, shard.local_bound(23))
    want = paged_indexer_scores(*args)
    got = indexer_triton.paged_indexer_scores(*args)
    assert torch.isneginf(got[0]).all() and torch.equal(torch.isneginf(got), torch.isneginf(want))
    finite = torch.isfinite(want)
    assert_rel(got[finite], want[finite], 1e-5, "scores")
