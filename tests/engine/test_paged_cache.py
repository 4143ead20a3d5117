"""The model on the paged cache equals the model on plain contiguous tensors."""

import pytest
import torch

from services.engine.benchmark.kv_format_bench import measure_kv_format
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.loader import load_model
from services.engine.model import SequenceStep, build_step_metadata
from tests.conftest import FAMILIES, relative_error

BLOCK = 8


@pytest.mark.parametrize("family", FAMILIES)
def test_paged_steps_equal_contiguous_steps(family, tiny_checkpoint):
    """Same chunking on both caches: paged block tables (scattered, non-contiguous ids) change nothing."""
    model = load_model(tiny_checkpoint(family), dtype=torch.float32)
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 1024, (n,), generator=generator).tolist() for n in (29, 13, 1)]
    blocks = BlockPool(block_layout(model.config, BLOCK, torch.float32), BLOCK, num_blocks=16, device="cpu")
    slots = StateSlotPool(slot_layout(model.config, torch.float32), num_slots=3, device="cpu")
    blocks.allocate(2)  # start the tables at scattered ids
    tables = [blocks.allocate(4), blocks.allocate(2), blocks.allocate(1)]
    seq_slots = [slots.allocate() for _ in prompts]
    paged = PagedModelCache(blocks, slots, model.config, torch.float32)
    reference = ContiguousCache(len(prompts), model.config, torch.float32, "cpu")
    splits = [(0, 17), (17, 29)]  # tokens of each prompt per step (clipped to its length)
    with torch.no_grad():
        for start, end in splits:
            pieces = [p[start:end] for p in prompts]
            live = [i for i, piece in enumerate(pieces) if piece]
            steps = [SequenceStep(tuple(pieces[i]), start, tuple(tables[i]), seq_slots[i]) for i in live]
            rows = list(range(sum(len(pieces[i]) for i in live)))
            got = model.forward_step(build_step_metadata(steps, BLOCK, "cpu", logit_rows=rows), paged)
            contiguous_steps = reference.steps(pieces)
            want = model.forward_step(
                build_step_metadata(contiguous_steps, reference.block_size, "cpu", logit_rows=rows), reference
            )
            reference.advance(pieces)
            assert [s.block_table for s in contiguous_steps] == [(i,) for i in live]
            assert torch.equal(got, want)
    blocks.check_integrity()
    slots.check_integrity()


def test_full_prompt_logits_match_single_pass(tiny_checkpoint):
    model = load_model(tiny_checkpoint("k3"), dtype=torch.float32)
    ids = torch.randint(0, 1024, (1, 40), generator=torch.Generator().manual_seed(4))
    blocks = BlockPool(block_layout(model.config, BLOCK, torch.float32), BLOCK, num_blocks=8, device="cpu")
    slots = StateSlotPool(slot_layout(model.config, torch.float32), num_slots=1, device="cpu")
    step = SequenceStep(tuple(ids[0].tolist()), 0, tuple(blocks.allocate(5)), slots.allocate())
    with torch.no_grad():
        paged = model.forward_step(
            build_step_metadata([step], BLOCK, "cpu", logit_rows=list(range(40))),
            PagedModelCache(blocks, slots, model.config, torch.float32),
        )
        full = model(ids)[0]
    assert relative_error(paged, full) == 0.0


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_blocks_are_smaller_used_and_close(family, tiny_checkpoint):
    """FP8 storage really runs (logprobs move) and stays close; numbers from ``measure_kv_format``."""
    model = load_model(tiny_checkpoint(family), dtype=torch.float32)
    fp8 = block_layout(model.config, BLOCK, torch.float32, "fp8")
    assert {f.kind for f in fp8.fields} <= {"latent_fp8", "index_key_fp8"}
    generator = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 1024, (n,), generator=generator).tolist() for n in (150, 70)]
    report = measure_kv_format(model, prompts, chunk=48, block=16)
    print(f"{family}: {report}")
    assert report.bytes_per_token_fp8 < report.bytes_per_token_auto
    assert report.logprob_abs_diff_max > 0  # the quantised path ran
    if model.config.indexer is None:
        assert report.indexer_overlap is None
        assert report.logprob_abs_diff_mean < 0.05 and report.argmax_agreement >= 0.9
    else:
        assert 0.5 < report.indexer_overlap <= 1.0
        assert report.logprob_abs_diff_mean < 2.0


def test_fp8_comparison_runs_on_a_batch_invariant_model(tiny_checkpoint):
    """`baton eval --batch-invariant`: the comparison's slots keep the CF-BI open chunk the model writes."""
    model = load_model(tiny_checkpoint("k3"), dtype=torch.float32)
    model.set_batch_invariant(True)
    prompt = torch.randint(0, 1024, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    report = measure_kv_format(model, [prompt], chunk=16, block=16)
    assert report.tokens == 40 and report.logprob_abs_diff_max > 0
