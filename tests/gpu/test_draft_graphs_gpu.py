"""The draft model's decode CUDA graphs on the device machine (skipped without CUDA): a draft replay
computes bitwise what the eager forward computes on the same static inputs (a batch of 3 padded to 4),
pools included; greedy speculative decoding with the draft's graphs (and the target's) gives the tokens,
drafts and acceptances of the same engine without graphs, and the draft's graphs did replay."""

import pytest
import torch

from common.sampling_params import SamplingParams
from services.engine import LLM
from services.engine.checkpoint.loader import load_model
from services.engine.engine_config import EngineConfig
from services.engine.model.step_metadata import SequenceStep
from services.engine.request import Request
from services.engine.speculative.draft_model import DraftModelProposer
from tests.engine.test_draft_model import draft_overrides

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICE = "cuda:0"
ENGINE = {"block_size": 16, "max_num_seqs": 4, "max_model_len": 256}


@pytest.fixture(scope="module")
def pair(tiny_checkpoint):
    """``(target_dir, draft_dir)``: k3, the draft a 2-layer tiny checkpoint of another seed."""
    return tiny_checkpoint("k3"), tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))


def _prompts(count: int, length: int = 40) -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(3, 1024, (length + 7 * i,), generator=generator).tolist() for i in range(count)]


def test_draft_replay_equals_eager_bitwise(pair):
    target_dir, draft_dir = pair
    config = EngineConfig(
        model=str(target_dir), device=DEVICE, dtype="float32", kernels="triton", draft_model=str(draft_dir),
        num_draft_tokens=3, **ENGINE,
    )  # fmt: skip
    target = load_model(target_dir, device=DEVICE, dtype=torch.float32)
    proposer = DraftModelProposer(config, target, cuda_graphs=True)
    graphs = proposer.graphs
    assert graphs is not None and graphs.padded_size(3) == 4 and proposer.blocks.scratch_id is not None
    greedy = SamplingParams(temperature=0)
    requests = [Request(f"r{i}", p, greedy, frozenset(), output_ids=[9]) for i, p in enumerate(_prompts(3))]
    proposals = proposer.propose(requests)
    assert graphs.replays == 2  # drafts 1 and 2 fed from the graphs
    seats = [proposer.seats[r.request_id] for r in requests]
    # the last fed draft again at its own position: one token after a non-empty prefix, blocks held
    fed = [proposals[r.request_id].token_ids[1] for r in requests]
    steps = [
        SequenceStep((token,), s.num_computed - 1, tuple(s.block_table), s.slot)
        for token, s in zip(fed, seats, strict=True)
    ]
    assert graphs.can_replay(steps, len(steps))
    pools = (proposer.blocks.storage, proposer.slots.storage)
    before = [p.clone() for p in pools]
    replayed_logits = graphs.replay_logits(steps).clone()
    replayed_pools = [p.clone() for p in pools]
    for pool, saved in zip(pools, before, strict=True):
        pool.copy_(saved)
    with torch.no_grad():  # the same static metadata, eagerly
        eager_logits = proposer.model.forward_step(graphs.graphs[4].meta, proposer.paged)
    assert graphs.replays == 3 and replayed_logits.shape == (3, proposer.model.config.vocab_size)
    assert torch.equal(replayed_logits.view(torch.int32), eager_logits[:3].view(torch.int32))
    assert all(torch.equal(a, b) for a, b in zip(replayed_pools, pools, strict=True))
    for request in requests:
        proposer.release(request.request_id)
    proposer.check_integrity()


def test_speculative_decoding_with_draft_graphs_equals_without(pair):
    target_dir, draft_dir = pair
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=0)
    runs = {}
    for graphs in (True, False):
        llm = LLM(
            str(target_dir), device=DEVICE, dtype="float32", kernels="triton", cuda_graphs=graphs,
            draft_model=str(draft_dir), num_draft_tokens=4, spec_policy="fixed", **ENGINE,
        )  # fmt: skip
        outputs = llm.generate(_prompts(3), params)  # 3 seats: the draft's graphs pad them to 4
        proposer, counts = llm.engine.proposer, llm.engine.spec_counters.counts()
        if graphs:
            assert llm.engine.runner.graphs is not None
            assert proposer.graphs is not None and proposer.graphs.replays > 0
        else:
            assert proposer.graphs is None
        llm.engine.check_integrity()
        runs[graphs] = (
            [o.token_ids for o in outputs],
            counts.drafted_by_position,
            counts.accepted_by_position,
        )
    assert sum(runs[True][1]) > 0
    assert runs[True] == runs[False]  # same tokens, and the same drafts accepted at every position
