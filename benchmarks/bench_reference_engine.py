"""ar vs dflash vs ddtree on the reference backend, measured in one run on one device.

Prints, per model and algorithm: tokens committed per verify step, decode tokens/s, and both
as a ratio to dflash measured in the same run. Models: the shipped `lab` pair (real
speculation) and a randomly initialised ~1B hybrid target with a random drafter (acceptance is
meaningless there; it shows the per-step cost of a tree against a chain at equal verify width).

    python benchmarks/bench_reference_engine.py [--device cuda] [--skip-1b] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
sys.path.insert(0, str(ROOT))

from ddtree_engine.reference.engine import load_engine  # noqa: E402
from ddtree_engine.types import SamplingParams, SpeculativeConfig  # noqa: E402

CONFIGS = [
    ("ar", SpeculativeConfig("ar")),
    ("dflash", SpeculativeConfig("dflash")),
    ("ddtree b15 k8", SpeculativeConfig("ddtree", 15, 8)),
    ("ddtree b4 k4", SpeculativeConfig("ddtree", 4, 4)),
    ("ddtree b8 k8", SpeculativeConfig("ddtree", 8, 8)),
    ("ddtree b32 k8", SpeculativeConfig("ddtree", 32, 8)),
]


def make_random_1b(out: Path) -> tuple[str, str]:
    from transformers import AutoModelForCausalLM

    from ddtree_engine.reference.dflash import DFlashDraftModel
    from ddtree_engine.reference.tiny import draft_config, save_drafter, target_config
    from ddtree_engine.reference.tokenizer import MASK, save_byte_tokenizer

    torch.manual_seed(0)
    tok = save_byte_tokenizer(out / "target")
    cfg = target_config(
        "qwen3-next", len(tok), hidden_size=2048, num_layers=20, intermediate_size=5632,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, linear_num_key_heads=8,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    )
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out / "target"))
    drafter = DFlashDraftModel(draft_config(cfg, tok.convert_tokens_to_ids(MASK)))
    save_drafter(drafter.to(torch.bfloat16), out / "draft")
    return str(out / "target"), str(out / "draft")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(engine, prompts: list[list[int]], max_new_tokens: int, device: str) -> dict:
    tokens = steps = 0
    seconds = 0.0
    outputs = []
    for ids in prompts:
        sync(device)
        start = time.perf_counter()
        res = engine.generate(ids, SamplingParams(max_new_tokens=max_new_tokens))
        sync(device)
        seconds += time.perf_counter() - start
        # The first token comes from the prefill; decode speed counts the rest.
        tokens += len(res.token_ids) - 1
        steps += res.verify_steps
        outputs.append(res.token_ids)
    return {"tokens": tokens, "steps": steps, "seconds": seconds, "outputs": outputs}


def run_model(name: str, target: str, draft: str, prompts, max_new_tokens: int, device: str, dtype: str) -> list[dict]:
    engine = load_engine(target, draft, SpeculativeConfig("ddtree"), device=device, dtype=dtype)
    engine.spec = SpeculativeConfig("dflash")
    engine.generate(prompts[0], SamplingParams(max_new_tokens=8))  # warm-up
    rows = []
    for label, spec in CONFIGS:
        engine.spec = spec
        m = measure(engine, prompts, max_new_tokens, device)
        rows.append({"model": name, "config": label, **{k: v for k, v in m.items() if k != "outputs"},
                     "tokens_per_step": m["tokens"] / max(1, m["steps"]), "tokens_per_s": m["tokens"] / m["seconds"],
                     "outputs": m["outputs"]})
    base = next(r for r in rows if r["config"] == "dflash")
    ar = next(r for r in rows if r["config"] == "ar")
    for r in rows:
        r["step_ratio_vs_dflash"] = r["tokens_per_step"] / base["tokens_per_step"]
        r["speed_ratio_vs_dflash"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["identical_to_ar"] = r["outputs"] == ar["outputs"]
    for r in rows:
        del r["outputs"]
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--skip-1b", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from ddtree_ops.compare.prompts import BUILTIN_PROMPTS

    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    lab = load_engine("lab", "lab", SpeculativeConfig("ar"), device="cpu")
    lab_prompts = [lab.chat_prompt_ids([dict(m) for m in p.messages]) for p in BUILTIN_PROMPTS]
    rows = run_model("lab pair", "lab", "lab", lab_prompts, args.max_new_tokens, args.device, args.dtype)
    if not args.skip_1b:
        with tempfile.TemporaryDirectory() as tmp:
            target, draft = make_random_1b(Path(tmp))
            rows += run_model("random 1B hybrid", target, draft, lab_prompts[:3], 64, args.device, args.dtype)
    print(f"# reference backend, {gpu}, torch {torch.__version__}, git {rev or 'unknown'}, dtype {args.dtype}")
    print(f"{'model':18s} {'config':14s} {'tok/step':>9s} {'tok/s':>9s} {'step/dflash':>12s} {'speed/dflash':>13s} {'==ar':>5s}")
    for r in rows:
        print(f"{r['model']:18s} {r['config']:14s} {r['tokens_per_step']:9.2f} {r['tokens_per_s']:9.1f} "
              f"{r['step_ratio_vs_dflash']:12.3f} {r['speed_ratio_vs_dflash']:13.3f} {str(r['identical_to_ar']):>5s}")
    if args.json:
        args.json.write_text(json.dumps({"gpu": gpu, "git": rev, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
