"""Structured output in the engine (issue 20): a grammar matcher per constrained request, and each step's
token bitmask of those rows applied to their logits before sampling.

    request's structured_output ──GrammarCompiler.matcher──> RequestGrammar (request.grammar)
    each step:  sync(tokens so far) -> fill its bitmask row (host, llguidance) -> copy to the device
                -> kernels.token_mask.mask_batch on that row (disallowed tokens -inf) -> sample
    after it:   the scheduler syncs the sampled token in; a grammar that can go no further finishes
                the request (STOP)

EOS is in the mask only where the grammar accepts (llguidance's tokenizer knows the checkpoint's EOS
ids). Compiled grammars are cached by their spec: a request gets a copy of a pristine matcher.

Like the penalties (``penalties.py``), a decode step with a constrained row still replays its CUDA graph
(which samples every row from the raw logits); the runner samples that row again from the graph's logits
after masking (``ModelRunner._resampled``). Constrained requests do not draft
(``Scheduler.draftable``): a verify's later positions would need the masks after each draft. Rows
are independent: the other rows of a step are converted to float32 and otherwise untouched.
"""

from __future__ import annotations

import pathlib
from collections import OrderedDict

import llguidance
import numpy as np
import torch

from common.structured_output import StructuredOutput
from kernels.token_mask.batched import mask_batch

_CACHE_SIZE = 64  # compiled grammars kept per engine


class RequestGrammar:
    """One request's matcher and how many of its tokens it has consumed.

    The tokens it follows are the request's ``generated_ids`` (a migrated request's resumed tokens,
    then its output); ``sync`` consumes those it has not yet.
    """

    def __init__(self, matcher: llguidance.LLMatcher, compiler: GrammarCompiler):
        self.matcher = matcher
        self.compiler = compiler  # fills the step's bitmask rows
        self.consumed = 0

    def sync(self, tokens: list[int]) -> None:
        """Consume ``tokens[self.consumed:]``. A token the grammar rejects puts the matcher in its
        error state, which ``done`` reports (the request then stops)."""
        for token in tokens[self.consumed :]:
            self.matcher.consume_token(token)
        self.consumed = len(tokens)

    @property
    def done(self) -> bool:
        """True when no further token can be taken: the grammar is complete, or the matcher failed."""
        return self.matcher.is_stopped() or self.matcher.is_error()

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""


class GrammarCompiler:
    """Compiles constraints into matchers for one checkpoint's tokenizer.

    Args:
        tokenizer_dir: the checkpoint folder holding ``tokenizer.json``.
        vocab_size: the model's logits width (may exceed the tokenizer's: the extra ids are never allowed).
        eos_token_ids: the ids that end a request, allowed where the grammar accepts.
    """

    def __init__(self, tokenizer_dir: str | pathlib.Path, vocab_size: int, eos_token_ids: list[int]):
        self.tokenizer_file = pathlib.Path(tokenizer_dir) / "tokenizer.json"
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[StructuredOutput, llguidance.LLMatcher] = OrderedDict()
        self.executor = llguidance.LLExecutor()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer, built at the first constrained request (0.1-1.5 s)."""
        if self._tokenizer is None:
            if not self.tokenizer_file.is_file():
                where = self.tokenizer_file
                raise ValueError(f"structured_output: needs the checkpoint's tokenizer, {where}")
            self._tokenizer = llguidance.LLTokenizer(
                self.tokenizer_file.read_text(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids
            )
        return self._tokenizer

    def matcher(self, constraint: StructuredOutput) -> RequestGrammar:
        """A fresh matcher for ``constraint`` (compiled once per spec, then copied).

        Raises:
            ValueError: naming ``structured_output.<kind>``: the grammar does not compile.
        """
        pristine = self._compiled.get(constraint)
        if pristine is None:
            pristine = llguidance.LLMatcher(self.tokenizer, constraint.grammar(), log_level=0)
            if pristine.is_error():
                raise ValueError(f"{constraint.field}: cannot be compiled: {pristine.get_error()}")
            self._compiled[constraint] = pristine
            if len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(constraint)
        return RequestGrammar(pristine.deep_copy(), self)

    def fill(self, grammars: list[RequestGrammar]) -> np.ndarray:
        """Each grammar's next-token bitmask, one row each: ``[len(grammars), ceil(V / 32)]`` int32."""
        bitmask = np.zeros((len(grammars), (self.vocab_size + 31) // 32), dtype=np.int32)
        rows = [(grammar.matcher, row) for row, grammar in enumerate(grammars)]
        self.executor.unsafe_compute_mask_ptr(rows, bitmask.ctypes.data, bitmask.shape[1] * 4, len(grammars))
        return bitmask


def apply_grammars(logits: torch.Tensor, requests: list) -> torch.Tensor:
    """``logits [B, V]`` with row ``i`` masked by ``requests[i]``'s grammar where it has one.

    Returns ``logits`` itself when no request is constrained; else a new float32 ``[B, V]`` tensor
    (unconstrained rows converted unchanged, so they sample as before).
    """
    chosen = [i for i, request in enumerate(requests) if request.grammar is not None]
    if not chosen:
        return logits
    grammars = []
    for i in chosen:
        grammar = requests[i].grammar
        grammar.sync(requests[i].generated_ids)
        grammars.append(grammar)
    bitmask = torch.from_numpy(grammars[0].compiler.fill(grammars))
    index = torch.tensor(chosen, dtype=torch.int64).to(logits.device, non_blocking=True)
    return logits.to(torch.float32).index_copy(0, index, mask_batch(logits[chosen], bitmask))
