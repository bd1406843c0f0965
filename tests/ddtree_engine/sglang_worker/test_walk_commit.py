"""WalkCommit (the walk and KV-window commit of a verified batch, replayed as one CUDA graph) gives
what the worker computed op by op before it, and what the commit means: the accepted path's slots
at the window's first positions. On the CPU (Triton's interpreter) eagerly; on a GPU also through
its graph, replayed on new inputs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402
from ddtree_engine.sglang_plugin.commit import last_accepted_row, window_order  # noqa: E402
from ddtree_engine.sglang_plugin.prep import GraphPool  # noqa: E402
from ddtree_engine.sglang_plugin.walk_commit import WalkCommit  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DEPTHS, VOCAB = 5, 30


def built_steps(bs, budget, topk, seed):
    steps = []
    for i in range(bs):
        step = TreeStep(DEPTHS, VOCAB, budget, topk, DEVICE)
        logits = torch.randn(DEPTHS, VOCAB, generator=torch.Generator().manual_seed(seed * 10 + i)) * 3
        step.build(logits.to(DEVICE), torch.tensor([7 + i], device=DEVICE), torch.tensor([0], device=DEVICE))
        steps.append(step)
    return steps


def deep_choices(step, seed):
    """Per row, the token of one of its children (so walks go deep and through later siblings)."""
    g = torch.Generator().manual_seed(seed)
    tokens, parents = step.tree[0].cpu(), step.tree[1].cpu()
    n = int(step.tree[5][0])
    choice = torch.randint(0, VOCAB, (step.num_rows,), generator=g)
    for row in range(n):
        kids = [j for j in range(n) if int(parents[j]) == row]
        if kids and torch.rand(1, generator=g).item() < 0.8:
            choice[row] = tokens[kids[int(torch.randint(0, len(kids), (1,), generator=g))]]
    return choice


def op_by_op(steps, choice, prefix, req, locs, write_ids, table, rows):
    """The worker's walk and commit before WalkCommit, on copies."""
    bs, width = len(steps), steps[0].num_rows
    for i, step in enumerate(steps):
        step.walk(choice[i])
    path = torch.stack([s.walked[0] for s in steps])
    emitted = torch.stack([s.walked[1] for s in steps])
    commit_lens = torch.cat([s.walked[2] for s in steps]).to(torch.int32)
    bonus = torch.cat([s.walked[3] for s in steps]).to(torch.int64)
    new_seq_lens = prefix + commit_lens.to(prefix.dtype)
    idx = torch.arange(width, device=prefix.device)
    accepted = idx.unsqueeze(0) < commit_lens.unsqueeze(1).to(idx.dtype)
    order = window_order(path, commit_lens)
    new_window = torch.gather(locs.view(bs, rows)[:, :width], 1, order)
    cols = prefix.to(torch.int64).unsqueeze(1) + idx
    table[req.to(torch.int64).unsqueeze(1), cols] = new_window.to(table.dtype)
    out = dict(path=path, emitted=emitted, commit_lens=commit_lens, bonus=bonus, new_seq_lens=new_seq_lens, order=order,
               cols=cols, out_tokens=torch.where(accepted, emitted, 0), last_row=last_accepted_row(path, commit_lens),
               ctx_locs=torch.gather(write_ids.view(bs, rows).to(torch.int64), 1, order))
    return {k: v.clone() for k, v in out.items()}


def inputs(steps, rows, seed):
    bs = len(steps)
    g = torch.Generator().manual_seed(seed)
    choice = torch.stack([deep_choices(s, seed + i) for i, s in enumerate(steps)]).to(DEVICE)
    prefix = torch.randint(0, 20, (bs,), generator=g).to(DEVICE)
    req = torch.randperm(6, generator=g)[:bs].to(DEVICE)
    locs = (torch.randperm(500, generator=g)[: bs * rows] + 1).to(DEVICE)
    write_ids = (torch.randperm(500, generator=g)[: bs * rows] + 1000).to(DEVICE)
    return choice, prefix, req, locs, write_ids


def walk(post, choice, *rest):
    """As the worker does: the target's choices written into post.choice (its argmax's out=), then run."""
    post.choice.copy_(choice)
    post.run(*rest)


