"""Parent-indexed Gated-DeltaNet verification (core.hybrid's window indices with the
kernels.gdn_tree reference): each tree node's output and state equal what a plain sequential
run over that node's own path gives; the flattened order does not."""

from __future__ import annotations

import pytest
import torch

from ddtree_engine.core.hybrid import conv_window_index, flattened_parents, l2norm, window_after
from ddtree_engine.kernels.gdn_tree import gated_delta_tree, node_levels, tree_causal_conv

# root; two children; each child with two children; one grandchild deeper.
PARENTS = [-1, 0, 0, 1, 1, 2, 2, 5]


def _path(parents, node):
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def _inputs(n, h=3, dk=4, dv=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(n, h, dk, generator=g, dtype=torch.float64)) * dk**-0.5
    k = l2norm(torch.randn(n, h, dk, generator=g, dtype=torch.float64))
    v = torch.randn(n, h, dv, generator=g, dtype=torch.float64)
    gate = -torch.rand(n, h, generator=g, dtype=torch.float64)
    beta = torch.rand(n, h, generator=g, dtype=torch.float64)
    s0 = torch.randn(h, dk, dv, generator=g, dtype=torch.float64)
    return q, k, v, gate, beta, s0


def test_node_levels_group_by_depth():
    assert node_levels(PARENTS) == [[0], [1, 2], [3, 4, 5, 6], [7]]
    assert node_levels(flattened_parents(4).tolist()) == [[0], [1], [2], [3]]


def test_gated_delta_tree_equals_sequential_run_along_each_path():
    q, k, v, g, beta, s0 = _inputs(len(PARENTS))
    out, states = gated_delta_tree(q, k, v, g, beta, PARENTS, s0, keep_states=True)
    for node in range(len(PARENTS)):
        idx = _path(PARENTS, node)
        chain_out, chain_state = gated_delta_tree(
            q[idx], k[idx], v[idx], g[idx], beta[idx], flattened_parents(len(idx)).tolist(), s0, keep_states=False
        )
        torch.testing.assert_close(out[node], chain_out[-1], rtol=0, atol=1e-12)
        torch.testing.assert_close(states[node], chain_state[0], rtol=0, atol=1e-12)


def test_flattened_order_leaks_sibling_state():
    q, k, v, g, beta, s0 = _inputs(len(PARENTS), seed=1)
    safe, _ = gated_delta_tree(q, k, v, g, beta, PARENTS, s0, keep_states=True)
    leaky, _ = gated_delta_tree(q, k, v, g, beta, flattened_parents(len(PARENTS)).tolist(), s0, keep_states=True)
    # Node 2 is node 1's sibling: in flattened order it starts from node 1's state.
    assert torch.allclose(safe[1], leaky[1])
    assert not torch.allclose(safe[2], leaky[2], atol=1e-6)


@pytest.mark.parametrize("kernel", [2, 4])
def test_tree_conv_windows_follow_ancestors_into_the_committed_window(kernel):
    gen = torch.Generator().manual_seed(2)
    channels = 6
    x = torch.randn(len(PARENTS), channels, generator=gen, dtype=torch.float64)
    committed = torch.randn(kernel - 1, channels, generator=gen, dtype=torch.float64)
    weight = torch.randn(channels, kernel, generator=gen, dtype=torch.float64)
    bias = torch.randn(channels, generator=gen, dtype=torch.float64)
    index = conv_window_index(PARENTS, kernel)
    out = tree_causal_conv(x, committed, weight, bias, index)
    for node in range(len(PARENTS)):
        seq = torch.cat([committed, x[_path(PARENTS, node)]])  # oldest first
        window = seq[-kernel:]
        expect = torch.nn.functional.silu((window * weight.t()).sum(0) + bias)
        torch.testing.assert_close(out[node], expect, rtol=0, atol=1e-12)
        torch.testing.assert_close(window_after(x, committed, index, node), seq[-(kernel - 1):], rtol=0, atol=0)


def test_linear_mode_refuses_a_tree():
    q, k, v, g, beta, s0 = _inputs(len(PARENTS))
    with pytest.raises(ValueError, match="linear"):
        gated_delta_tree(q, k, v, g, beta, PARENTS, s0, keep_states=False)
