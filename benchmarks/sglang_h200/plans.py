"""The H200 runs this folder's scripts take, as JSON (printed): `python plans.py grid|cost|graph|cost-graph`.

grid (lossless.py): the lab pair and the tiny Qwen3 pair (its prompts picked for wide margins), bf16:
  AR, DFLASH, DDTREE at budgets {1, 8, 15, 32} x topk {1, 4, 8}; traces on the trees wider than the block
  (16/8, 20/8, 32/4, 32/8) and on 15/8 beside them; `unsafe` against `safe` on the lab pair at 15/8.
cost (step_cost.py): issue 12's arms on the 4B- and 1B-class dummy-weight hybrids and on the lab pair.
graph (lossless.py): CUDA graphs on (first run on the H200 2026-12-01: 8/8 equal AR): the lab pair's AR (graphs
  off: the reference), DFLASH and DDTREE with graphs, at a tree narrower than the block (8/4: 9 rows padded to 16),
  as wide (15/8: 16), and wider (32/8: 33 rows; the drafter eager when it ran, its graphs at its block since the
  default changed), and 15/8 again with graphs off beside them.
cost-graph (step_cost.py): DDTREE with CUDA graphs (ddtree-graph-B-K) beside DFLASH with graphs and DDTREE eager.
wide (lossless.py): the lab pair at DDTREE 128/8 and 256/8 (the threshold build) with CUDA graphs (at most
  2,048 verify rows a step), 128/8 eager, and 128/8 and 15/8 with graphs and programmatic dependent launch (DDTREE_PDL=1),
  against AR.
treeconv (lossless.py): DDTREE_SGLANG_TREE_CONV=1 (the engine's tree conv in SGLang's hybrid verify; the default
  since it passed this plan on an H100, 2026-12-06, sglang_h100_treeconv_2026-12-06.json) on the lab pair at 15/8 with
  graphs, eager and batched, and at 128/8 and 256/8 with graphs, each against AR.
rerun RESULTS_JSON: the grid's configurations that did not finish there, with each pair's AR again.
q3-rest (lossless.py): the q3 pair's grid past what the 2026-12-01 run reached (it stopped after 8/1).
graph+q3 (lossless.py): graph and q3-rest in one run (the lab pair's graphed DDTREE after a worker change, and
  the q3 grid).
batch (lossless.py): the lab pair's 8 prompts in one call (batch sizes up to 8) with CUDA graphs: AR, DFLASH and
  DDTREE 8/4, 15/8, 32/8 (the batched tree step and walk + commit graphs), each against the batched AR.
fit (lossless.py): the 4B-class dummy hybrid at DDTREE 127/8 in a small memory share: must stop at startup with
  DDTREE's figure (sglang_plugin/fit.py), not SGLang's advice to lower --speculative-num-draft-tokens.
next: `graph`, `batch` and `fit` together (lossless.py; run 2026-12-01). What the next device session runs first
  (2026-12-05): `wide` with PAR=6, and benchmarks/h200_pdl_check.sh in a second call.
cost-prep (step_cost.py): the 4B-class step with the tree step graphed, beside it op by op (+eagerprep), with
  profiles; then the lab pair's arms (2026-12-01).
cost-now (step_cost.py): issue 12's three models after the batched tree step and the draft block as DFLASH
  builds it (836b8ee, 3d3a122): 4B and 1B DFLASH beside DDTREE 15/8 and 31/8 with graphs, the lab pair's
  tok/s at 15/8 and 15/4 with profiles of its DFLASH and 15/8 steps.
cost-rounds (step_cost.py, with ROUNDS=3): the same after the 4B group of cost-now read DDTREE 15/8 faster than
  DFLASH (8.55 ms DFLASH against 7.21 and 7.47 in earlier runs): every arm measured three times, interleaved; the
  lab pair first (tok/s and outputs; each prompt 4 times a round since run 5's rounds of ~1000 tokens were
  noisy), then 4B, then the 1B-class DFLASH and 15/8.
draftgraph (lossless.py): the drafter's graphs at its block when the verify is wider (on by default since
  2026-12-01, when this plan ran with DDTREE_DRAFT_GRAPH_AT_BLOCK=1: 8/8 equal AR, the eager drafter's verify
  steps, the drafter replayed on every step) on the lab pair at 32/8 and 20/8 with traces (each step's
  draft_graph flag), beside 32/8 with the drafter eager (DDTREE_DRAFT_GRAPH_AT_BLOCK=0).
cost-draftgraph (step_cost.py, ROUNDS=3): 31/8 with the drafter's graphs at its block beside the drafter eager
  (+eagerdraft) and DFLASH, 4B-class and lab pair (issue 12's 31/8 <= 1.25x).
cost-host (step_cost.py, ROUNDS=3): where the lab pair's extra ~1 ms per DDTREE step goes (run 7: 5.75 ms
  against DFLASH's 4.73): the lab pair's DFLASH and 15/8 with profiles (host gaps, CUDA calls per step), each
  prompt 4 times a round, then the 4B-class DFLASH and 15/8 again.
cost-rest (step_cost.py): what issue 12 still lacks with graphs on: the lab pair on its prompts (tok/s, the 1.15x
  bar) with the walk + commit graph (770e312; beside it op by op), and the 1B-class hybrid, beside DFLASH.
"""
import json
import sys


