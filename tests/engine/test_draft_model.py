"""The draft model proposer on tiny CPU checkpoints: its greedy drafts are the draft model's own greedy
continuation, commit keeps the accepted fed drafts' KDA state (restoring the state after the last
accepted one) so the next tail is the target's token alone and the next drafts are a fresh run's,
sampled drafts carry their distributions, release frees everything, and the start-up compatibility
check."""

import json
import shutil

import pytest
import torch

from common.sampling_params import SamplingParams
from common.tokenizer import write_tiny_tokenizer
from services.engine import LLM
from services.engine.checkpoint.loader import load_model
from services.engine.engine_config import EngineConfig
from services.engine.request import Request
from services.engine.speculative.draft_compatibility import check_draft_compatible
from services.engine.speculative.draft_model import DraftModelProposer
from tests.conftest import TEST_DEVICE

PROMPTS = [list(range(5, 5 + n)) for n in (23, 7, 1, 40)]
FIRST_TOKEN = 9  # the "target's" first generated token of every request
GREEDY = SamplingParams(temperature=0)
ENGINE = {"block_size": 8, "max_num_seqs": 4, "max_num_batched_tokens": 16, "max_model_len": 128}


def draft_overrides(family):
    """A second tiny checkpoint of ``family`` with half the layers (and another seed)."""
    if family == "deepseek_v32":
        return {"num_hidden_layers": 2}
    attention = {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4}
    return {
        "num_hidden_layers": 2,
        "linear_attn_config": {**attention, "kda_layers": [1], "full_attn_layers": [2]},
    }


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint):
    """``checkpoints(family) -> (target_dir, draft_dir)``."""

    def make(family):
        return tiny_checkpoint(family), tiny_checkpoint(family, seed=1, **draft_overrides(family))

    return make


@pytest.fixture(scope="module")
def draft_llms(checkpoints):
    """The draft checkpoint as a plain engine (its own greedy continuations), one per family."""
    made = {}

    def make(family):
        if family not in made:
            made[family] = LLM(str(checkpoints(family)[1]), dtype="float32", device=TEST_DEVICE, **ENGINE)
        return made[family]

    return make


def make_proposer(checkpoints, family, k, batch_invariant=False):
    target_dir, draft_dir = checkpoints(family)
    config = EngineConfig(
        model=str(target_dir), device=TEST_DEVICE, dtype="float32", draft_model=str(draft_dir),
        num_draft_tokens=k, batch_invariant=batch_invariant, **ENGINE,
    )  # fmt: skip
    target = load_model(target_dir, device=TEST_DEVICE, dtype=torch.float32)
    return DraftModelProposer(config, target)


def make_requests(params_of):
    return [
        Request(f"r{i}", list(prompt), params_of(i), frozenset(), output_ids=[FIRST_TOKEN])
        for i, prompt in enumerate(PROMPTS)
    ]


def greedy_continuations(llm, sequences, k):
    outputs = llm.generate(sequences, SamplingParams(max_tokens=k, temperature=0, ignore_eos=True))
    return [tuple(output.token_ids) for output in outputs]


def release_all(proposer, requests):
    for request in requests:
        proposer.release(request.request_id)
    proposer.check_integrity()
    assert proposer.blocks.num_free == proposer.blocks.num_blocks, "draft blocks leaked"
    assert proposer.slots.num_free == proposer.slots.num_slots, "draft state slots leaked"


def record_forwards(proposer):
    """Wrap ``proposer._forward``: the returned list gets each forward's steps (replayed or eager)."""
    forwards, forward = [], proposer._forward

    def recording(steps, logit_rows):
        forwards.append(list(steps))
        return forward(steps, logit_rows)

    proposer._forward = recording
    return forwards


def accept(proposer, request, drafts, num_accepted):
    """What the engine does after verifying: append the accepted drafts and a token of the target's
    own (one the draft did not propose there), then commit."""
    other = FIRST_TOKEN if num_accepted == len(drafts) else (drafts[num_accepted] + 1) % 1024
    request.output_ids.extend([*drafts[:num_accepted], other])
    proposer.commit(request, num_accepted)


@pytest.mark.parametrize("family", ["k3", "deepseek_v32"])
def test_greedy_drafts_are_the_draft_models_own_continuation(family, checkpoints, draft_llms):
    proposer = make_proposer(checkpoints, family, k=4)
    requests = make_requests(lambda i: GREEDY)
    proposals = proposer.propose(requests)
    want = greedy_continuations(draft_llms(family), [r.all_ids for r in requests], 4)
    assert [proposals[r.request_id].token_ids for r in requests] == want
    assert all(proposals[r.request_id].probs is None for r in requests)
    # the 41-token tail ran in chunks of 16 (max_num_batched_tokens): 3 forwards before the drafts
    assert proposer.seats["r3"].checkpoint == len(requests[3].all_ids)
    release_all(proposer, requests)


