"""Verify steps in SGLang (an H200 results file of lossless.py) beside the reference backend's, same prompts.

The reference backend (`ddtree_engine.reference`, transformers) runs here on the CPU in float32; SGLang ran
in bf16 on the H200, so a step count may differ where bf16 flips a near-tie (the tokens are compared too).
For every lab-pair configuration of the results file (AR, DFLASH, DDTREE budget/topk/hybrid mode), it
prints SGLang's verify steps per prompt, the reference's, and whether both emitted SGLang AR's tokens.

    python benchmarks/sglang_h200/reference_steps.py RESULTS_JSON [--json OUT]
Exits 1 if a reference output differs from SGLang's AR output (losslessness is checked, not assumed).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))

from ddtree_engine.reference.engine import load_engine  # noqa: E402
from ddtree_engine.types import SamplingParams, SpeculativeConfig  # noqa: E402


def spec_of(cfg: dict) -> SpeculativeConfig:
    """The reference backend's settings for one lossless.py configuration."""
    algo = cfg.get("algo")
    if not algo:
        return SpeculativeConfig("ar")
    if algo == "DFLASH":
        return SpeculativeConfig("dflash")
    ddt = cfg["ddt"]
    mode = ddt.get("speculative_ddtree_hybrid_mode", "safe")
    return SpeculativeConfig("ddtree", budget=ddt["speculative_ddtree_budget"], topk=ddt["speculative_ddtree_topk"],
                             hybrid_mode=mode, allow_hybrid_unsafe=mode == "unsafe")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    results = [r for r in json.load(open(args.results)) if r["cfg"]["pair"] == "lab" and "res" in r]
    ar = next(r for r in results if not r["cfg"].get("algo"))
    prompts = json.load(open(Path(__file__).parent / "lab_prompts.json"))
    engine = load_engine("lab", "lab", SpeculativeConfig("dflash"), device="cpu", dtype="float32")
    rows, bad = [], 0
    for r in results:
        engine.spec = spec_of(r["cfg"])
        max_new = r["cfg"].get("max_new", 48)
        ref_steps, ref_same = [], []
        for p, ar_out in zip(prompts, ar["res"]):
            res = engine.generate(p["prompt_ids"], SamplingParams(max_new_tokens=max_new))
            ref_steps.append(res.verify_steps if r["cfg"].get("algo") else len(res.token_ids))
            ref_same.append(res.token_ids == ar_out["ids"])
        sgl_steps = [x["meta"].get("spec_verify_ct") or len(x["ids"]) for x in r["res"]]
        sgl_same = [x["ids"] == y["ids"] for x, y in zip(r["res"], ar["res"])]
        unsafe = engine.spec.hybrid_mode == "unsafe"
        if not unsafe and not all(ref_same):
            bad += 1
        rows.append({"label": r["label"], "sglang_steps": sgl_steps, "reference_steps": ref_steps,
                     "sglang_same_as_ar": sgl_same, "reference_same_as_sglang_ar": ref_same})
        print(f"{r['label']:<24} sglang {sum(sgl_steps):>4} {sgl_steps}  reference {sum(ref_steps):>4} {ref_steps}  "
              f"same as AR: sglang {sum(sgl_same)}/{len(sgl_same)}, reference {sum(ref_same)}/{len(ref_same)}", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
