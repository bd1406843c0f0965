"""AR vs DFLASH vs DDTREE in stock SGLang 0.5.23 on the H200: outputs and verify steps, T = 0.

Run through run.sh (it installs SGLang and the plugin's entry point). Each configuration is one
process with its own sglang.Engine; DDTREE records are built from the plugin's ServerArgs (the
class SGLang's REPLACE hook installs). Settings common to all (the shared recipe's limits):
Triton attention, page size 1, radix cache off, CUDA graphs off, bf16.
    python lossless.py MODELS_DIR OUT_JSON CONFIGS_JSON
"""
import json, os, subprocess, sys, time

MODELS, OUT, CONFIGS = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
CHILD = r'''
import json, os, sys, time
cfg = json.loads(sys.argv[1])
prompts = json.loads(open(cfg.pop("prompts")).read())
max_new = cfg.pop("max_new", 48)
import sglang as sgl
t0 = time.time()
if cfg.get("speculative_algorithm") == "DDTREE":
    from sglang.srt.plugins import load_plugins
    load_plugins()
    import sglang.srt.server_args as sa
    cfg.setdefault("log_level", "warning")
    eng = sgl.Engine(server_args=sa.ServerArgs(**cfg))
else:
    eng = sgl.Engine(**cfg)
load_s = time.time() - t0
res = []
for p in prompts:
    t = time.time()
    o = eng.generate(input_ids=p["prompt_ids"], sampling_params={"temperature": 0, "max_new_tokens": max_new})
    m = o["meta_info"]
    res.append({"name": p["name"], "ids": o["output_ids"], "meta": {k: v for k, v in m.items() if isinstance(v, (int, float, str))}, "s": time.time() - t})
eng.shutdown()
print("RESULT " + json.dumps({"load_s": load_s, "res": res}))
'''
common = dict(skip_tokenizer_init=True, attention_backend="triton", sampling_backend="pytorch",
              mem_fraction_static=0.25, log_level="warning", random_seed=0, disable_radix_cache=True,
              disable_cuda_graph=True, page_size=1, dtype="bfloat16")
results = []
for c in CONFIGS:
    label, pair, algo = c["label"], c["pair"], c.get("algo")
    cfg = dict(common, model_path=f"{MODELS}/{pair}/target", prompts=f"{MODELS}/{pair}_prompts.json", max_new=c.get("max_new", 48))
    cfg.update(c.get("extra", {}))
    env = dict(os.environ)
    if algo:
        cfg.update(speculative_algorithm=algo, speculative_draft_model_path=f"{MODELS}/{pair}/draft")
    if algo == "DDTREE":
        cfg["disable_overlap_schedule"] = True
        cfg.update(c.get("ddt", {}))
    t = time.time()
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, timeout=c.get("timeout", 200), env=env)
    line = next((l for l in r.stdout.splitlines() if l.startswith("RESULT ")), None)
    out = {"label": label, "rc": r.returncode, "wall_s": round(time.time() - t, 1), "cfg": c}
    if line:
        out.update(json.loads(line[7:]))
    out["log"] = [l for l in (r.stderr or "").splitlines() if "DDTREE" in l][-20:]
    if not line:
        out["err"] = (r.stderr or r.stdout)[-6000:]
    results.append(out)
    ref = next((x for x in results if x["cfg"]["pair"] == pair and not x["cfg"].get("algo") and "res" in x), None)
    same = None
    if ref and line:
        same = [a["ids"] == b["ids"] for a, b in zip(ref["res"], out["res"])]
        out["same_as_ar"] = same
        vs = [x["meta"].get("spec_verify_ct") for x in out["res"]]
        out["verify_ct"] = vs
    print(label, "rc", r.returncode, "wall", out["wall_s"], "same", same, "verify", out.get("verify_ct"), flush=True)
    if not line:
        print(out["err"][-3500:], flush=True)
    json.dump(results, open(OUT, "w"), indent=1)