@pytest.mark.parametrize("family", ["k3", "deepseek_v32"])
def test_commit_keeps_the_accepted_drafts_so_the_next_tail_is_one_token(family, checkpoints, draft_llms):
    """Two rounds of ``k = 4`` drafts, each request accepting 0 .. k drafts across them: after each
    commit the seat covers the accepted drafts (every draft was fed; its slot the checkpoint slot of
    that many unless all were accepted), the next proposal's tail forward runs one token per seat, and
    its drafts are the draft model's own continuation of the whole sequence."""
    k = 4
    proposer = make_proposer(checkpoints, family, k)
    forwards = record_forwards(proposer)
    requests = make_requests(lambda i: GREEDY)
    proposals = proposer.propose(requests)
    for accepted in ((0, 1, 2, k), (k - 1, k, 0, 1)):  # request i accepts accepted[i] drafts
        for request, num_accepted in zip(requests, accepted, strict=True):
            seat = proposer.seats[request.request_id]
            assert seat.num_computed == seat.checkpoint + k  # drafts 1..k were fed
            accept(proposer, request, proposals[request.request_id].token_ids, num_accepted)
            assert seat.num_computed == seat.checkpoint + num_accepted, f"{num_accepted} accepted"
            assert len(request.all_ids) - seat.num_computed == 1
            if num_accepted < k:  # the whole slot is that checkpoint slot's again
                restored = proposer.slots.storage[seat.checkpoint_slots[num_accepted]]
                assert torch.equal(proposer.slots.storage[seat.slot], restored)
        del forwards[:]
        proposals = proposer.propose(requests)
        tokens_per_seat = [[len(step.token_ids) for step in steps] for steps in forwards]
        assert tokens_per_seat == [[1] * len(requests)] * (k + 1)
        want = greedy_continuations(draft_llms(family), [r.all_ids for r in requests], k)
        assert [proposals[r.request_id].token_ids for r in requests] == want
    release_all(proposer, requests)


def test_a_shorter_proposal_commits_by_its_own_k(checkpoints, draft_llms):
    """``propose(num_tokens=2)`` on a ``k = 4`` proposer (the policy shrank the step): two drafts, both
    fed, and commit keeps as many as were accepted; the next full proposal is a fresh run's."""
    proposer = make_proposer(checkpoints, "k3", k=4)
    requests = make_requests(lambda i: GREEDY)[:3]
    short = proposer.propose(requests, num_tokens=2)
    want = greedy_continuations(draft_llms("k3"), [r.all_ids for r in requests], 2)
    assert [short[r.request_id].token_ids for r in requests] == want
    for request, num_accepted in zip(requests, (0, 1, 2), strict=True):
        seat = proposer.seats[request.request_id]
        assert seat.num_computed == seat.checkpoint + 2  # two fed drafts, not k = 4
        accept(proposer, request, short[request.request_id].token_ids, num_accepted)
        assert seat.num_computed == seat.checkpoint + num_accepted, f"{num_accepted}"
    full = proposer.propose(requests)
    want = greedy_continuations(draft_llms("k3"), [r.all_ids for r in requests], 4)
    assert [full[r.request_id].token_ids for r in requests] == want
    for request in requests:
        accept(proposer, request, full[request.request_id].token_ids, 0)
    for bad in (0, 5):
        with pytest.raises(ValueError, match=r"num_tokens: must be in \[1, 4\]"):
            proposer.propose(requests, num_tokens=bad)
    release_all(proposer, requests)


def test_one_draft_per_proposal_holds_one_checkpoint_slot(checkpoints, draft_llms):
    """``k = 1``: the draft is fed after its checkpoint, so a seat is its slot and one checkpoint slot;
    commit of 0 (restored) or 1 (kept) and discard give the next drafts of a fresh run."""
    proposer = make_proposer(checkpoints, "k3", k=1)
    assert proposer.slots.num_slots == 2 * ENGINE["max_num_seqs"]
    requests = make_requests(lambda i: GREEDY)[:3]
    first = proposer.propose(requests)
    assert all(len(proposer.seats[r.request_id].checkpoint_slots) == 1 for r in requests)
    accept(proposer, requests[0], first["r0"].token_ids, 0)
    accept(proposer, requests[1], first["r1"].token_ids, 1)
    proposer.discard(requests[2])
    requests[2].output_ids.append(FIRST_TOKEN)
    again = proposer.propose(requests)
    want = greedy_continuations(draft_llms("k3"), [r.all_ids for r in requests], 1)
    assert [again[r.request_id].token_ids for r in requests] == want
    release_all(proposer, requests)


