"""The top-K log-probability reference against an independent definition (softmax, then the K
largest, ties to the lower token id) on named, seeded cases."""

from __future__ import annotations

import math

import pytest
import torch

from ddtree_engine.kernels.topk_logprobs import sorted_topk_logprobs

CASES = {  # name: (L depths, V vocabulary, k)
    "one depth": (1, 7, 3),
    "odd sizes": (5, 13, 4),
    "k = V": (3, 6, 6),
    "k = 1": (4, 11, 1),
    "wide vocab": (2, 257, 8),
}


def _expected(logits: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    values, ids = [], []
    for row in logits.double().tolist():
        top = max(row)
        log_z = top + math.log(sum(math.exp(x - top) for x in row))
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
        ids.append(order)
        values.append([row[i] - log_z for i in order])
    return values, ids


@pytest.mark.parametrize("name", list(CASES))
def test_matches_softmax_then_the_k_largest(name):
    depths, vocab, k = CASES[name]
    logits = torch.randn(depths, vocab, generator=torch.Generator().manual_seed(len(name)))
    values, ids = sorted_topk_logprobs(logits, k)
    want_values, want_ids = _expected(logits, k)
    assert ids.tolist() == want_ids, name
    diff = (values - torch.tensor(want_values, dtype=torch.float64)).abs().max().item()
    assert values.dtype == torch.float64 and diff < 1e-12, f"{name}: max abs diff {diff:.3e}"


def test_ties_go_to_the_lower_token_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    _, ids = sorted_topk_logprobs(logits, 3)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]


def test_bad_shapes_and_k_are_refused():
    with pytest.raises(ValueError, match=r"expected draft_logits \[L, V\]"):
        sorted_topk_logprobs(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="expected 1 <= k <= V = 5, got k = 6"):
        sorted_topk_logprobs(torch.zeros(2, 5), 6)
    with pytest.raises(ValueError, match="got k = 0"):
        sorted_topk_logprobs(torch.zeros(2, 5), 0)
