"""``DraftModelProposer``: a small model of the target's family drafts ``k`` tokens per request.

The draft keeps its own cache (a block pool and a KDA state-slot pool, no prefix cache, no host
tier) and, per request, a ``DraftSeat``: its blocks, its state slot, ``num_draft_tokens`` checkpoint
slots and how many of the request's tokens it has computed. One ``propose`` of ``k`` drafts
(``num_draft_tokens``, or fewer for the step) for a request::

    all_ids:  | computed by the draft | tail (not yet) |
                                      ^ forward(tail): draft 1 from the last row
                                                     ^ checkpoint (tokens covered)
    then k one-token forwards, each after copying the slot to a checkpoint slot:
        slot -> checkpoint_slots[0], feed d1 -> d2
        slot -> checkpoint_slots[1], feed d2 -> d3
        ...
        slot -> checkpoint_slots[k-1], feed dk (its row unused: the state then covers every draft)

so after it the slot covers ``checkpoint + k`` tokens and ``checkpoint_slots[j]`` the state after the
tail and ``j`` fed drafts. ``commit(n)`` keeps the ``n`` fed drafts the target accepted: the slot
stays when that is all ``k``, else it is restored from ``checkpoint_slots[n]`` (a whole-slot copy:
every KDA field, CF-BI open rows included); computed = checkpoint + ``n``. The next tail is what the
target added after that: its bonus token alone, every round. The MLA rows past ``computed`` are simply
written again. Blocks are kept until ``release`` (rewritten, never read past ``computed``).

With the engine's CUDA graphs on (``cuda_graphs.use_cuda_graphs``), the draft captures its own decode
graphs (``DecodeGraphs``, forward only) over its pools: a forward whose every seat feeds one token after
a non-empty prefix (the ``k`` draft feeds, a one-token tail) replays one, so every round after the
first is all replays; prompts and ``prefill_seat`` run eagerly. When every request is greedy the ``k``
feeds run on the device alone (``_greedy_chain``): each draft's argmax goes straight into the next
replay's input row, the checkpoint copies take index tensors made once, and the host reads the drafts
once at the end (no sync per draft).

A handoff may carry a seat's prompt rows (``services/engine/draft_handoff.py``): the decode engine
``reserve_seat``s blocks for the prompt and a slot, the prefill engine ``prefill_seat``s the prompt into
a seat of its own and writes its rows there, and ``seat_arrived`` then counts the prompt as computed
(the first token is the next tail). A reserved seat whose rows never come catches up by itself.
"""

from dataclasses import dataclass

import torch

from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.fingerprint import checkpoint_fingerprint
from services.engine.checkpoint.loader import load_model
from services.engine.cuda_graphs import DecodeGraphs, capture_sizes, forward_capturable
from services.engine.engine_config import EngineConfig
from services.engine.model.causal_lm import CausalLM
from services.engine.model.step_metadata import SequenceStep, build_step_metadata
from services.engine.request import Request

from .draft_sampling import draw_drafts
from .proposal import DraftProposer, DraftTokens


@dataclass
class DraftSeat:
    """One request's place in the draft's cache.

    Attributes:
        block_table: the draft blocks of the request's positions, in order.
        slot: the KDA state slot the draft's forwards continue.
        checkpoint_slots: ``num_draft_tokens`` slots; after a ``propose`` of ``k``, ``checkpoint_slots[j]``
            holds the state after the tail and ``j`` fed drafts (``checkpoint + j`` tokens), for
            ``j < k`` (the state after all ``k`` is ``slot`` itself).
        num_computed: leading tokens whose rows and state the draft holds (after a ``propose``, that
            count includes the fed drafts, which are not in ``all_ids`` until ``commit``).
        checkpoint: tokens the state after the last tail covers (``checkpoint_slots[0]``'s, once a
            draft is fed).
        drafted: the last proposal's tokens until it is committed (its length is that proposal's
            ``k``: commit keeps as many fed drafts as were accepted); None when nothing is pending.
    """

    block_table: list[int]
    slot: int
    checkpoint_slots: list[int]
    num_computed: int = 0
    checkpoint: int = 0
    drafted: tuple[int, ...] | None = None