def sampled(seed):
    def params_of(i):
        return SamplingParams(temperature=1.5, top_k=40, top_p=0.95, min_p=0.01, seed=seed + i)

    return params_of


def test_sampled_drafts_carry_their_distribution_and_roll_back_to_a_fresh_runs_numbers(checkpoints):
    k = 3
    proposer, fresh = make_proposer(checkpoints, "k3", k), make_proposer(checkpoints, "k3", k)
    requests, copies = make_requests(sampled(7)), make_requests(sampled(7))
    drafts = proposer.propose(requests)
    for request in requests:
        proposal = drafts[request.request_id]
        assert proposal.probs.shape == (k, 1024) and proposal.probs.dtype == torch.float32
        assert torch.allclose(proposal.probs.sum(dim=1), torch.ones(k), atol=1e-5)
        assert all(proposal.probs[i, token] > 0 for i, token in enumerate(proposal.token_ids))
        assert int((proposal.probs > 0).sum(dim=1).max()) <= 40  # top-k applied
    # same seeds, same drafts and distributions (another proposer, bit for bit); other seeds differ
    again = fresh.propose(copies)
    for request in requests:
        assert again[request.request_id].token_ids == drafts[request.request_id].token_ids
        assert torch.equal(again[request.request_id].probs, drafts[request.request_id].probs)
    release_all(fresh, copies)
    reseeded = make_requests(sampled(1000))
    others = fresh.propose(reseeded)
    assert any(others[r.request_id].token_ids != drafts[r.request_id].token_ids for r in requests)
    release_all(fresh, reseeded)
    # after commit the next proposal is the one a proposer with no history makes for that sequence
    for request, num_accepted in zip(requests, (0, 1, k - 1, k), strict=True):
        accept(proposer, request, drafts[request.request_id].token_ids, num_accepted)
    continued = proposer.propose(requests)
    from_scratch = fresh.propose(requests)
    for request in requests:
        assert continued[request.request_id].token_ids == from_scratch[request.request_id].token_ids
        torch.testing.assert_close(
            continued[request.request_id].probs, from_scratch[request.request_id].probs, atol=1e-5, rtol=0
        )
    release_all(proposer, requests)
    release_all(fresh, requests)


def test_batch_invariant_rollback_gives_a_fresh_runs_bits(checkpoints):
    """Invariant numerics: chunking does not change bits, so the drafts after commit (slot kept or
    restored from any checkpoint slot, CF-BI open rows included) carry exactly a fresh proposer's
    distributions, round after round."""
    k = 3
    proposer = make_proposer(checkpoints, "k3", k, batch_invariant=True)
    fresh = make_proposer(checkpoints, "k3", k, batch_invariant=True)
    assert proposer.slots.layout.has(0, "open_k")  # the slot carries the open chunk's rows
    requests = make_requests(sampled(3))
    drafts = proposer.propose(requests)
    for accepted in ((0, 1, k - 1, k), (k, 0, 1, k - 1)):
        for request, num_accepted in zip(requests, accepted, strict=True):
            accept(proposer, request, drafts[request.request_id].token_ids, num_accepted)
        drafts, from_scratch = proposer.propose(requests), fresh.propose(requests)
        for request in requests:
            assert drafts[request.request_id].token_ids == from_scratch[request.request_id].token_ids
            assert torch.equal(drafts[request.request_id].probs, from_scratch[request.request_id].probs)
        release_all(fresh, requests)
    release_all(proposer, requests)


def test_uncommitted_proposal_is_dropped_and_seats_are_bounded(checkpoints, draft_llms):
    proposer = make_proposer(checkpoints, "k3", k=3)
    requests = make_requests(lambda i: GREEDY)
    proposer.propose(requests)
    for request in requests:  # decoded one token without verifying the drafts
        request.output_ids.append(FIRST_TOKEN)
    proposals = proposer.propose(requests)
    want = greedy_continuations(draft_llms("k3"), [r.all_ids for r in requests], 3)
    assert [proposals[r.request_id].token_ids for r in requests] == want
    with pytest.raises(RuntimeError, match="no free seat"):
        proposer.propose([Request("extra", [5, 6], GREEDY, frozenset(), output_ids=[FIRST_TOKEN])])
    with pytest.raises(ValueError, match="accepted drafts"):
        proposer.commit(requests[0], 1)  # output_ids do not go on with the drafts
    accept(proposer, requests[0], proposals["r0"].token_ids, 3)
    with pytest.raises(KeyError, match="without a pending proposal"):
        proposer.commit(requests[0], 0)  # committed already
    release_all(proposer, requests)


