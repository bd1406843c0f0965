"""Tokens committed per verify step of dflash and ddtree on the built-in compare prompts (T=0),
for a target and one or more drafter directories; checks outputs equal ar's.

    python training/eval_acceptance.py --target DIR --draft DIR [DIR ...] [--device cuda] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
sys.path.insert(0, str(ROOT))

from ddtree_engine.reference.engine import load_engine  # noqa: E402
from ddtree_engine.types import SamplingParams, SpeculativeConfig  # noqa: E402
from ddtree_ops.compare.prompts import BUILTIN_PROMPTS  # noqa: E402

SPECS = {
    "ar": SpeculativeConfig("ar"),
    "dflash": SpeculativeConfig("dflash"),
    "ddtree": SpeculativeConfig("ddtree", budget=15, topk=8),
}


def acceptance(target: str, draft: str, device: str = "cpu", dtype: str = "float32", max_new_tokens: int = 128) -> dict:
    """Per algorithm: mean tokens per verify step over all prompts, and whether outputs equal ar's."""
    engine = load_engine(target, draft, SPECS["ddtree"], device=device, dtype=dtype)
    per_prompt = {}
    totals = {name: [0, 0] for name in SPECS}
    identical = True
    for prompt in BUILTIN_PROMPTS:
        ids = engine.chat_prompt_ids([dict(m) for m in prompt.messages])
        outputs = {}
        for name, spec in SPECS.items():
            engine.spec = spec
            res = engine.generate(ids, SamplingParams(max_new_tokens=max_new_tokens))
            outputs[name] = res
            totals[name][0] += sum(res.accepted_per_step)
            totals[name][1] += res.verify_steps
        same = outputs["dflash"].token_ids == outputs["ar"].token_ids == outputs["ddtree"].token_ids
        identical &= same
        per_prompt[prompt.name] = {
            "text": engine.tokenizer.decode(outputs["ar"].token_ids, skip_special_tokens=True),
            "identical": same,
            **{n: round(sum(o.accepted_per_step) / max(1, o.verify_steps), 3) for n, o in outputs.items()},
        }
    mean = {n: t[0] / max(1, t[1]) for n, t in totals.items()}
    return {
        "draft": draft,
        "dflash_tokens_per_step": round(mean["dflash"], 3),
        "ddtree_tokens_per_step": round(mean["ddtree"], 3),
        "ratio": round(mean["ddtree"] / mean["dflash"], 3) if mean["dflash"] else None,
        "identical_to_ar": identical,
        "per_prompt": per_prompt,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True, nargs="+")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = [acceptance(args.target, d, args.device, args.dtype, args.max_new_tokens) for d in args.draft]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'draft':40s} {'dflash t/step':>14s} {'ddtree t/step':>14s} {'ratio':>7s} {'== ar':>6s}")
    for r in results:
        print(f"{r['draft'][-40:]:40s} {r['dflash_tokens_per_step']:14.3f} {r['ddtree_tokens_per_step']:14.3f} "
              f"{r['ratio'] or 0:7.3f} {str(r['identical_to_ar']):>6s}")


if __name__ == "__main__":
    main()
