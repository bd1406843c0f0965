"""Units of `engine.backend: sglang` services: stock SGLang's server with the DDTree plugin, from the env's Python.

The argv is checked exactly; the rendered units go through the real `systemd-analyze verify`; the launcher
that keeps the API key out of the command line runs in a real interpreter; and, where an interpreter with
sglang 0.5.23 is available, SGLang's own argument parser reads the argv back.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_ops.config import parse_project
from ddtree_ops.deploy import sglang_command
from ddtree_ops.deploy.sglang_command import COMMON_FLAGS, launcher, sglang_args
from ddtree_ops.deploy.units import container_run_args, render_env_file, render_unit, unit_spec
from ddtree_ops.exceptions import ConfigError

UUIDS = [f"GPU-{i}0000000-1111-2222-3333-44444444444{i}" for i in range(3)]
KEY = "sk-very-secret-key"
ENV = "/opt/ddtree/envs/0123abcd"


def project(**engine):
    return parse_project(
        {
            "hosts": [{"name": "gpu-1", "address": "10.0.0.1", "gpus": UUIDS}],
            "engine": {"backend": "sglang", "target": "/models/q35", "draft": "/models/q35-dflash", **engine},
            "services": [
                {"name": "baseline", "algorithm": "dflash", "port": 30000, "gpus": [0]},
                {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "spine_depth": 2, "port": 30001,
                 "gpus": [2], "extra_args": ["--served-model-name", "qwen 3.5"]},
                {"name": "ar", "algorithm": "ar", "port": 30002, "gpus": [1]},
            ],
        }
    )  # fmt: skip


def spec(p, name, **kw):
    return unit_spec(p.service(name), p.host("gpu-1"), p.engine, metrics_log_interval=32, **kw)


def exec_start(unit: str) -> str:
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))


def test_tree_service_argv_exactly():
    p = project()
    assert sglang_args(p.service("tree"), p.engine, host="0.0.0.0") == [
        "-c", launcher(),
        "--model-path", "/models/q35",
        "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", "/models/q35-dflash",
        "--speculative-ddtree-budget", "15",
        "--speculative-ddtree-topk", "8",
        "--speculative-ddtree-spine-depth", "2",
        "--speculative-ddtree-hybrid-mode", "safe",
        "--disable-overlap-schedule", "--attention-backend", "triton", "--page-size", "1", "--enable-metrics",
        "--host", "0.0.0.0", "--port", "30001",
        "--served-model-name", "qwen 3.5",
    ]  # fmt: skip


def test_baseline_and_ar_argv_exactly():
    p = project(dtype="bfloat16")
    assert sglang_args(p.service("baseline"), p.engine, host="0.0.0.0") == [
        "-c", launcher(), "--model-path", "/models/q35",
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/q35-dflash",
        *COMMON_FLAGS, "--dtype", "bfloat16", "--host", "0.0.0.0", "--port", "30000",
    ]  # fmt: skip
    ar = sglang_args(p.service("ar"), p.engine, host="0.0.0.0")
    assert not [a for a in ar if a.startswith("--speculative")], "ar runs the target alone"
    assert ar[ar.index("--port") + 1] == "30002"


def test_unsafe_hybrid_mode_passes_the_allow_flag():
    p = project(hybrid_mode="unsafe", allow_hybrid_unsafe=True)
    args = sglang_args(p.service("tree"), p.engine, host="0.0.0.0")
    at = args.index("--speculative-ddtree-hybrid-mode")
    assert args[at + 1 : at + 3] == ["unsafe", "--speculative-ddtree-allow-hybrid-unsafe"]
    assert "--speculative-ddtree-allow-hybrid-unsafe" not in sglang_args(p.service("baseline"), p.engine, host="h")


@pytest.mark.parametrize(
    ("engine", "message"),
    [({"device": "cpu"}, "runs on CUDA GPUs only"), ({"target": "lab"}, "engine.target is 'lab'"),
     ({"draft": "lab"}, "engine.draft is 'lab'")],
)  # fmt: skip
def test_settings_sglang_cannot_run_are_config_errors(engine, message):
    p = project(**engine)
    with pytest.raises(ConfigError, match=message):
        spec(p, "tree")


def test_unit_runs_the_env_python_pinned_by_uuid_with_the_key_only_in_the_env_file():
    p = project()
    for name, uuid in (("tree", UUIDS[2]), ("baseline", UUIDS[0])):
        s = spec(p, name, api_key=KEY)
        unit = render_unit(s, ENV)
        argv = shlex.split(exec_start(unit).removeprefix("ExecStart="))
        assert argv == [f"{ENV}/bin/python", *s.serve_args], "systemd reads back exactly the argv rendered"
        assert f"Environment=CUDA_VISIBLE_DEVICES={uuid}\n" in unit
        assert "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID\n" in unit
        assert [u for u in UUIDS if u != uuid and u in unit] == [], "only the service's own GPU"
        assert KEY not in unit and "--api-key" not in s.serve_args
        assert f'DDTREE_API_KEY="{KEY}"\n' in render_env_file(s)
        assert int(unit.split("TimeoutStartSec=")[1].split()[0]) >= 15 * 60, "model loads take minutes"
        assert "Restart=on-failure\n" in unit and f"EnvironmentFile=/etc/ddtree/{name}.env\n" in unit


def test_container_unit_runs_the_same_command_in_the_image():
    p = project(install={"mode": "container"})
    s = spec(p, "tree", api_key=KEY)
    unit = render_unit(s, "", image="ddtree-engine:0123456789abcdef")
    argv = shlex.split(exec_start(unit).removeprefix("ExecStart="))
    image_at = argv.index("ddtree-engine:0123456789abcdef")
    assert argv[image_at + 1 :] == s.serve_args, "the same SGLang arguments as the venv unit"
    assert argv[argv.index("--entrypoint") + 1] == "/opt/ddtree/env/bin/python"
    assert argv[argv.index("--gpus") + 1] == f'"device={UUIDS[2]}"'
    assert "DDTREE_API_KEY" in argv[: image_at] and KEY not in unit, "the key passes by name (-e NAME)"
    reference = project(backend="reference", install={"mode": "container"})
    assert "--entrypoint" not in container_run_args(reference.service("tree"), reference.host("gpu-1"), reference.engine, [])


def _fake_env(tmp_path: Path) -> Path:
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    python = env / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return env


def _verify(unit_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", str(unit_path)], check=False, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("service", ["tree", "baseline"])
def test_units_pass_systemd_analyze_verify(tmp_path, service):
    env = _fake_env(tmp_path)
    unit_path = tmp_path / f"ddtree-{service}.service"
    unit_path.write_text(render_unit(spec(project(), service, api_key=KEY), str(env)))
    proc = _verify(unit_path)
    complaints = [line for line in proc.stderr.splitlines() if unit_path.name in line]
    assert proc.returncode == 0 and not complaints, proc.stderr
    # The same check catches a broken ExecStart: an unbalanced quote in the launcher's argument.
    broken = unit_path.read_text().replace('-c "import', '-c "import "', 1)
    unit_path.write_text(broken)
    proc = _verify(unit_path)
    assert proc.returncode != 0 or [line for line in proc.stderr.splitlines() if unit_path.name in line], proc.stderr


def test_launcher_adds_the_key_from_the_environment_inside_the_process(tmp_path):
    """The real interpreter runs the launcher on a probe module that reports its argv and its command line."""
    # Into a file: its stdout goes through the launcher's redacting pump, which would hide the key it reports.
    report = tmp_path / "seen.json"
    (tmp_path / "argv_probe.py").write_text(
        "import json, sys\n"
        "cmdline = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        f"open({str(report)!r}, 'w').write(json.dumps("
        "{'argv': sys.argv[1:], 'cmdline': [c.decode() for c in cmdline if c], 'name': __name__}))\n"
    )
    program = launcher(module="argv_probe")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "DDTREE_API_KEY": KEY}
    subprocess.run([sys.executable, "-c", program, "--port", "1"], env=env, capture_output=True, text=True, check=True)
    import json

    seen = json.loads(report.read_text())
    assert seen["argv"] == ["--api-key", KEY, "--port", "1"] and seen["name"] == "__main__"
    assert not [c for c in seen["cmdline"] if KEY in c], "the key must not be on the process's command line"
    env.pop("DDTREE_API_KEY")
    subprocess.run([sys.executable, "-c", program, "--port", "1"], env=env, capture_output=True, text=True, check=True)
    assert json.loads(report.read_text())["argv"] == ["--port", "1"], "no key set: no --api-key"


# Logs its arguments the way SGLang does (ServerArgs with api_key, through logging), prints them, writes the key
# split over two writes, has a spawned child print it, then dies by SIGKILL (no atexit, no flush of its own).
LEAKY_SERVER = """
import logging, multiprocessing, os, signal, sys, time