@pytest.mark.parametrize("bs,budget,topk,pad", [(1, 9, 3, 0), (1, 9, 3, 6), (3, 6, 2, 2), (2, 1, 1, 3)])
def test_walk_and_commit_match_the_op_by_op_path(bs, budget, topk, pad):
    rows = budget + 1 + pad
    table = torch.full((6, 64), -5, dtype=torch.int32, device=DEVICE)
    want_table = table.clone()
    post = None
    for seed in range(3):  # the same WalkCommit across steps: nothing stale survives
        steps = built_steps(bs, budget, topk, seed)
        args = inputs(steps, rows, seed)
        want = op_by_op(built_steps(bs, budget, topk, seed), *args, want_table, rows)
        if post is None:
            post = WalkCommit(steps, rows, table, args[1].dtype)
        else:
            for mine, new in zip(post.steps, steps):  # the worker rebuilds each slot's tree in place
                for buf, val in zip(mine.tree, new.tree):
                    buf.copy_(val)
        walk(post, *args)
        for name, value in want.items():
            assert torch.equal(getattr(post, name), value), f"seed {seed}: {name}"
        assert torch.equal(table, want_table), f"seed {seed}: req_to_token"
        assert bool((post.commit_lens > 1).any()) or seed == 0 or budget == 1  # walks do go past the root


def test_the_commit_puts_the_accepted_slots_first():
    steps = built_steps(1, 9, 3, 4)
    rows = 12
    choice, prefix, req, locs, write_ids = inputs(steps, rows, 4)
    table = torch.zeros(6, 64, dtype=torch.int64, device=DEVICE)
    post = WalkCommit(steps, rows, table, prefix.dtype)
    walk(post, choice, prefix, req, locs, write_ids)
    n, start = int(post.commit_lens[0]), int(prefix[0])
    path = post.path[0, :n]
    assert n >= 2
    assert torch.equal(table[int(req[0]), start : start + n], locs[path])
    assert torch.equal(post.out_tokens[0, :n], post.emitted[0, :n]) and int(post.out_tokens[0, n:].abs().sum()) == 0
    assert int(post.last_row[0]) == int(path[-1])


def test_fewer_rows_than_the_trees_are_refused():
    with pytest.raises(ValueError, match="rows >= the trees' width 10"):
        WalkCommit(built_steps(1, 9, 3, 0), 9, torch.zeros(2, 8, dtype=torch.int64), torch.int64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pad", [0, 6])
def test_the_graphs_replay_what_the_ops_give_on_new_inputs(pad):
    """Batch sizes 1 and 3 captured into one pool (prep.GraphPool) and replayed in turns: each equals
    an eager WalkCommit, req_to_token included, step after step."""
    budget, topk = 9, 3
    rows = budget + 1 + pad
    pool = GraphPool()
    slots, eager_slots = built_steps(3, budget, topk, 0), built_steps(3, budget, topk, 0)
    table = torch.zeros(6, 64, dtype=torch.int32, device="cuda")
    eager_table = table.clone()
    totals = torch.zeros(2, dtype=torch.int64, device="cuda")  # graphed, eager: the metrics' sums
    graphed = {bs: WalkCommit(slots[:bs], rows, table, torch.int64, graph=True, pool=pool, total=totals[0:1]) for bs in (1, 3)}
    eager = {bs: WalkCommit(eager_slots[:bs], rows, eager_table, torch.int64, total=totals[1:2]) for bs in (1, 3)}
    want_total = 0
    for seed in range(6):
        bs = 1 if seed % 2 == 0 else 3
        fresh = built_steps(bs, budget, topk, seed)
        for group in (slots, eager_slots):
            for mine, new in zip(group, fresh):
                for buf, val in zip(mine.tree, new.tree):
                    buf.copy_(val)
        args = inputs(fresh, rows, seed)
        walk(graphed[bs], *args)
        walk(eager[bs], *args)
        torch.cuda.synchronize()
        for name in ("path", "emitted", "commit_lens", "bonus", "new_seq_lens", "order", "cols", "out_tokens", "last_row", "ctx_locs"):
            assert torch.equal(getattr(graphed[bs], name), getattr(eager[bs], name)), f"step {seed} bs {bs}: {name}"
        assert torch.equal(table, eager_table), f"step {seed}: req_to_token"
        want_total += int(eager[bs].commit_lens.sum())
        # Each step counted once: not again in the warm-up before a capture.
        assert totals.tolist() == [want_total, want_total], f"step {seed}: metrics totals"
    assert all(p._run.graph is not None for p in graphed.values())


def test_the_step_metrics_total_grows_by_each_steps_commit_lengths():
    steps = built_steps(3, 6, 2, 0)
    rows = 9
    table = torch.zeros(6, 64, dtype=torch.int64, device=DEVICE)
    total = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    post = WalkCommit(steps, rows, table, torch.int64, total=total)
    want = 0
    for seed in range(3):
        walk(post, *inputs(steps, rows, seed))
        want += int(post.commit_lens.sum())
        assert int(total) == want, f"step {seed}"
    assert want > 3  # walks went past the roots