def ddtree(label, pair, budget, topk, **kw):
    return {"label": label, "pair": pair, "algo": "DDTREE",
            "ddt": {"speculative_ddtree_budget": budget, "speculative_ddtree_topk": topk, **kw.pop("ddt", {})}, **kw}


def grid():
    plan = [{"label": "lab ar", "pair": "lab"}, {"label": "lab dflash", "pair": "lab", "algo": "DFLASH"}]
    wide = {(15, 8), (32, 4), (32, 8)}
    for b in (1, 8, 15, 32):
        for k in (1, 4, 8):
            plan.append(ddtree(f"lab ddtree {b}/{k}", "lab", b, k, trace=(b, k) in wide))
    plan += [ddtree(f"lab ddtree {b}/{k}", "lab", b, k, trace=True) for b, k in ((16, 8), (20, 8))]
    plan.append(ddtree("lab ddtree 15/8 unsafe", "lab", 15, 8, ddt={"speculative_ddtree_hybrid_mode": "unsafe",
                                                                      "speculative_ddtree_allow_hybrid_unsafe": True}))
    # The tiny Qwen3 pair in bf16 on prompts picked for wide fp32 margins (run.sh, pick_prompts.py). fp16 is
    # not an option: stock SGLang 0.5.23 DFLASH fails in fp16 ("mat1 and mat2 ... BFloat16 != Half" in the
    # drafter's attention, H200 run of 2026-12-01), whatever the configs declare.
    plan += [{"label": "q3 ar", "pair": "q3"}, {"label": "q3 dflash", "pair": "q3", "algo": "DFLASH"}]
    for b in (1, 8, 15, 32):
        for k in (1, 4, 8):
            plan.append(ddtree(f"q3 ddtree {b}/{k}", "q3", b, k))
    return plan


def cost():
    tree_arms = ["ddtree-15-8", "ddtree-15-4", "ddtree-31-8"]
    return [
        {"model": "q35-4b", "dummy": True, "arms": ["ar", "dflash", "dflash-nograph", *tree_arms],
         "profile": ["dflash", "dflash-nograph", "ddtree-15-8"]},
        {"model": "lab", "prompts": "lab", "arms": ["ar", "dflash", "dflash-nograph", *tree_arms]},
        {"model": "q35-1b", "dummy": True, "arms": ["dflash", "dflash-nograph", "ddtree-15-8", "ddtree-31-8"]},
    ]


def graph():
    graphs_on = {"extra": {"disable_cuda_graph": False}}
    plan = [{"label": "lab ar", "pair": "lab"}, {"label": "lab dflash graph", "pair": "lab", "algo": "DFLASH", **graphs_on}]
    plan += [ddtree(f"lab ddtree {b}/{k} graph", "lab", b, k, trace=True, **graphs_on) for b, k in ((8, 4), (15, 8), (32, 8))]
    plan += [ddtree("lab ddtree 1/1 graph", "lab", 1, 1, **graphs_on), ddtree("lab ddtree 15/8", "lab", 15, 8, trace=True)]
    return plan


def cost_graph():
    arms = ["dflash", "ddtree-15-8", "ddtree-graph-15-8", "ddtree-graph-8-4", "ddtree-graph-31-8"]
    return [
        {"model": "q35-4b", "dummy": True, "arms": arms, "profile": ["ddtree-graph-15-8"]},
        {"model": "lab", "prompts": "lab", "arms": arms},
    ]


