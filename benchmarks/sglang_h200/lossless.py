"""AR vs DFLASH vs DDTREE in stock SGLang 0.5.23 on the H200: outputs and verify steps, T = 0.

Run through run.sh (it installs SGLang and the plugin's entry point). Each configuration is one
process with its own sglang.Engine; DDTREE records are built from the plugin's ServerArgs (the
class SGLang's REPLACE hook installs). Settings common to all (the shared recipe's limits):
Triton attention, page size 1, radix cache off, CUDA graphs off, bf16.
    [PAR=N] python lossless.py MODELS_DIR OUT_JSON CONFIGS_JSON   (N configurations at once)
A configuration's "expect_error": TEXT must fail at startup with TEXT in its log (`expected_error_seen`);
"prompts": PAIR takes another pair's prompts (the dummy-weight configs have none); "env": {NAME: VALUE} goes to
the engine's environment. A configuration's "trace": true records the DDTREE worker's per-step trace (DDTREE_TRACE); "batch": true sends
all its prompts in one call (SGLang decodes them together) and compares with the pair's batched AR.
"""
import json, os, subprocess, sys, time

MODELS, OUT, CONFIGS = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
CHILD = r'''
import json, os, sys, time
cfg = json.loads(sys.argv[1])
prompts = json.loads(open(cfg.pop("prompts")).read())
max_new = cfg.pop("max_new", 48)
batch = cfg.pop("batch", False)
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
def record(p, o, s):
    m = o["meta_info"]
    res.append({"name": p["name"], "ids": o["output_ids"], "meta": {k: v for k, v in m.items() if isinstance(v, (int, float, str))}, "s": s})
if batch:  # every prompt in one call: SGLang decodes them together (batch size up to the prompt count)
    t = time.time()
    outs = eng.generate(input_ids=[p["prompt_ids"] for p in prompts], sampling_params={"temperature": 0, "max_new_tokens": max_new})
    for p, o in zip(prompts, outs):
        record(p, o, time.time() - t)
else:
    for p in prompts:
        t = time.time()
        record(p, eng.generate(input_ids=p["prompt_ids"], sampling_params={"temperature": 0, "max_new_tokens": max_new}), time.time() - t)
eng.shutdown()
print("RESULT " + json.dumps({"load_s": load_s, "res": res}))
'''
common = dict(skip_tokenizer_init=True, attention_backend="triton", sampling_backend="pytorch",
              mem_fraction_static=0.25, log_level="warning", random_seed=0, disable_radix_cache=True,
              disable_cuda_graph=True, page_size=1, dtype="bfloat16",
              # No prefill CUDA graphs: 13-45 s of capture per engine (2026-12-01, 8 engines at once: 60-160 s per
              # configuration) for prefills this harness runs once per prompt. A small KV pool: engines that share
              # the GPU fit at their memory share whatever loads first.
              cuda_graph_backend_prefill="disabled", max_total_tokens=4096)
PAR = int(os.environ.get("PAR", "1"))  # configurations run at once (each its own engine, its share of memory)
ATTEMPTS, STAGGER_S, MEMORY_RACE = 4, 4.0 if PAR > 1 else 0.0, "leave no GPU memory for the KV cache"
import threading
START = threading.Lock()


