"""The lab pair on its training prompts and on held-out prompts: ar, dflash and ddtree
(budget 15, topk 8) on the reference backend, one process, every figure measured in this run.

Prompt sets (ddtree_ops/prompts.py; tests/ddtree_engine/test_lab_heldout.py proves which are held out):
  builtin            the compare prompts: training templates, two of them verbatim training prompts
  heldout-templates  training templates with values the training corpus never drew
  heldout-novel      prompts no training template generates

Per set: committed tokens per verify step (prefill token excluded) of dflash and ddtree and
their ratio; decode tokens/s of ar, dflash and ddtree and the ddtree/dflash ratio; and whether
dflash and ddtree emitted exactly ar's tokens (T=0) on every prompt. Exits 1 if they did not.

    python benchmarks/bench_lab_heldout.py [--max-new-tokens 128] [--repeats 3] [--threads N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
sys.path.insert(0, str(ROOT))

from ddtree_engine.reference.engine import load_engine  # noqa: E402
from ddtree_engine.types import SamplingParams, SpeculativeConfig  # noqa: E402
from ddtree_ops.compare.prompts import PROMPT_SETS  # noqa: E402

SETS = ("builtin", "heldout-templates", "heldout-novel")
ARMS = {
    "ar": SpeculativeConfig("ar"),
    "dflash": SpeculativeConfig("dflash"),
    "ddtree": SpeculativeConfig("ddtree", budget=15, topk=8),
}


def run_prompt(engine, ids: list[int], max_new_tokens: int, repeats: int) -> dict:
    """Every arm on one prompt, arms interleaved within each repeat so that a change in machine
    load hits all three alike; keeps the fastest time per arm and checks repeats agree.

    Args:
        engine: a lab engine with its drafter loaded; its `spec` is switched per arm.
        ids: the chat-rendered prompt token ids.
        max_new_tokens: the generation limit.
        repeats: timed runs per arm.

    Returns:
        Per arm: token_ids, committed (tokens from verify steps), steps, seconds (best of repeats).
    """
    out: dict[str, dict] = {}
    for _ in range(repeats):
        for arm, spec in ARMS.items():
            engine.spec = spec
            start = time.perf_counter()
            res = engine.generate(ids, SamplingParams(max_new_tokens=max_new_tokens))
            seconds = time.perf_counter() - start
            # Committed tokens per verify step: the prefill's first token is no verify step's.
            row = {"token_ids": res.token_ids, "committed": sum(res.accepted_per_step), "steps": res.verify_steps}
            if arm in out:
                assert out[arm]["token_ids"] == res.token_ids, f"{arm} is not deterministic at T=0"
                out[arm]["seconds"] = min(out[arm]["seconds"], seconds)
            else:
                out[arm] = {**row, "seconds": seconds}
    return out


def summarize(per_prompt: list[dict]) -> dict:
    """Totals of one prompt set: tokens/step and tokens/s per arm, ratios, losslessness.

    Args:
        per_prompt: run_prompt's results, one per prompt.

    Returns:
        A flat dict of the set's figures.
    """
    total = {arm: {k: sum(p[arm][k] for p in per_prompt) for k in ("committed", "steps", "seconds")} for arm in ARMS}
    per_step = {arm: t["committed"] / max(1, t["steps"]) for arm, t in total.items()}
    per_s = {arm: t["committed"] / t["seconds"] for arm, t in total.items()}
    mismatched = [p["name"] for p in per_prompt if not p["identical_to_ar"]]
    return {
        "prompts": len(per_prompt),
        "tokens": total["ar"]["committed"],
        **{f"{arm}_tokens_per_step": round(v, 3) for arm, v in per_step.items()},
        "step_ratio_ddtree_vs_dflash": round(per_step["ddtree"] / per_step["dflash"], 3),
        **{f"{arm}_tokens_per_s": round(v, 1) for arm, v in per_s.items()},
        "speed_ratio_ddtree_vs_dflash": round(per_s["ddtree"] / per_s["dflash"], 3),
        "identical_to_ar": not mismatched,
        "mismatched": mismatched,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per prompt per arm; the fastest counts")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads [default: torch's]")
    ap.add_argument("--per-prompt", action="store_true", help="also print one line per prompt")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    engine = load_engine("lab", "lab", ARMS["ddtree"], device="cpu", dtype=args.dtype)
    warm = engine.chat_prompt_ids([{"role": "user", "content": "Hello"}])
    for spec in ARMS.values():
        engine.spec = spec
        engine.generate(warm, SamplingParams(max_new_tokens=16))

    results = {}
    for set_name in args.sets:
        per_prompt = []
        for prompt in PROMPT_SETS[set_name]:
            ids = engine.chat_prompt_ids([dict(m) for m in prompt.messages])
            arms = run_prompt(engine, ids, args.max_new_tokens, args.repeats)
            ar_ids = arms["ar"]["token_ids"]
            per_prompt.append({
                "name": prompt.name,
                "identical_to_ar": all(arms[a]["token_ids"] == ar_ids for a in ("dflash", "ddtree")),
                "ar_text": engine.tokenizer.decode(ar_ids, skip_special_tokens=True),
                **{arm: {k: v for k, v in r.items() if k != "token_ids"} for arm, r in arms.items()},
            })
            print(f"{set_name}/{prompt.name}: done", file=sys.stderr, flush=True)
        results[set_name] = {"summary": summarize(per_prompt), "per_prompt": per_prompt}

    print(f"# lab pair, reference backend, cpu ({platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads), torch {torch.__version__}, dtype {args.dtype}, "
          f"git {rev or 'unknown'}, max_new_tokens {args.max_new_tokens}, best of {args.repeats}")
    head = (f"{'prompt set':18s} {'n':>3s} {'tokens':>6s} {'dflash t/step':>13s} {'ddtree t/step':>13s} {'ratio':>6s} "
            f"{'ar tok/s':>9s} {'dflash tok/s':>12s} {'ddtree tok/s':>12s} {'tok/s ratio':>11s} {'==ar':>5s}")
    print(head)
    for set_name, r in results.items():
        s = r["summary"]
        print(f"{set_name:18s} {s['prompts']:3d} {s['tokens']:6d} {s['dflash_tokens_per_step']:13.2f} "
              f"{s['ddtree_tokens_per_step']:13.2f} {s['step_ratio_ddtree_vs_dflash']:6.2f} {s['ar_tokens_per_s']:9.1f} "
              f"{s['dflash_tokens_per_s']:12.1f} {s['ddtree_tokens_per_s']:12.1f} "
              f"{s['speed_ratio_ddtree_vs_dflash']:11.2f} {str(s['identical_to_ar']):>5s}")
    if args.per_prompt:
        print(f"\n{'prompt':22s} {'tokens':>6s} {'dflash t/step':>13s} {'ddtree t/step':>13s} {'==ar':>5s}  ar reply")
        for r in results.values():
            for p in r["per_prompt"]:
                d, t = p["dflash"], p["ddtree"]
                print(f"{p['name']:22s} {p['ar']['committed']:6d} {d['committed'] / max(1, d['steps']):13.2f} "
                      f"{t['committed'] / max(1, t['steps']):13.2f} {str(p['identical_to_ar']):>5s}  "
                      f"{p['ar_text'][:60]!r}")
    if args.json:
        args.json.write_text(json.dumps({"git": rev, "torch": torch.__version__, "dtype": args.dtype,
                                         "threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens,
                                         "repeats": args.repeats, "sets": results}, indent=1))
    lossless = all(r["summary"]["identical_to_ar"] for r in results.values())
    if not lossless:
        print("NOT LOSSLESS: " + ", ".join(f"{n}: {r['summary']['mismatched']}" for n, r in results.items()
                                            if r["summary"]["mismatched"]), file=sys.stderr)
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
