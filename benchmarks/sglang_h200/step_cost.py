"""Step cost of AR, DFLASH and DDTREE in stock SGLang 0.5.23 on one GPU, measured in one run (issue 12).

Each arm is its own sglang.Engine in its own process. The arms of a group start together, load one at a
time (a file lock: SGLang sizes its pools from the free memory it sees around its own load) and are then
measured one after another, each alone on the GPU while the others sleep, so every ratio compares arms
measured minutes apart in the same run; ROUNDS=N measures every arm N times, arm after arm, and keeps each arm's
median round (the lower middle one for an even N; every round's figure is printed; odd rounds run the arms in
reverse order; a round finished counts even if the arm dies later; each round's ms/step is printed as it ends and
kept in OUT_DIR/sglang_h200_step_cost.partial.json, so a run cut short keeps its rounds). ARM_TIMEOUT_S bounds one arm's measurement; LOG_LEVEL=info shows
SGLang's decode-batch lines in the per-arm logs (a folder under /tmp, tarred into OUT_DIR/logs.tgz).

    python step_cost.py MODELS_DIR OUT_DIR GROUPS_JSON
GROUPS_JSON: [{"model": "q35-4b", "dummy": true, "arms": ["ar", "dflash", "dflash-nograph", "ddtree-15-8", ...],
               "profile": ["dflash-nograph", "ddtree-15-8"]}, {"model": "lab", "prompts": "lab", ...}]
  dummy: random weights (`load_format=dummy`), a 512-token prompt, 256 new tokens, EOS ignored: per-step time
         is (generation time - prefill time) / verify steps (acceptance is meaningless with random weights);
  prompts "lab": the compare prompts of the trained lab pair (MODELS_DIR/lab_prompts.json), to EOS or 256
         tokens: tokens per step and tok/s are real; "repeat": N decodes each prompt N times a round (a dummy
         group times 2N decodes of its prompt a round, the median kept; 2 by default).
Arms: ar, dflash (CUDA graphs as SGLang ships them), dflash-nograph, ddtree-B-K (budget B, topk K, without CUDA
graphs), ddtree-graph-B-K (the same with CUDA graphs on: the target's verify replays a tree-masked graph, the tree
padded to max(block, B + 1) rows; the drafter replays graphs captured at its block); an arm ending in +eagerprep runs its tree step and its walk + commit op by op (DDTREE_TREE_GRAPH=0,
sglang_plugin/prep.py and walk_commit.py) instead of a CUDA-graph replay each; +eagerdraft runs the drafter eager when the verify is wider
than its block (DDTREE_DRAFT_GRAPH_AT_BLOCK=0; by default its graphs are captured at its block, worker.py). Settings common to all arms (the shared recipe's limits):
Triton attention, page size 1, radix cache off, overlap schedule off, bf16, batch size 1.
`profile` arms also record a torch-profiler trace of 12 steps (the first a prefill), summarised per kernel
(profile_summary.py); PROFILE_STACK=1 records Python stacks too, for profile_compare.py (two arms' host
steps side by side). The table gives each arm's tok/s and ms/step over DFLASH's per round too (the median
and range), and for dummy groups the same ratio of each round's quickest decode (host interference only adds
time; every decode's time is kept, t257_each_s). Rounds are the unit of pairing: with "repeat": 1 a round is 2
decodes (~4 s an arm at 4B), so many short rounds pair arms measured seconds apart.
PIN_CPUS=2,3 pins every thread of each arm's SGLang scheduler process to those CPUs once it has loaded (the same
CPUs for every arm: they measure one at a time), so no arm's host work runs on CPUs the others did not get; the
result records what was pinned (SGLang pins nothing by default). PIN_MAIN_CPU=3 (without PIN_CPUS) pins only
each scheduler's main thread, the one that runs the step's Python, to that CPU, and leaves its other threads
where the kernel puts them (pinning all 60-odd threads to a few CPUs slowed every arm). FREEZE_GC=1 calls SGLang's freeze_gc once after
the first round's warm-up, in every arm (gc_frozen in the result).
"""
import json, os, random, subprocess, sys, time