def run_one(c):
    label, pair, algo = c["label"], c["pair"], c.get("algo")
    cfg = dict(common, model_path=f"{MODELS}/{pair}/target", prompts=f"{MODELS}/{c.get('prompts', pair)}_prompts.json", max_new=c.get("max_new", 48),
               batch=c.get("batch", False))
    if PAR > 1:
        cfg["mem_fraction_static"] = round(0.8 / PAR, 3)
    cfg.update(c.get("extra", {}))
    env = dict(os.environ, **c.get("env", {}))  # e.g. the worker's switches (DDTREE_DRAFT_GRAPH_AT_BLOCK)
    trace = None
    if algo:
        cfg.update(speculative_algorithm=algo, speculative_draft_model_path=f"{MODELS}/{pair}/draft")
    if algo == "DDTREE":
        cfg["disable_overlap_schedule"] = True
        cfg.update(c.get("ddt", {}))
        if c.get("trace"):
            trace = f"/tmp/trace-{abs(hash(label))}.jsonl"
            if os.path.exists(trace):
                os.remove(trace)
            env["DDTREE_TRACE"] = trace
    t = time.time()
    for attempt in range(1, ATTEMPTS + 1):
        with START:  # engines start STAGGER_S apart: their memory probes then rarely overlap
            time.sleep(STAGGER_S)
        try:
            r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True,
                               timeout=c.get("timeout", 300), env=env)
            rc, stdout, stderr = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stdout, stderr = 124, exc.stdout or "", exc.stderr or ""
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
        # SGLang measures free GPU memory before and after its load; another engine allocating its
        # pool in between reads as "weights leave no memory". That is the harness, not the run: retry.
        if MEMORY_RACE not in (stderr or ""):
            break
    line = next((l for l in stdout.splitlines() if l.startswith("RESULT ")), None)
    out = {"label": label, "rc": rc, "wall_s": round(time.time() - t, 1), "attempts": attempt, "cfg": c}
    if line:
        out.update(json.loads(line[7:]))
    out["log"] = [l for l in (stderr or "").splitlines() if "DDTREE" in l][-20:]
    # SGLang names each Triton kernel compiled while serving (the tree step's should compile at the worker's start).
    out["served_compiles"] = [l for l in (stderr or "").splitlines() if "after serving started" in l][-20:]
    if trace and os.path.exists(trace):
        lines = open(trace).read().splitlines()
        out["trace"] = [json.loads(l) for l in lines[: c.get("trace_steps", 60)]]
        try:  # the run's last step (its counters); a server killed mid-write can leave half a line
            out["trace_last"] = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            out["trace_last"] = None
    if not line:
        out["err"] = (stderr or stdout)[-6000:]
    if c.get("expect_error"):  # a configuration that must fail at startup with this text (e.g. fit.py's message)
        out["expected_error_seen"] = not line and c["expect_error"] in (stderr or "")
        out["err_lines"] = [l for l in (stderr or "").splitlines() if c["expect_error"] in l][-2:]
    return out


from concurrent.futures import ThreadPoolExecutor

with ThreadPoolExecutor(max_workers=PAR) as pool:
    results = []
    for out in pool.map(run_one, CONFIGS):
        results.append(out)
        print(out["label"], "rc", out["rc"], "wall", out["wall_s"], flush=True)
        if "err" in out:
            print(out["err"][-3500:], flush=True)
        json.dump(results, open(OUT, "w"), indent=1)
for out in results:
    pair = out["cfg"]["pair"]
    dtype = out["cfg"].get("extra", {}).get("dtype")
    # The reference: the pair's AR at the same dtype and batching (a batch's GEMMs may round differently).
    ref = next((x for x in results if x["cfg"]["pair"] == pair and not x["cfg"].get("algo") and "res" in x
                and x["cfg"].get("extra", {}).get("dtype") == dtype and x["cfg"].get("batch", False) == out["cfg"].get("batch", False)), None)
    if ref and "res" in out and out is not ref:
        out["same_as_ar"] = [a["ids"] == b["ids"] for a, b in zip(ref["res"], out["res"])]
        out["verify_ct"] = [x["meta"].get("spec_verify_ct") for x in out["res"]]
        out["first_diff"] = [next((j for j, (u, v) in enumerate(zip(a["ids"], b["ids"])) if u != v), None)
                             for a, b in zip(ref["res"], out["res"])]
    seen = f" expected error seen {out['expected_error_seen']}" if "expected_error_seen" in out else ""
    # A traced DDTREE run: the routed tree conv's calls in the scheduler's process by its last step (None: not routed).
    conv = (out.get("trace_last") or {}).get("tree_conv")
    seen += f" tree conv {conv['engine_calls']} calls, {conv['given_calls']} given" if conv else ""
    print(f"{out['label']:<28} rc {out['rc']} same {out.get('same_as_ar')} verify {out.get('verify_ct')}{seen}", flush=True)
json.dump(results, open(OUT, "w"), indent=1)