def load_draft_model(config: EngineConfig, target: CausalLM) -> CausalLM:
    """``config.draft_model`` on the target's device and dtype, with the engine's numerics and kernels
    (as ``engine_core.load_engine_model`` sets them for the target)."""
    model = load_model(config.draft_model, device=str(target.device), dtype=target.dtype)
    model.set_batch_invariant(config.batch_invariant)
    model.set_kernels(config.kernel_backend, config.kv_format)
    return model


class DraftModelProposer(DraftProposer):
    """Drafts with ``config.draft_model``: its own pools, one seat per request, chained drafts.

    Args:
        config: the engine's config (``draft_model``, ``num_draft_tokens``, ``max_num_seqs``,
            ``max_model_len``, ``max_num_batched_tokens``, ``block_size``, numerics and kernels).
        target: the loaded target model (device, dtype and vocabulary to match).
        cuda_graphs: whether the engine replays decode CUDA graphs (``cuda_graphs.use_cuda_graphs`` for
            its target); the draft then captures its own, ``graphs``, at construction, when its kernels
            can be captured too (else None: every forward runs eagerly).

    Pools: ``max_num_seqs`` seats, each able to hold a whole sequence plus its drafts
    (``max_model_len + num_draft_tokens`` positions), ``1 + num_draft_tokens`` state slots each (the
    slot and its checkpoints); with graphs, a scratch block and slot more for the padding rows.

    Raises:
        ValueError: ``num_draft_tokens`` below 1, or a draft whose vocabulary differs from the
            target's (naming ``--draft-model``).
    """

    def __init__(self, config: EngineConfig, target: CausalLM, cuda_graphs: bool = False):
        if config.num_draft_tokens < 1:
            raise ValueError(
                f"--num-draft-tokens: must be >= 1 with --draft-model, got {config.num_draft_tokens}"
            )
        self.num_draft_tokens = config.num_draft_tokens
        self.model = load_draft_model(config, target)
        if self.model.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"--draft-model: {config.draft_model} has vocab_size {self.model.config.vocab_size}, the "
                f"target has {target.config.vocab_size}; the draft must share the target's vocabulary"
            )
        self.model_fingerprint = checkpoint_fingerprint(config.draft_model)
        self.max_tokens_per_forward = config.max_num_batched_tokens
        self.device = self.model.device
        dtype = self.model.dtype
        positions = config.max_model_len + self.num_draft_tokens
        seat_blocks = -(-positions // config.block_size)
        use_graphs = cuda_graphs and forward_capturable(self.model, "the draft model")
        self.blocks = BlockPool(
            block_layout(self.model.config, config.block_size, dtype, config.kv_format),
            config.block_size,
            seat_blocks * config.max_num_seqs,
            self.device,
            scratch=use_graphs,
        )
        open_rows = FIXED_CHUNK if config.batch_invariant else 0
        self.slots = StateSlotPool(
            slot_layout(self.model.config, dtype, open_rows),
            (1 + self.num_draft_tokens) * config.max_num_seqs,
            self.device,
            scratch=use_graphs,
        )
        self.paged = PagedModelCache(self.blocks, self.slots, self.model.config, dtype)
        self.seats: dict[str, DraftSeat] = {}
        self.graphs: DecodeGraphs | None = None  # the one-token feeds' graphs; ``replays`` counts them
        if use_graphs:
            self.graphs = DecodeGraphs(
                self.model, self.paged, capture_sizes(config.max_num_seqs), positions, sample=False
            )
            self.graphs.capture()

    @torch.no_grad()
    def propose(self, requests: list[Request], num_tokens: int | None = None) -> dict[str, DraftTokens]:
        """Draft ``num_tokens`` (None: ``num_draft_tokens``) tokens for each request, all requests in
        the same forwards.

        A seat's tail is ``all_ids[num_computed:]`` (the whole sequence the first time); a proposal
        never committed (the engine decoded the request without verifying it) is dropped first: the
        seat rolls back to its checkpoint. Before each draft is fed, every seat's slot is copied to the
        checkpoint slot a ``commit`` rejecting that draft restores.

        Raises:
            RuntimeError: more requests than the draft's ``max_num_seqs`` seats.
            ValueError: a request with no token the draft has not computed; ``num_tokens`` outside
                ``[1, num_draft_tokens]``.
        """
        k = self.draft_length(num_tokens)
        if not requests:
            return {}
        seats = [self._seat(request) for request in requests]
        for seat in seats:
            if seat.drafted is not None:
                self._roll_back(seat, 0)
        tails = [request.all_ids[seat.num_computed :] for request, seat in zip(requests, seats, strict=True)]
        for request, tail in zip(requests, tails, strict=True):
            if not tail:
                raise ValueError(
                    f"request {request.request_id!r}: no token since its last proposal to draft after"
                )
        logits = self._feed(seats, tails)
        for seat in seats:
            seat.checkpoint = seat.num_computed
        params = [request.params for request in requests]
        drafted = self._greedy_chain(seats, logits, k) if all(p.greedy for p in params) else None
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        if drafted is None:
            drafted = [[] for _ in requests]
            for step in range(k + 1):
                if step > 0:  # feed the previous drafts; their rows give the next ones (dk's: none)
                    self._checkpoint(seats, step - 1)
                    logits = self._feed(seats, [[tokens[-1]] for tokens in drafted])
                if step == k:
                    break
                positions = [request.sample_position + step for request in requests]
                tokens, rows_probs = draw_drafts(logits, params, positions)
                for i, (token, row_probs) in enumerate(zip(tokens, rows_probs, strict=True)):
                    drafted[i].append(token)
                    if row_probs is not None:
                        probs[i].append(row_probs)
        proposals = {}
        for request, seat, tokens, rows_probs in zip(requests, seats, drafted, probs, strict=True):
            seat.drafted = tuple(tokens)
            proposals[request.request_id] = DraftTokens(
                token_ids=seat.drafted, probs=torch.stack(rows_probs) if rows_probs else None
            )
        return proposals

    def commit(self, request: Request, num_accepted: int) -> None:
        """Keep the fed drafts the target accepted: the slot goes back to the state after the tail and
        ``num_accepted`` fed drafts, so the next tail is the target's token after them.

        Raises:
            ValueError: ``num_accepted`` outside ``[0, k]`` (the proposal's ``k``), or ``output_ids``
                not continuing with the accepted drafts after the checkpoint.
            KeyError: a request with no proposal to commit.
        """
        seat = self.seats.get(request.request_id)
        if seat is None or seat.drafted is None:
            raise KeyError(f"request {request.request_id!r}: commit without a pending proposal")
        k = len(seat.drafted)
        if not 0 <= num_accepted <= k:
            raise ValueError(f"num_accepted: must be in [0, {k}], got {num_accepted}")
        accepted = request.all_ids[seat.checkpoint : seat.checkpoint + num_accepted + 1]
        if tuple(accepted[:num_accepted]) != seat.drafted[:num_accepted] or len(accepted) != num_accepted + 1:
            raise ValueError(
                f"request {request.request_id!r}: output_ids must go on with the {num_accepted} accepted "
                f"drafts {seat.drafted[:num_accepted]} and one more token after position "
                f"{seat.checkpoint}, got {tuple(accepted)}"
            )
        self._roll_back(seat, num_accepted)

    def discard(self, request: Request) -> None:
        """Roll the seat back to its checkpoint: its fed drafts were never verified."""
        seat = self.seats.get(request.request_id)
        if seat is not None and seat.drafted is not None:
            self._roll_back(seat, 0)

    def release(self, request_id: str) -> None:
        """Free the request's blocks, its slot and its checkpoint slots (unknown ids are ignored)."""
        seat = self.seats.pop(request_id, None)
        if seat is None:
            return
        self.blocks.free(seat.block_table)
        for slot in (seat.slot, *seat.checkpoint_slots):
            self.slots.free(slot)

    def reserve_seat(self, request: Request) -> DraftSeat:
        """Decode side of a handoff: the request's seat, with blocks for its prompt, nothing computed
        yet (a prefill engine may write the prompt's rows into them; ``seat_arrived`` then counts them).

        Raises:
            RuntimeError: no free seat (the engine's ``max_num_seqs`` bounds its reserved and running
                requests, so this means a request already holds one).
        """
        seat = self._seat(request)
        self._grow(seat, len(request.prompt_ids))
        return seat

    def seat_arrived(self, request_id: str, num_tokens: int) -> None:
        """The reserved seat's first ``num_tokens`` tokens' rows and state were written by a handoff:
        the next proposal computes only what follows them.

        Raises:
            KeyError: no seat for ``request_id``.
            ValueError: a seat that has computed something, or fewer blocks than ``num_tokens`` need.
        """
        seat = self.seats[request_id]
        if seat.num_computed or seat.drafted is not None:
            raise ValueError(f"request {request_id!r}: its draft seat is not a fresh reservation")
        if len(seat.block_table) * self.blocks.block_size < num_tokens:
            raise ValueError(
                f"request {request_id!r}: {len(seat.block_table)} draft blocks cannot hold "
                f"{num_tokens} tokens"
            )
        seat.num_computed = seat.checkpoint = num_tokens

    @torch.no_grad()
    def prefill_seat(self, request: Request) -> DraftSeat:
        """Prefill side of a handoff: a new seat for ``request`` holding its prompt's rows and state
        (prompt tokens only), kept until ``release``. A seat is always free: the engine's running and
        held requests share its ``max_num_seqs`` target state slots, and the draft has a seat for each.

        Raises:
            ValueError: the request already has a seat.
        """
        if request.request_id in self.seats:
            raise ValueError(f"request {request.request_id!r}: already has a draft seat")
        seat = self._seat(request)
        self._feed([seat], [list(request.prompt_ids)])
        return seat

    def check_integrity(self) -> None:
        """The pools are consistent and hold exactly what the live seats hold."""
        self.blocks.check_integrity()
        self.slots.check_integrity()
        held = [block for seat in self.seats.values() for block in seat.block_table]
        assert len(held) == len(set(held)), "a draft block is held by two seats or twice"
        used = {block for block, count in enumerate(self.blocks.ref_counts) if count > 0}
        assert set(held) == used, f"draft blocks used {sorted(used)} but seats hold {sorted(held)}"
        slots = [slot for seat in self.seats.values() for slot in (seat.slot, *seat.checkpoint_slots)]
        assert len(slots) == len(set(slots)), "a draft state slot is held twice"
        assert set(slots) == self.slots.used, f"draft slots used {self.slots.used} but seats hold {slots}"

    def _seat(self, request: Request) -> DraftSeat:
        seat = self.seats.get(request.request_id)
        if seat is None:
            if self.slots.num_free < 1 + self.num_draft_tokens:
                raise RuntimeError(
                    f"draft model: no free seat for request {request.request_id!r} "
                    f"({len(self.seats)} requests hold all of them; max_num_seqs bounds both)"
                )
            seat = DraftSeat(
                block_table=[],
                slot=self.slots.allocate(),
                checkpoint_slots=[self.slots.allocate() for _ in range(self.num_draft_tokens)],
            )
            self.seats[request.request_id] = seat
        return seat

    def _greedy_chain(self, seats: list[DraftSeat], logits: torch.Tensor, k: int) -> list[list[int]] | None:
        """Greedy drafts 1..k and the k feeds on the device: draft ``j``'s argmax (ties: the lowest id,
        as ``draw_drafts``) is copied into the next replay's input row, with no host sync until the
        drafts are read at the end; the same forwards, checkpoints and tokens as the host loop. None
        (the host loop runs) without graphs or when a feed could not replay one.

        Args:
            logits: ``[S, V]``, each seat's row after its tail (draft 1's).
        """
        if self.graphs is None:
            return None
        last = [SequenceStep((0,), s.num_computed + k - 1, tuple(s.block_table), s.slot) for s in seats]
        if not self.graphs.can_replay(last, len(seats)):
            return None
        for seat in seats:
            self._grow(seat, seat.num_computed + k)
        indices = [[seat.slot for seat in seats]] + [[s.checkpoint_slots[j] for s in seats] for j in range(k)]
        sources, *targets = torch.tensor(indices, device=self.device)
        tokens = torch.empty((k, len(seats)), dtype=torch.int64, device=self.device)
        tokens[0] = torch.argmax(logits.to(torch.float32), dim=-1)
        for j in range(1, k + 1):
            self.slots.storage[targets[j - 1]] = self.slots.storage[sources]
            steps = [SequenceStep((0,), s.num_computed, tuple(s.block_table), s.slot) for s in seats]
            for seat in seats:
                seat.num_computed += 1
            rows = self.graphs.replay_logits(steps, input_ids=tokens[j - 1])
            if j < k:
                tokens[j] = torch.argmax(rows.to(torch.float32), dim=-1)
        return tokens.T.tolist()

    def _checkpoint(self, seats: list[DraftSeat], num_fed: int) -> None:
        """Every seat's slot (the state after its tail and ``num_fed`` fed drafts) copied to its
        ``checkpoint_slots[num_fed]``, in one copy."""
        sources = torch.tensor([seat.slot for seat in seats], device=self.device)
        targets = torch.tensor([seat.checkpoint_slots[num_fed] for seat in seats], device=self.device)
        self.slots.storage[targets] = self.slots.storage[sources]

    def _roll_back(self, seat: DraftSeat, num_kept: int) -> None:
        """Drop the pending proposal's fed drafts after the first ``num_kept``: the slot is restored
        from ``checkpoint_slots[num_kept]`` unless it already covers exactly those."""
        if seat.num_computed != seat.checkpoint + num_kept:
            self.slots.storage[seat.slot].copy_(self.slots.storage[seat.checkpoint_slots[num_kept]])
        seat.num_computed = seat.checkpoint + num_kept
        seat.drafted = None

    def _feed(self, seats: list[DraftSeat], tokens: list[list[int]]) -> torch.Tensor:
        """Run each seat's ``tokens`` (at least one each) after what it has computed, in forwards of at
        most ``max_num_batched_tokens`` tokens (a long list is split across forwards); a forward the
        graphs can replay (every seat one token after a non-empty prefix) replays.

        Returns:
            ``[len(seats), vocab]``: each seat's logits after its last token.
        """
        last_rows: list[torch.Tensor | None] = [None] * len(seats)
        left = [list(t) for t in tokens]
        while any(left):
            steps, owners, logit_rows, budget = [], [], [], self.max_tokens_per_forward
            for i, seat in enumerate(seats):
                if not left[i] or budget == 0:
                    continue
                chunk, left[i] = left[i][:budget], left[i][budget:]
                self._grow(seat, seat.num_computed + len(chunk))
                steps.append(
                    SequenceStep(tuple(chunk), seat.num_computed, tuple(seat.block_table), seat.slot)
                )
                seat.num_computed += len(chunk)
                budget -= len(chunk)
                if not left[i]:
                    owners.append(i)
                    logit_rows.append(self.max_tokens_per_forward - budget - 1)
            logits = self._forward(steps, logit_rows)
            for row, i in zip(logits, owners, strict=True):
                last_rows[i] = row
        return torch.stack(last_rows)

    def _forward(self, steps: list[SequenceStep], logit_rows: list[int]) -> torch.Tensor:
        """One forward's ``logit_rows``: replayed when the graphs can (one token per step, each a logits
        row, so the rows are in step order), else eager. A replay's rows are cloned: they are views of
        the graph's static logits, which a later forward of the same ``_feed`` may replay over."""
        if self.graphs is not None and self.graphs.can_replay(steps, len(logit_rows)):
            return self.graphs.replay_logits(steps).clone()
        meta = build_step_metadata(
            steps,
            self.blocks.block_size,
            self.device,
            logit_rows=logit_rows,
            index_topk=self.model.index_topk,
        )
        return self.model.forward_step(meta, self.paged)

    def _grow(self, seat: DraftSeat, num_tokens: int) -> None:
        needed = -(-num_tokens // self.blocks.block_size) - len(seat.block_table)
        if needed > 0:
            seat.block_table.extend(self.blocks.allocate(needed))