def q3_rest():
    reached = {(1, 1), (1, 4), (1, 8), (8, 1)}
    plan = [{"label": "q3 ar", "pair": "q3"}, {"label": "q3 dflash", "pair": "q3", "algo": "DFLASH"}]
    return plan + [c for c in grid() if c["pair"] == "q3" and "ddt" in c
                   and (c["ddt"]["speculative_ddtree_budget"], c["ddt"]["speculative_ddtree_topk"]) not in reached]


def cost_rest():
    return [
        {"model": "lab", "prompts": "lab", "arms": ["dflash", "ddtree-graph-15-8", "ddtree-graph-15-8+eagerprep", "ddtree-graph-15-4"]},
        {"model": "q35-1b", "dummy": True, "arms": ["dflash", "ddtree-graph-15-8", "ddtree-graph-15-4", "ddtree-graph-31-8"]},
    ]


def cost_now():
    graphed = ["dflash", "ddtree-graph-15-8", "ddtree-graph-31-8"]
    return [
        {"model": "q35-4b", "dummy": True, "arms": graphed},
        {"model": "lab", "prompts": "lab", "arms": ["dflash", "ddtree-graph-15-8", "ddtree-graph-15-4"],
         "profile": ["dflash", "ddtree-graph-15-8"]},
        {"model": "q35-1b", "dummy": True, "arms": graphed},
    ]


def cost_rounds():
    return [
        {"model": "lab", "prompts": "lab", "repeat": 4, "arms": ["dflash", "ddtree-graph-15-8", "ddtree-graph-15-4"]},
        {"model": "q35-4b", "dummy": True, "arms": ["dflash", "ddtree-graph-15-8", "ddtree-graph-31-8"]},
        {"model": "q35-1b", "dummy": True, "arms": ["dflash", "ddtree-graph-15-8"]},
    ]


def draftgraph():
    graphs_on = {"disable_cuda_graph": False}
    return [{"label": "lab ar", "pair": "lab"},
            ddtree("lab ddtree 32/8 graph eager drafter", "lab", 32, 8, trace=True, extra=graphs_on,
                   env={"DDTREE_DRAFT_GRAPH_AT_BLOCK": "0"}),
            ddtree("lab ddtree 32/8 graph draftgraph", "lab", 32, 8, trace=True, extra=graphs_on),
            ddtree("lab ddtree 20/8 graph draftgraph", "lab", 20, 8, trace=True, extra=graphs_on)]


def cost_draftgraph():
    arms = ["dflash", "ddtree-graph-31-8+eagerdraft", "ddtree-graph-31-8"]
    return [{"model": "q35-4b", "dummy": True, "arms": arms},
            {"model": "lab", "prompts": "lab", "repeat": 4, "arms": arms}]


def cost_host():
    return [{"model": "lab", "prompts": "lab", "repeat": 4, "arms": ["dflash", "ddtree-graph-15-8"],
             "profile": ["dflash", "ddtree-graph-15-8"]},
            {"model": "q35-4b", "dummy": True, "arms": ["dflash", "ddtree-graph-15-8"]}]


def cost_prep():
    """Issue 12 after the tree step became one CUDA-graph replay per request (sglang_plugin/prep.py): the 4B-class
    step cost with profiles (host gaps), the same arm with the op-by-op tree step beside it, then the lab pair."""
    return [
        {"model": "q35-4b", "dummy": True, "arms": ["dflash", "ddtree-graph-15-8", "ddtree-graph-15-8+eagerprep", "ddtree-graph-31-8"],
         "profile": ["dflash", "ddtree-graph-15-8", "ddtree-graph-15-8+eagerprep"]},
        {"model": "lab", "prompts": "lab", "arms": ["ar", "dflash", "ddtree-graph-15-8", "ddtree-graph-15-4", "ddtree-graph-31-8"]},
    ]


def batch():
    graphs_on = {"extra": {"disable_cuda_graph": False}, "batch": True}
    plan = [{"label": "lab ar batch", "pair": "lab", "batch": True},
            {"label": "lab dflash graph batch", "pair": "lab", "algo": "DFLASH", **graphs_on}]
    return plan + [ddtree(f"lab ddtree {b}/{k} graph batch", "lab", b, k, **graphs_on) for b, k in ((8, 4), (15, 8), (32, 8))]


def fit():
    # 48 requests set explicitly: unset, DDTREE runs 2,048 // 128 = 16 at budget 127 (spec.STEP_MAX_ROWS, since
    # 2026-12-05), a third of the verify states this plan was sized to overflow.
    dummy = {"load_format": "dummy", "speculative_draft_load_format": "dummy", "mem_fraction_static": 0.08,
             "max_running_requests": 48}
    return [ddtree("q35-4b ddtree 127/8 does not fit", "q35-4b", 127, 8, prompts="lab", extra=dummy,
                   expect_error="DDTREE budget 127", timeout=240)]


