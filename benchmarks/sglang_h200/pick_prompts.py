"""Pick prompts on which a bf16 run cannot flip the target's greedy choice: the widest top-2 margins.

A random tiny target (make-tiny-pair) has near-ties: a bf16 engine then leaves the fp32 greedy path, and
AR, DFLASH and DDTREE can part on such a step for reasons that are bf16's, not the algorithm's (the
H200 run of 2026-11-30 saw that on one of four prompts, stock DFLASH included). This script runs the
target greedily in float32 on the CPU over candidate prompts and keeps the ones whose smallest
top-1 / top-2 logit gap over the whole generation is largest, so a token-exact comparison in bf16
tests the algorithm.

    python pick_prompts.py TARGET_DIR OUT_JSON [--candidates 48] [--keep 4] [--max-new 48]
OUT_JSON: [{"name", "prompt_ids", "min_margin"}], the format lossless.py reads.
"""
import argparse
import json

import torch
from transformers import AutoModelForCausalLM


def min_margin(model, ids: list[int], max_new: int) -> float:
    """The smallest top-1 minus top-2 logit over `max_new` greedy steps after `ids` (float32)."""
    seq = torch.tensor([ids], device=model.device)
    smallest = float("inf")
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(seq).logits[0, -1].float()
            top = torch.topk(logits, 2).values
            smallest = min(smallest, float(top[0] - top[1]))
            seq = torch.cat([seq, logits.argmax().view(1, 1)], dim=1)
    return smallest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("out")
    ap.add_argument("--candidates", type=int, default=64)
    ap.add_argument("--keep", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=48)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval().to(device)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 margins, not TF32's
    vocab = int(model.config.vocab_size)
    scored = []
    for i in range(args.candidates):
        ids = [(7 * i + j * 13 + 3) % min(vocab, 250) for j in range(5 + (3 * i) % 20)]
        scored.append({"name": f"c{i}", "prompt_ids": ids, "min_margin": round(min_margin(model, ids, args.max_new), 5)})
    scored.sort(key=lambda p: -p["min_margin"])
    json.dump(scored[: args.keep], open(args.out, "w"), indent=1)
    print("kept", [(p["name"], p["min_margin"]) for p in scored[: args.keep]],
          "smallest of all", min(p["min_margin"] for p in scored))


if __name__ == "__main__":
    main()
