"""Which of the draft model's forwards its decode CUDA graphs serve, on the CPU (nothing captured): a
stand-in ``DecodeGraphs`` keeps the real eligibility test (``can_replay``) and serves each replay with
an eager forward of the replayed steps, recording them. Each proposal replays its ``k - 1`` one-token
draft feeds, and its tail when every tail is one token (after a commit unless all ``k`` drafts were
accepted, so such a round is all replays); prompts and two-token tails stay eager; the
drafts and their distributions are a proposer's without graphs, bit for bit. The GPU side (captured
graphs, greedy tokens and acceptance equal to an engine without graphs) is
``tests/gpu/test_draft_graphs_gpu.py``."""

from dataclasses import replace

import pytest
import torch

from services.engine.cuda_graphs import DecodeGraphs, capture_sizes
from services.engine.model.step_metadata import SequenceStep, build_step_metadata
from services.engine.speculative.draft_model import DraftModelProposer
from tests.engine.test_draft_model import (
    ENGINE,
    GREEDY,
    accept,
    draft_overrides,
    make_proposer,
    make_requests,
    record_forwards,
    release_all,
    sampled,
)


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint):
    """``checkpoints(family) -> (target_dir, draft_dir)``, as ``test_draft_model.py``'s."""
    return lambda family: (
        tiny_checkpoint(family),
        tiny_checkpoint(family, seed=1, **draft_overrides(family)),
    )


class EagerReplays(DecodeGraphs):
    """``DecodeGraphs``' eligibility over the draft's sizes; ``replay_logits`` runs the steps eagerly
    (no padding) and records them."""

    def __init__(self, proposer: DraftModelProposer, max_seq_len: int):
        self.proposer = proposer
        self.graphs = dict.fromkeys(capture_sizes(ENGINE["max_num_seqs"]))
        self.max_seq_len = max_seq_len
        self.num_draft = 0
        self.replays = 0
        self.replayed: list[list[SequenceStep]] = []

    def replay_logits(self, steps: list[SequenceStep], input_ids: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids is not None:  # the greedy chain's drafts, fed on the device
            steps = [replace(step, token_ids=(int(t),)) for step, t in zip(steps, input_ids, strict=True)]
        self.replays += 1
        self.replayed.append(list(steps))
        meta = build_step_metadata(
            steps,
            self.proposer.blocks.block_size,
            self.proposer.device,
            logit_rows=list(range(len(steps))),
            index_topk=self.proposer.model.index_topk,
        )
        return self.proposer.model.forward_step(meta, self.proposer.paged)


def with_stand_in(checkpoints, k, max_seq_len=ENGINE["max_model_len"] + 3):
    proposer = make_proposer(checkpoints, "k3", k)
    assert proposer.graphs is None  # no cuda_graphs asked for: every forward eager
    proposer.graphs = EagerReplays(proposer, max_seq_len)
    return proposer, proposer.graphs


def assert_same_proposals(got, want, requests):
    for request in requests:
        assert got[request.request_id].token_ids == want[request.request_id].token_ids
        assert torch.equal(got[request.request_id].probs, want[request.request_id].probs)


def test_one_token_feeds_replay_and_drafts_equal_a_proposer_without_graphs(checkpoints):
    """Sampled drafts (the host loop): the k feeds of every round replay, and from the second round on
    the one-token tail does too, whatever each seat accepted."""
    k = 3
    proposer, graphs = with_stand_in(checkpoints, k)
    eager = make_proposer(checkpoints, "k3", k)
    requests, copies = make_requests(sampled(5)), make_requests(sampled(5))
    proposals = proposer.propose(requests)
    assert_same_proposals(proposals, eager.propose(copies), requests)
    assert graphs.replays == k  # the prompts ran eagerly, drafts 1..k were fed from the graphs
    for steps in graphs.replayed:
        assert len(steps) == len(requests) and all(len(s.token_ids) == 1 and s.past > 0 for s in steps)
    for accepted in ((0, 1, k - 1, k), (k, 0, 1, k - 1)):
        for request, copy, n in zip(requests, copies, accepted, strict=True):
            accept(proposer, request, proposals[request.request_id].token_ids, n)
            accept(eager, copy, proposals[request.request_id].token_ids, n)
        forwards, before = record_forwards(proposer), graphs.replays
        proposals = proposer.propose(requests)
        assert_same_proposals(proposals, eager.propose(copies), requests)
        assert graphs.replays - before == k + 1 and len(forwards) == k + 1  # every forward replayed
        assert graphs.replayed[-(k + 1) :] == forwards
        assert [s.token_ids for s in forwards[0]] == [(r.all_ids[-1],) for r in requests]
    release_all(proposer, requests)
    release_all(eager, copies)


def test_greedy_drafts_run_on_the_device_and_equal_a_proposer_without_graphs(checkpoints):
    """Greedy requests: the k feeds go through ``_greedy_chain`` (each draft's argmax fed as the next
    replay's input ids, no per-draft host read) and give the host loop's drafts and states."""
    k = 3
    proposer, graphs = with_stand_in(checkpoints, k)
    eager = make_proposer(checkpoints, "k3", k)
    requests, copies = make_requests(lambda i: GREEDY), make_requests(lambda i: GREEDY)
    chained = []
    chain = proposer._greedy_chain
    proposer._greedy_chain = lambda *args: chained.append(args[2]) or chain(*args)
    proposals = proposer.propose(requests)
    assert proposals == eager.propose(copies) and chained == [k] and graphs.replays == k
    for accepted in ((0, 1, k - 1, k), (k, 2, 0, 1)):
        for request, copy, n in zip(requests, copies, accepted, strict=True):
            accept(proposer, request, proposals[request.request_id].token_ids, n)
            accept(eager, copy, proposals[request.request_id].token_ids, n)
        before = graphs.replays
        proposals = proposer.propose(requests)
        assert proposals == eager.propose(copies) and graphs.replays - before == k + 1
    for request, copy in zip(requests, copies, strict=True):
        seat, twin = proposer.seats[request.request_id], eager.seats[copy.request_id]
        assert torch.equal(proposer.slots.storage[seat.slot], eager.slots.storage[twin.slot])
    release_all(proposer, requests)
    release_all(eager, copies)


def test_sequences_past_the_graphs_bound_run_eagerly(checkpoints):
    """A seat whose one-token feed would pass ``max_seq_len`` makes its whole forward eager."""
    k = 3
    requests = make_requests(sampled(9))
    longest = max(len(r.all_ids) for r in requests)
    proposer, graphs = with_stand_in(checkpoints, k, max_seq_len=longest + 1)
    proposer.propose(requests)  # the first feed (past = longest) fits, the second (longest + 1) not
    assert graphs.replays == 1
    release_all(proposer, requests)
