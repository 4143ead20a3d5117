"""Logit bias and penalties: the batched torch form (the token tables, then the rules over them) equals
the per-row float32 reference bitwise (ragged token lists, repeats, bias, every rule on and off per row),
a row's result does not depend on its batch-mates, and the reference itself against hand-computed
values."""

import pytest
import torch

from kernels.logit_penalties import batched, naive

VOCAB = 40


def _case(rows: int, seed: int):
    """Random rows with ragged prompt / output lists, some rows with every rule off."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=g) * 3
    token_rows, token_ids, in_output, bias_rows, bias_ids, bias_values = [], [], [], [], [], []
    presence, frequency, repetition = [], [], []
    for r in range(rows):
        n_prompt = int(torch.randint(1, 12, (1,), generator=g))
        n_out = int(torch.randint(0, 15, (1,), generator=g))
        ids = torch.randint(0, VOCAB // 2, (n_prompt + n_out,), generator=g).tolist()  # repeats likely
        token_rows += [r] * len(ids)
        token_ids += ids
        in_output += [False] * n_prompt + [True] * n_out
        biased = torch.randperm(VOCAB, generator=g)[: int(torch.randint(0, 5, (1,), generator=g))].tolist()
        bias_rows += [r] * len(biased)
        bias_ids += biased
        bias_values += (torch.rand(len(biased), generator=g) * 200 - 100).tolist()
        off = r % 3 == 0
        presence.append(0.0 if off else float(torch.rand(1, generator=g) * 4 - 2))
        frequency.append(0.0 if off else float(torch.rand(1, generator=g) * 4 - 2))
        repetition.append(1.0 if off else float(torch.rand(1, generator=g) * 1.9 + 0.1))

    def t(values, dtype):
        return torch.tensor(values, dtype=dtype)

    return (
        logits,
        t(token_rows, torch.int64),
        t(token_ids, torch.int64),
        t(in_output, torch.bool),
        t(bias_rows, torch.int64),
        t(bias_ids, torch.int64),
        t(bias_values, torch.float32),
        t(presence, torch.float32),
        t(frequency, torch.float32),
        t(repetition, torch.float32),
    )


def _batched(logits, token_rows, token_ids, in_output, *rest) -> torch.Tensor:
    counts, seen = batched.token_counts(logits.shape[0], logits.shape[1], token_rows, token_ids, in_output)
    return batched.penalize_rows(logits, counts, seen, *rest)


@pytest.mark.parametrize("rows, seed", [(1, 0), (5, 1), (17, 2)], ids=["1row", "5rows", "17rows"])
def test_batched_equals_the_per_row_reference_bitwise(rows, seed):
    args = _case(rows, seed)
    want = naive.penalize_batch(*args)
    got = _batched(*args)
    assert got.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert not torch.equal(got, args[0])  # the case changes something


def test_a_row_alone_equals_the_same_row_in_a_batch():
    args = _case(9, 3)
    logits, token_rows, token_ids, in_output, bias_rows, bias_ids, bias_values, *per_row = args
    together = _batched(*args)
    for r in range(9):
        mine, biased = token_rows == r, bias_rows == r
        alone = _batched(
            logits[r : r + 1],
            token_rows[mine] * 0,
            token_ids[mine],
            in_output[mine],
            bias_rows[biased] * 0,
            bias_ids[biased],
            bias_values[biased],
            *(p[r : r + 1] for p in per_row),
        )
        assert torch.equal(alone[0].view(torch.int32), together[r].view(torch.int32))


def test_reference_rules_by_hand():
    row = torch.tensor([1.0, -2.0, 4.0, 0.5, 3.0, -1.0])
    # prompt: 0, 1; output: 2, 2, 3; bias on 4 and 5.
    got = naive.penalize_row(row, [0, 1], [2, 2, 3], [(4, 10.0), (5, -100.0)], 0.5, 0.25, 2.0)
    want = [
        1.0 / 2,  # prompt, positive: divided by the repetition penalty
        -2.0 * 2,  # prompt, negative: multiplied
        4.0 / 2 - 0.25 * 2 - 0.5,  # output twice: repetition, frequency * 2, presence
        0.5 / 2 - 0.25 - 0.5,
        3.0 + 10.0,  # bias only
        -1.0 - 100.0,
    ]
    assert got.tolist() == pytest.approx(want)
    untouched = naive.penalize_row(row, [], [], [], 0.0, 0.0, 1.0)
    assert torch.equal(untouched, row)