def test_discard_rolls_back_and_keeps_the_seat(checkpoints, draft_llms):
    proposer = make_proposer(checkpoints, "k3", k=3)
    requests = make_requests(lambda i: GREEDY)
    proposer.propose(requests)
    checkpoints_at = {r.request_id: proposer.seats[r.request_id].checkpoint for r in requests}
    for request in requests:  # the drafts did not fit the step
        proposer.discard(request)
        seat = proposer.seats[request.request_id]
        assert seat.drafted is None and seat.num_computed == checkpoints_at[request.request_id]
        slots = proposer.slots.storage  # the state after the tail, not after the 2 fed drafts
        assert torch.equal(slots[seat.slot], slots[seat.checkpoint_slots[0]])
        assert not torch.equal(slots[seat.slot], slots[seat.checkpoint_slots[1]])
        request.output_ids.append(FIRST_TOKEN)  # the plain step's token
    again = proposer.propose(requests)  # from the certain state: only the new token is fed
    want = greedy_continuations(draft_llms("k3"), [r.all_ids for r in requests], 3)
    assert [again[r.request_id].token_ids for r in requests] == want
    assert {r.request_id: proposer.seats[r.request_id].checkpoint - 1 for r in requests} == checkpoints_at
    proposer.discard(Request("unknown", [5], GREEDY, frozenset()))  # ignored
    release_all(proposer, requests)


def test_release_frees_everything_and_integrity_sees_a_leak(checkpoints):
    proposer = make_proposer(checkpoints, "k3", k=3)
    requests = make_requests(lambda i: GREEDY)
    proposer.propose(requests)
    proposer.check_integrity()
    assert proposer.slots.num_slots == 4 * ENGINE["max_num_seqs"]  # a slot and 3 checkpoints per seat
    assert proposer.slots.num_free == proposer.slots.num_slots - 4 * len(requests)
    proposer.release("never-seen")  # ignored
    lost = proposer.seats.pop("r0")  # a seat forgotten without freeing its blocks and slots
    with pytest.raises(AssertionError, match="draft blocks used"):
        proposer.check_integrity()
    proposer.seats["r0"] = lost
    forgotten = lost.checkpoint_slots.pop()  # a checkpoint slot no seat holds
    with pytest.raises(AssertionError, match="draft slots used"):
        proposer.check_integrity()
    lost.checkpoint_slots.append(forgotten)
    release_all(proposer, requests)


def test_num_draft_tokens_and_the_loaded_vocabulary_are_checked(checkpoints, tiny_checkpoint):
    with pytest.raises(ValueError, match="--num-draft-tokens"):
        make_proposer(checkpoints, "k3", k=0)
    target_dir = checkpoints("k3")[0]
    config = EngineConfig(
        model=str(target_dir), draft_model=str(tiny_checkpoint("k3", vocab_size=512)), num_draft_tokens=2
    )
    with pytest.raises(ValueError, match="--draft-model: .* has vocab_size 512, the target has 1024"):
        DraftModelProposer(config, load_model(target_dir, dtype=torch.float32))


def test_compatible_draft_passes(checkpoints):
    check_draft_compatible(*checkpoints("k3"))


def test_other_family_or_vocabulary_is_refused(checkpoints, tiny_checkpoint):
    target = checkpoints("k3")[0]
    with pytest.raises(ValueError, match="--draft-model: .* is a deepseek_v32 checkpoint, the target .* k3"):
        check_draft_compatible(target, tiny_checkpoint("deepseek_v32"))
    with pytest.raises(ValueError, match="--draft-model: .* has vocab_size 512, the target .* 1024"):
        check_draft_compatible(target, tiny_checkpoint("k3", vocab_size=512))


def test_tokenizer_vocabulary_must_match(checkpoints, tmp_path):
    target, draft = checkpoints("k3")
    reformatted = tmp_path / "reformatted"
    shutil.copytree(draft, reformatted)
    tokenizer = json.loads((reformatted / "tokenizer.json").read_text())
    (reformatted / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1))  # other bytes, same map
    check_draft_compatible(target, reformatted)
    other = tmp_path / "other"
    shutil.copytree(draft, other)
    write_tiny_tokenizer(other, "deepseek_v32", 1024)  # the same size, other special tokens
    with pytest.raises(ValueError, match="--draft-model: .* map tokens differently"):
        check_draft_compatible(target, other)
