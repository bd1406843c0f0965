"""How often the threshold cut meets an exact tie at the budget's boundary on real-sized draft logits, bf16
against fp32 (CPU; output in build_threshold_ties_20261204.txt).

    python benchmarks/results/build_threshold_ties_20261204.py
"""

import sys, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "engine_patches" / "ddtree_engine" / "src"))
from ddtree_engine.kernels.tree_build import reference
from ddtree_engine.kernels.topk_logprobs import reference as tr
for kind in ("random", "peaked"):
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(15, 151936) * 3
        if kind == "peaked":
            x[:, 7] += 30.0
        for dt in (torch.bfloat16, torch.float32):
            vals, ids = tr.sorted_topk_logprobs(x.to(dt).float(), 8)
            v = vals.double().tolist()
            eq_sib = sum(1 for row in v for a, b in zip(row, row[1:]) if a == b)
            out = []
            for B in (64, 128, 256):
                ch = reference.select_prefixes(v, B + 1, 0)
                s = sorted((c[3] for c in ch), reverse=True)
                # all prefixes scoring >= the B-th: does any beyond B score the same?
                out.append(f"b{B} tie={s[B-1] == s[B]}")
            print(kind, seed, str(dt).split('.')[-1], "equal adjacent log-probs:", eq_sib, " ".join(out))