def wide():
    """The lab pair at the budgets TreeStep builds by threshold (from 128 since 2026-12-04) with CUDA graphs (their
    steps kept to spec.STEP_MAX_ROWS verify rows since 2026-12-05: 15 requests at once at 128), eager, and with the tree kernels'
    programmatic dependent launches (DDTREE_PDL=1, kernels/gdc.py) at 128/8 and 15/8, each against AR; each
    configuration's log says how long the worker's start-up run of the tree step took and which kernels still
    compiled while serving."""
    graphs_on = {"extra": {"disable_cuda_graph": False}}
    pdl = {"DDTREE_PDL": "1"}
    plan = [{"label": "lab ar", "pair": "lab"},
            ddtree("lab ddtree 128/8 graph", "lab", 128, 8, trace=True, **graphs_on),
            ddtree("lab ddtree 256/8 graph", "lab", 256, 8, **graphs_on),
            ddtree("lab ddtree 128/8", "lab", 128, 8),
            ddtree("lab ddtree 128/8 graph pdl", "lab", 128, 8, env=pdl, **graphs_on),
            ddtree("lab ddtree 15/8 graph pdl", "lab", 15, 8, env=pdl, **graphs_on)]
    # All at once (PAR=6) inside one device call: each gets what the call leaves after the install. On a cold Triton
    # cache the graphed 128/8 needs ~280 s (H100, 2026-12-05: SGLang's tree conv update compiles ~150 s at 129 rows)
    # and 256/8 more than 400 s, so 128/8 finishes only with PAR=4 or fewer beside it; 256/8 is kept to show it.
    return [{**c, "timeout": 480} for c in plan]


def treeconv():
    """DDTREE's hybrid verify conv through the engine's kernel (DDTREE_SGLANG_TREE_CONV=1, sglang_plugin/tree_conv.py)
    on the lab pair (a qwen3_5_text hybrid), each against AR: 15/8 with CUDA graphs and eager, the 8 prompts batched
    with graphs (cache lines of several requests), and 128/8 and 256/8 with graphs, whose first start compiles
    SGLang's tree conv for minutes without the switch (wide()); what the switch showed before it became the default
    (H100, 2026-12-06: 8/8 each). One call: AR, then the six at PAR=3 or more."""
    graphs_on = {"extra": {"disable_cuda_graph": False}}
    conv = {"env": {"DDTREE_SGLANG_TREE_CONV": "1"}}
    return [{"label": "lab ar", "pair": "lab"},
            {"label": "lab ar batch", "pair": "lab", "batch": True},
            ddtree("lab ddtree 15/8 graph treeconv", "lab", 15, 8, trace=True, **conv, **graphs_on),
            ddtree("lab ddtree 15/8 treeconv", "lab", 15, 8, trace=True, **conv),
            ddtree("lab ddtree 15/8 graph batch treeconv", "lab", 15, 8, batch=True, **conv, **graphs_on),
            ddtree("lab ddtree 128/8 graph treeconv", "lab", 128, 8, timeout=400, **conv, **graphs_on),
            ddtree("lab ddtree 256/8 graph treeconv", "lab", 256, 8, timeout=400, **conv, **graphs_on)]


def rerun(results_json):
    """The grid's configurations that did not finish in RESULTS_JSON, plus each pair's AR (the reference)."""
    done = {r["label"] for r in json.load(open(results_json)) if r.get("rc") == 0 and "res" in r}
    return [c for c in grid() if c["label"] not in done or ("algo" not in c)]


if __name__ == "__main__":
    plans = {"grid": grid, "cost": cost, "graph": graph, "cost-graph": cost_graph, "rerun": rerun,
             "q3-rest": q3_rest, "cost-rest": cost_rest, "graph+q3": lambda: graph() + q3_rest(),
             "cost-prep": cost_prep, "cost-now": cost_now, "cost-rounds": cost_rounds, "draftgraph": draftgraph,
             "cost-draftgraph": cost_draftgraph, "cost-host": cost_host, "batch": batch, "next": lambda: graph() + batch() + fit(), "fit": fit, "wide": wide,
             "treeconv": treeconv}
    print(json.dumps(plans[sys.argv[1]](*sys.argv[2:])))