MODELS, OUT, GROUPS = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = r'''
import json, os, statistics, sys, time
cfg = json.loads(sys.argv[1]); bench = cfg.pop("_bench")
os.environ.update(cfg.pop("_env", {}))  # before SGLang starts its scheduler process, which inherits it
import fcntl
import sglang as sgl
# One arm loads at a time (imports overlap): SGLang sizes its pools from the free memory it sees before and
# after its own load, so another arm allocating in between would read as this arm's weights.
lock = open(bench["load_lock"], "w")
fcntl.flock(lock, fcntl.LOCK_EX)
t0 = time.time()
if cfg.get("speculative_algorithm") == "DDTREE":
    from sglang.srt.plugins import load_plugins
    load_plugins()
    import sglang.srt.server_args as sa
    eng = sgl.Engine(server_args=sa.ServerArgs(**cfg))
else:
    eng = sgl.Engine(**cfg)
load_s = time.time() - t0
fcntl.flock(lock, fcntl.LOCK_UN)
def pin_scheduler(cpus, main_only=False):
    """Every thread of this engine's scheduler process (its title starts sglang::scheduler) onto `cpus`, or
    only its main thread, the one that runs the step's Python (from /proc: the stand-in engine of the CPU
    tests has no psutil)."""
    def parent(pid):
        try:
            return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0
    def mine(pid):
        while pid > 1:
            pid = parent(pid)
            if pid == os.getpid():
                return True
        return False
    found = []
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            title = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "sglang::scheduler" in title and mine(pid):
            found.append(pid)
    if not found:
        return {"pin_error": "no sglang::scheduler process under this engine"}
    done = []
    for pid in found:
        pinned = 0
        for tid in [pid] if main_only else (int(t) for t in os.listdir(f"/proc/{pid}/task")):
            try:
                os.sched_setaffinity(tid, cpus)
                pinned += 1
            except ProcessLookupError:  # a thread that ended since the listing
                pass
        done.append({"pid": pid, "threads": pinned, "cpus": sorted(os.sched_getaffinity(pid)), "main_only": main_only})
    return {"pinned": done}
pin = {}
if os.environ.get("PIN_CPUS") or os.environ.get("PIN_MAIN_CPU"):
    main_only = not os.environ.get("PIN_CPUS")
    pin = pin_scheduler({int(c) for c in os.environ["PIN_MAIN_CPU" if main_only else "PIN_CPUS"].split(",")}, main_only)
    print(json.dumps(pin), file=sys.stderr, flush=True)
open(bench["ready"], "w").close()
parent = os.getppid()
def wait_for(path):  # as long as the parent lives: other arms' rounds may take long
    while not os.path.exists(path):
        if os.getppid() != parent:
            raise SystemExit(f"the parent left before {path}")
        time.sleep(0.02)
out = {"load_s": load_s, **pin}
def gen(ids, n, ignore_eos):
    t = time.perf_counter()
    o = eng.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": n, "ignore_eos": ignore_eos})
    return time.perf_counter() - t, o
def freeze_gc(first):
    """FREEZE_GC=1: after the first round's warm-up, SGLang's freeze_gc (gc.freeze in the scheduler and
    tokenizer processes, what SGLang's own long-GC warning advises after a few warm-up requests)."""
    if first and os.environ.get("FREEZE_GC") == "1":
        eng.freeze_gc()
        out["gc_frozen"] = True
def measure(first):
    if bench["prompts"] == "synthetic":
        prompt = [(i * 7919) % 150000 + 10 for i in range(512)]
        gen(prompt, 8, True); gen(prompt, 8, True)
        freeze_gc(first)
        pre = statistics.median([gen(prompt, 1, True)[0] for _ in range(3)])
        runs = [gen(prompt, 257, True) for _ in range(2 * bench.get("repeat", 1))]
        each = [r[0] for r in runs]
        t = statistics.median(each); meta = runs[0][1]["meta_info"]
        steps = meta.get("spec_verify_ct") or 256
        # Also the round's quickest decode: host interference only ever adds time (timeit's minimum).
        return dict(prefill_s=pre, t257_s=t, t257_each_s=each, steps=steps, step_ms=(t - pre) / steps * 1e3,
                    step_ms_best=(min(each) - pre) / steps * 1e3, tokens_per_step=256 / steps, tok_per_s=256 / (t - pre))
    prompts = json.load(open(bench["prompts"]))
    if first:
        for p in prompts:
            gen(p["prompt_ids"], 256, False)
    freeze_gc(first)
    total_t = total_n = total_steps = 0
    per = []
    for p in prompts:
        pre = min(gen(p["prompt_ids"], 1, False)[0] for _ in range(2))
        for _ in range(bench.get("repeat", 1)):  # a round of more steps: less of it is host jitter
            t, o = gen(p["prompt_ids"], 256, False)
            m = o["meta_info"]; n = len(o["output_ids"]); steps = m.get("spec_verify_ct") or n
            total_t += t - pre; total_n += n; total_steps += steps
        per.append({"name": p["name"], "tokens": n, "steps": steps, "s": t, "prefill_s": pre, "ids": o["output_ids"]})
    return dict(per_prompt=per, tokens=total_n, steps=total_steps, decode_s=total_t,
                step_ms=total_t / total_steps * 1e3, tokens_per_step=total_n / total_steps, tok_per_s=total_n / total_t)
try:
    # Rounds: the parent lets one arm at a time measure, arm after arm, round after round (so a slow
    # stretch of the GPU or host falls on every arm alike). Each round's figures go to its done file
    # (written whole, then renamed), which the parent reads: a round finished survives a later kill.
    for r in range(bench.get("rounds", 1)):
        wait_for(f"{bench['go']}.{r}")
        m = measure(r == 0)
        if r == 0 and "per_prompt" in m:
            out["per_prompt"] = m.pop("per_prompt")  # the outputs once (round 0) are enough
        with open(f"{bench['done']}.{r}.tmp", "w") as f:
            json.dump(m, f)
        os.rename(f"{bench['done']}.{r}.tmp", f"{bench['done']}.{r}")
    # The end: the parent opens it for one arm at a time, after every arm's last round, so a profile
    # and an engine's shutdown never overlap another arm's measurement.
    wait_for(f"{bench['go']}.end")
    if bench.get("profile"):
        # A short prompt: the trace's first step is its prefill, so it should cost about one decode step.
        prompt = [(i * 7919) % 150000 + 10 for i in range(8)] if bench["prompts"] == "synthetic" else json.load(open(bench["prompts"]))[0]["prompt_ids"]
        os.makedirs(bench["profile"], exist_ok=True)
        # 12 steps: 512 tokens keep the engine busy past them at any tokens per step (the lab pair's DDTREE
        # takes ~7 a step: 64 tokens ended before the 12th step and the profiler never wrote its trace).
        eng.start_profile(output_dir=bench["profile"], num_steps=12, activities=["CPU", "GPU"],
                          with_stack=os.environ.get("PROFILE_STACK") == "1")
        gen(prompt, 512, True)
        time.sleep(3)
finally:
    print("RESULT " + json.dumps(out), flush=True)
    eng.shutdown()
'''
COMMON = dict(skip_tokenizer_init=True, attention_backend="triton", sampling_backend="pytorch", log_level="error",
              random_seed=0, disable_radix_cache=True, page_size=1, dtype="bfloat16", disable_overlap_schedule=True,
              max_running_requests=2, sleep_on_idle=True,
              # No prefill graphs (13-45 s of capture per arm; prefill is subtracted from every arm's time) and a
              # small KV pool: arms that share the GPU then fit at a fixed memory share, in any load order.
              cuda_graph_backend_prefill="disabled", max_total_tokens=4096)