def child(key):
    print("child process got", key, flush=True)

if __name__ == "__main__":
    key = sys.argv[sys.argv.index("--api-key") + 1]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("sglang.srt.server_args").info("server_args=ServerArgs(api_key=%r, port=1)", key)
    print("argv", sys.argv[1:], flush=True)
    sys.stderr.write("split " + key[:5]); sys.stderr.flush(); time.sleep(0.5)  # the pump reads it alone
    sys.stderr.write(key[5:] + " end\\n"); sys.stderr.flush()
    proc = multiprocessing.get_context("spawn").Process(target=child, args=(key,)); proc.start(); proc.join()
    print("last words before SIGKILL", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_launcher_keeps_the_key_out_of_the_output_of_the_server_and_its_children(tmp_path):
    """What SGLang does at startup (log ServerArgs with the key) reaches the journal with the key redacted."""
    (tmp_path / "leaky_server.py").write_text(LEAKY_SERVER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "DDTREE_API_KEY": KEY}
    proc = subprocess.run([sys.executable, "-c", launcher(module="leaky_server"), "--port", "1"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == -9, out
    assert KEY not in out, out
    assert "server_args=ServerArgs(api_key='<redacted>', port=1)" in proc.stderr
    assert "split <redacted> end" in proc.stderr, "a key split over two writes is still caught"
    assert "child process got <redacted>" in proc.stdout, "spawned children write through the same pump"
    assert "last words before SIGKILL" in proc.stdout, "a killed server's last lines still reach the journal"
    env.pop("DDTREE_API_KEY")
    plain = subprocess.run([sys.executable, "-c", launcher(module="leaky_server"), "--api-key", "visible"], env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "api_key='visible'" in plain.stderr, "no key in the environment: nothing to redact, output untouched"


def _sglang_python() -> str | None:
    # An interpreter with sglang installed: $DDTREE_SGLANG_PYTHON, else this one when it has sglang.
    explicit = os.environ.get("DDTREE_SGLANG_PYTHON")
    if explicit:
        return explicit
    return sys.executable if importlib.util.find_spec("sglang") else None


PARSE_WITH_SGLANG = """
import argparse, json, sys
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
load_plugins()  # what launch_server does first: the DDTree plugin registers its flags here
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = []
for argv in json.loads(sys.argv[1]):
    ns = parser.parse_args(argv)
    parsed = {k: v for k, v in vars(ns).items() if k in json.loads(sys.argv[2])}
    if ns.speculative_algorithm == "DDTREE":
        # The plugin's own startup validation (what SGLang runs for the registered algorithm).
        from ddtree_engine.sglang_plugin.spec import check_ddtree_settings
        try:
            check_ddtree_settings(ServerArgs.from_cli_args(ns))
            parsed["ddtree_validation"] = "ok"
        except ValueError as exc:
            parsed["ddtree_validation"] = str(exc)
    out.append(parsed)
print(json.dumps(out))
"""
KEYS = ["model_path", "speculative_algorithm", "speculative_draft_model_path", "disable_overlap_schedule", "disable_cuda_graph",
        "attention_backend", "page_size", "enable_metrics", "host", "port", "api_key", "served_model_name",
        "speculative_ddtree_budget", "speculative_ddtree_topk", "speculative_ddtree_spine_depth",
        "speculative_ddtree_hybrid_mode"]  # fmt: skip


@pytest.mark.skipif(_sglang_python() is None, reason="no interpreter with sglang here (set $DDTREE_SGLANG_PYTHON)")
def test_sglangs_own_parser_reads_the_rendered_argv():
    """SGLang 0.5.23's ServerArgs parser (with the installed plugins loaded) takes the argv as rendered,
    plus what the launcher inserts. The tree's flags need the DDTree plugin's entry point in that env."""
    import json

    p = project()
    argvs = [["--api-key", KEY, *sglang_args(p.service(n), p.engine, host="0.0.0.0")[2:]] for n in ("baseline", "tree")]
    out = subprocess.run(
        [_sglang_python(), "-c", PARSE_WITH_SGLANG, json.dumps(argvs), json.dumps(KEYS)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    baseline, tree = json.loads(out.stdout.strip().splitlines()[-1])
    common = {"model_path": "/models/q35", "speculative_draft_model_path": "/models/q35-dflash",
              "disable_overlap_schedule": True, "attention_backend": "triton", "page_size": 1, "enable_metrics": True,
              "host": "0.0.0.0", "api_key": KEY}  # fmt: skip
    linear = {k: v for k, v in baseline.items() if not k.startswith("speculative_ddtree")}  # the plugin's defaults
    # Both keep SGLang's CUDA graphs (the plugin captures a tree-masked verify).
    assert linear == {**common, "speculative_algorithm": "DFLASH", "port": 30000, "served_model_name": None,
                      "disable_cuda_graph": False}  # fmt: skip
    assert tree == {**common, "speculative_algorithm": "DDTREE", "port": 30001, "served_model_name": "qwen 3.5",
                    "speculative_ddtree_budget": 15, "speculative_ddtree_topk": 8, "speculative_ddtree_spine_depth": 2,
                    "speculative_ddtree_hybrid_mode": "safe", "disable_cuda_graph": False,
                    "ddtree_validation": "ok"}  # fmt: skip


def test_launcher_program_has_nothing_systemd_would_expand():
    assert "$" not in launcher() and "%" not in launcher()
    assert sglang_command.SGLANG_MODULE in launcher()


def test_deploy_warns_when_unpinned_sglang_services_would_share_gpu_0():
    from ddtree_ops.deploy.plan import plan_deploy

    assert not [w for w in plan_deploy(project()).warnings if "pin no GPU" in w]
    unpinned = project().model_copy(
        update={"services": [s.model_copy(update={"gpus": []}) if s.name != "ar" else s for s in project().services]}
    )
    warnings = [w for w in plan_deploy(unpinned).warnings if "pin no GPU" in w]
    assert warnings == [
        "host 'gpu-1': services 'baseline', 'tree' pin no GPU, so SGLang puts each on the host's first GPU: "
        "give each its own with services[].gpus"
    ]