ARM_TIMEOUT_S = float(os.environ.get("ARM_TIMEOUT_S", "600"))  # one arm's measurement, then it is killed
ROUNDS = int(os.environ.get("ROUNDS", "1"))  # each arm measured this many times, interleaved with the others
LOG_LEVEL = os.environ.get("LOG_LEVEL")  # e.g. info: SGLang's decode-batch lines show an arm's progress
if LOG_LEVEL:
    COMMON["log_level"] = LOG_LEVEL


def arm_cfg(group, arm, share):
    arm, _, variant = arm.partition("+")
    cfg = _arm_cfg(group, arm, share)
    if variant == "eagerprep":  # the tree step launched op by op (sglang_plugin/prep.py), not one graph replay
        cfg["_env"] = {"DDTREE_TREE_GRAPH": "0"}
    elif variant == "eagerdraft":  # budgets wider than the block: the drafter eager, not graphs at its block
        cfg["_env"] = {"DDTREE_DRAFT_GRAPH_AT_BLOCK": "0"}
    elif variant:
        raise SystemExit(f"unknown arm variant {variant!r} in {arm}+{variant}")
    return cfg


def _arm_cfg(group, arm, share):
    model = f"{MODELS}/{group['model']}"
    cfg = dict(COMMON, model_path=f"{model}/target", mem_fraction_static=share)
    if group.get("dummy"):
        cfg["load_format"] = "dummy"
    if arm == "ar":
        return cfg
    cfg.update(speculative_draft_model_path=f"{model}/draft")
    if group.get("dummy"):
        cfg["speculative_draft_load_format"] = "dummy"
    if arm in ("dflash", "dflash-nograph"):
        cfg.update(speculative_algorithm="DFLASH", disable_cuda_graph=arm == "dflash-nograph")
        return cfg
    *kind, budget, topk = arm.split("-")
    cfg.update(speculative_algorithm="DDTREE", disable_cuda_graph=kind != ["ddtree", "graph"],
               speculative_ddtree_budget=int(budget), speculative_ddtree_topk=int(topk))
    return cfg


MEMORY_RACE = "leave no GPU memory for the KV cache"  # SGLang's probe saw another arm's allocation: retry


def start_arm(cfg, i, tmp):
    log = open(f"{tmp}/{i}.log", "w")
    return subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(cfg)], stdout=subprocess.PIPE, stderr=log, text=True)


def run_group(group, tmp, done_before=()):
    arms = group["arms"]
    # SGLang checks the share against the memory free when this arm loads (others already resident), so it is
    # fixed, not divided by the arm count; max_total_tokens keeps each arm's pools small.
    share = 0.3
    procs = []
    for i, arm in enumerate(arms):
        cfg = arm_cfg(group, arm, share)
        bench = {"ready": f"{tmp}/{i}.ready", "go": f"{tmp}/{i}.go", "done": f"{tmp}/{i}.done", "load_lock": f"{tmp}/load.lock", "rounds": ROUNDS,
                 "repeat": group.get("repeat", 1),
                 "prompts": "synthetic" if group.get("dummy") else f"{MODELS}/{group['prompts']}_prompts.json"}
        if arm in group.get("profile", []):
            bench["profile"] = f"{tmp}/prof-{arm}"
        cfg["_bench"] = bench
        procs.append((arm, bench, cfg, start_arm(cfg, i, tmp)))
    settled = lambda b, p: os.path.exists(b["ready"]) or p.poll() is not None
    t = time.time()
    while not all(settled(b, p) for _, b, _, p in procs) and time.time() - t < 600:
        time.sleep(0.5)
    for attempt in range(3):  # an arm that still lost a memory race (the load lock should prevent it) starts again
        for i, (arm, bench, cfg, proc) in enumerate(procs):
            if proc.poll() is not None and not os.path.exists(bench["ready"]) and MEMORY_RACE in open(f"{tmp}/{i}.log").read():
                proc = start_arm(cfg, i, tmp)
                procs[i] = (arm, bench, cfg, proc)
                t = time.time()
                while not os.path.exists(bench["ready"]) and proc.poll() is None and time.time() - t < 300:
                    time.sleep(0.2)
        time.sleep(1)
    for i, (arm, bench, _, proc) in enumerate(procs):
        t = time.time()
        while not os.path.exists(bench["ready"]) and proc.poll() is None and time.time() - t < 600:
            time.sleep(0.2)
    for r in range(ROUNDS):  # one arm at a time on the GPU, arm after arm (every other round in reverse)
        for arm, bench, _, proc in (procs if r % 2 == 0 else procs[::-1]):
            if proc.poll() is not None:
                continue
            open(f"{bench['go']}.{r}", "w").close()
            t = time.time()
            while not os.path.exists(f"{bench['done']}.{r}") and proc.poll() is None:
                if time.time() - t > ARM_TIMEOUT_S:
                    proc.kill()
                    break
                time.sleep(0.05)
        write_partial(group, procs, r, done_before)
    results = []
    for i, (arm, bench, _, proc) in enumerate(procs):
        # One arm at a time: a profile arm traces alone on the GPU, then each engine shuts down before the next.
        open(f"{bench['go']}.end", "w").close()
        try:
            stdout, _ = proc.communicate(timeout=ARM_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill(); stdout = ""
        line = next((l for l in stdout.splitlines() if l.startswith("RESULT ")), None)
        res = {"model": group["model"], "arm": arm, "rc": proc.returncode, **(json.loads(line[7:]) if line else {})}
        res.update(summarize(finished_rounds(bench, ROUNDS)))
        if not line or proc.returncode not in (0, None):
            res["err"] = open(f"{tmp}/{i}.log").read()[-4000:]
        if bench.get("profile") and os.path.isdir(bench["profile"]):
            summary = subprocess.run([sys.executable, f"{HERE}/profile_summary.py", bench["profile"]], capture_output=True, text=True)
            res["profile"] = summary.stdout[-12000:] or summary.stderr[-2000:]
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k not in ("per_prompt", "profile", "rounds")})[:3000], flush=True)
    return results


def finished_rounds(bench, n):
    """The figures of an arm's rounds among the first `n` that finished (their done files), in round order."""
    return [json.load(open(f"{bench['done']}.{r}")) for r in range(n) if os.path.exists(f"{bench['done']}.{r}")]


def write_partial(group, procs, r, done_before):
    """After each round: every arm's ms/step so far, printed and in OUT/sglang_h200_step_cost.partial.json
    with the finished groups' results, so a run cut short (a device call's time limit) keeps its rounds."""
    arms = []
    for arm, bench, _, _ in procs:
        done = finished_rounds(bench, r + 1)
        arms.append({"model": group["model"], "arm": arm, "step_ms_rounds": [m["step_ms"] for m in done],
                     "tok_per_s_rounds": [m["tok_per_s"] for m in done]})
    print(f"round {r} of {group['model']}: " + ", ".join(
        f"{a['arm']} " + " ".join(f"{x:.2f}" for x in a["step_ms_rounds"]) + " ms/step" for a in arms), flush=True)
    partial = [{k: v for k, v in res.items() if k not in ("rounds",)} for res in done_before] + arms
    with open(f"{OUT}/sglang_h200_step_cost.partial.json", "w") as f:
        json.dump(partial, f, indent=1)


def summarize(rounds):
    """An arm's figures from its finished rounds: the median round's (the lower middle one for an even
    count), every round's ms/step, and the rounds themselves; {} when none finished."""
    if not rounds:
        return {}
    median = sorted(rounds, key=lambda m: m["step_ms"])[(len(rounds) - 1) // 2]
    return {**median, "step_ms_rounds": [m["step_ms"] for m in rounds], "rounds": rounds}


def lower_median(xs):
    return sorted(xs)[(len(xs) - 1) // 2]


def median_interval(each, resamples=4000, seed=0):
    """A 95 % bootstrap interval of the (lower) median of the per-round ratios: resample the rounds with
    replacement, take each resample's median, keep the 2.5th and 97.5th percentiles (a fixed seed, so a
    table is reproducible from its JSON)."""
    rng = random.Random(seed)
    meds = sorted(lower_median(rng.choices(each, k=len(each))) for _ in range(resamples))
    return meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def paired(r, base, key="tok_per_s"):
    """The median over rounds of r's figure over base's in the same round (rounds run arm after arm,
    so a round's pair shares the host's state of the moment), then the smallest and largest, and from
    5 rounds on the median's 95 % bootstrap interval; "-" unless both finished the same number of rounds."""
    mine, theirs = r.get("rounds") or [], (base or {}).get("rounds") or []
    if not mine or len(mine) != len(theirs) or any(key not in m for m in mine + theirs):
        return "-"
    each = sorted(a[key] / b[key] for a, b in zip(mine, theirs))
    interval = "; 95 % {:.3f}-{:.3f}".format(*median_interval(each)) if len(each) >= 5 else ""
    return f"{lower_median(each):.3f} ({each[0]:.2f}-{each[-1]:.2f}{interval})"


def ratios(results):
    """Per model a markdown table: each arm's median-round figures, the ratios to DFLASH, the median of
    the per-round tok/s ratios to DFLASH, every round's ms/step, and on real prompts whether its
    outputs equal the group's first arm's (all T = 0)."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        rows = {r["arm"]: r for r in results if r["model"] == model and "step_ms" in r}
        ref = rows.get("dflash-nograph") or rows.get("dflash")
        graphed = rows.get("dflash")
        first = next(r for r in results if r["model"] == model)  # the group's first arm, whether it ran or not
        lines.append(f"## {model}")
        lines.append("| arm | ms/step | tokens/step | tok/s | step vs dflash-nograph | step vs dflash (graphs) | tok/s vs dflash-nograph "
                     "| tok/s vs dflash (graphs) | tok/s vs dflash (graphs), median of rounds (range) "
                     "| step vs dflash (graphs), median of rounds (range) | the same, each round's quickest decode "
                     "| ms/step each round | outputs = first arm's |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for arm, r in rows.items():
            cells = [f"{r['step_ms']:.2f}", f"{r['tokens_per_step']:.2f}", f"{r['tok_per_s']:.1f}"]
            for base, key in ((ref, "step_ms"), (graphed, "step_ms"), (ref, "tok_per_s"), (graphed, "tok_per_s")):
                cells.append(f"{r[key] / base[key]:.3f}" if base else "-")
            cells.append(paired(r, graphed))
            cells.append(paired(r, graphed, "step_ms"))
            cells.append(paired(r, graphed, "step_ms_best"))  # dummy groups only
            cells.append(" ".join(f"{x:.2f}" for x in r["step_ms_rounds"]))
            mine, theirs = r.get("per_prompt"), first.get("per_prompt")
            same = [a["ids"] == b["ids"] for a, b in zip(mine, theirs)] if mine and theirs else []
            cells.append(f"{sum(same)}/{len(same)}" if same else "-")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


os.makedirs(OUT, exist_ok=True)
import atexit
TMP = os.environ.get("STEP_COST_TMP", "/tmp")  # where the arms' logs, signal files and traces go
atexit.register(lambda: subprocess.run(f"tar czf {OUT}/logs.tgz {TMP}/stepcost-* 2>/dev/null", shell=True))
all_results = []
for n, g in enumerate(GROUPS):
    tmp = f"{TMP}/stepcost-{g['model']}-{int(time.time())}-{n}"
    os.makedirs(tmp, exist_ok=True)
    all_results += run_group(g, tmp, all_results)
    json.dump(all_results, open(f"{OUT}/sglang_h200_step_cost.json", "w"), indent=1)
table = ratios(all_results)
open(f"{OUT}/sglang_h200_step_cost.md", "w").write(table + "\n")
print(table)
for r in all_results:
    if r.get("profile"):
        print(f"\n### profile {r['model']} {r['arm']}\n{r['profile']}")
