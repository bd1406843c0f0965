"""Unit and env-file rendering: the role's own templates, rendered locally with jinja2."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.deploy.units import (
    env_file_quote,
    render_env_file,
    render_unit,
    serve_args,
    systemd_quote,
    unit_name,
    unit_spec,
)

UUID_A = "GPU-8f2b6c1e-0a4d-4f7e-9b1c-2d3e4f5a6b7c"
UUID_B = "GPU-11111111-2222-3333-4444-555555555555"


def project(**engine_overrides):
    return parse_project(
        {
            "hosts": [
                {"name": "gpu-1", "address": "10.0.0.1", "gpus": [UUID_A, UUID_B]},
                {"name": "cpu-1", "address": "10.0.0.2"},
            ],
            "engine": {"target": "/models/qwen", "draft": "/models/dflash", "block_size": 16, **engine_overrides},
            "services": [
                {"name": "baseline", "algorithm": "dflash", "port": 30000, "gpus": [0], "hosts": ["gpu-1"]},
                {
                    "name": "tree",
                    "algorithm": "ddtree",
                    "budget": 15,
                    "topk": 8,
                    "port": 30001,
                    "gpus": [1],
                    "hosts": ["gpu-1"],
                    "extra_args": ["--served-model-name", "qwen 27b"],
                },
                {
                    "name": "cpu-tree",
                    "algorithm": "ddtree",
                    "budget": 7,
                    "topk": 2,
                    "spine_depth": 3,
                    "port": 30002,
                    "hosts": ["cpu-1"],
                },
            ],
        }
    )


def spec_of(p, service_name, host_name, **kw):
    return unit_spec(p.service(service_name), p.host(host_name), p.engine, metrics_log_interval=32, **kw)


def test_unit_name_follows_the_host_layout():
    assert unit_name("tree") == "ddtree-tree.service"


def test_serve_args_pass_tree_settings_only_to_ddtree_services():
    p = project()
    tree = serve_args(p.service("tree"), p.engine, metrics_log_interval=16)
    assert tree[:7] == ["serve", "--target", "/models/qwen", "--draft", "/models/dflash", "--algorithm", "ddtree"]
    assert tree[tree.index("--budget") + 1] == "15" and tree[tree.index("--topk") + 1] == "8"
    assert tree[tree.index("--host") + 1] == "0.0.0.0"
    assert tree[tree.index("--port") + 1] == "30001"
    assert tree[tree.index("--metrics-log-interval") + 1] == "16"
    assert tree[-2:] == ["--served-model-name", "qwen 27b"]  # extra args last, verbatim
    assert "--spine-depth" not in tree  # 0 is the engine's default

    baseline = serve_args(p.service("baseline"), p.engine, metrics_log_interval=32)
    assert "--budget" not in baseline and "--topk" not in baseline
    assert baseline[baseline.index("--algorithm") + 1] == "dflash"

    spine = serve_args(p.service("cpu-tree"), p.engine, metrics_log_interval=32)
    assert spine[spine.index("--spine-depth") + 1] == "3"


def test_serve_args_pass_device_and_unsafe_mode_only_when_set():
    plain = serve_args(project().service("tree"), project().engine, metrics_log_interval=32)
    assert "--device" not in plain and "--dtype" not in plain and "--allow-hybrid-unsafe" not in plain
    p = project(device="cpu", dtype="float32", hybrid_mode="unsafe", allow_hybrid_unsafe=True)
    args = serve_args(p.service("tree"), p.engine, metrics_log_interval=32)
    assert args[args.index("--device") + 1] == "cpu"
    assert args[args.index("--dtype") + 1] == "float32"
    assert args[args.index("--hybrid-mode") + 1] == "unsafe" and "--allow-hybrid-unsafe" in args


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("--port", "--port"),
        ("/models/qwen", "/models/qwen"),
        ("qwen 27b", '"qwen 27b"'),
        ("50%", '"50%%"'),
        ("$HOME", '"$$HOME"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a\\b", '"a\\\\b"'),
    ],
)
def test_systemd_quote(arg, quoted):
    assert systemd_quote(arg) == quoted


def test_env_file_quote_escapes_and_refuses_newlines():
    assert env_file_quote('p"w\\d') == '"p\\"w\\\\d"'
    with pytest.raises(ConfigError):
        env_file_quote("two\nlines")


def test_gpu_pinning_by_uuid_in_pci_order():
    p = project()
    unit = render_unit(spec_of(p, "tree", "gpu-1"), "/opt/ddtree/envs/abc123")
    assert "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID\n" in unit
    assert f"Environment=CUDA_VISIBLE_DEVICES={UUID_B}\n" in unit  # index 1 → the second UUID
    assert UUID_A not in unit
    cpu_unit = render_unit(spec_of(p, "cpu-tree", "cpu-1"), "/opt/ddtree/envs/abc123")
    assert "CUDA_" not in cpu_unit


def test_gpu_index_without_host_uuids_is_a_config_error():
    p = project()
    service = p.service("tree")
    with pytest.raises(ConfigError, match="lists no GPU UUIDs"):
        unit_spec(service, p.host("cpu-1"), p.engine, metrics_log_interval=32)


def test_rendered_unit_follows_systemd_practice():
    unit = render_unit(spec_of(project(), "tree", "gpu-1"), "/opt/ddtree/envs/abc123")
    unit_section = unit.split("[Service]")[0]
    service_section = unit.split("[Service]")[1].split("[Install]")[0]
    # StartLimit* belong in [Unit]: systemd ignores them in [Service] on current versions.
    assert "StartLimitIntervalSec=" in unit_section and "StartLimitBurst=" in unit_section
    assert "After=network-online.target" in unit_section and "Wants=network-online.target" in unit_section
    assert "Restart=on-failure" in service_section
    assert "RestartSec=" in service_section
    timeout = int(service_section.split("TimeoutStartSec=")[1].split()[0])
    assert timeout >= 600, "model loads take minutes: the start timeout must be generous"
    assert "EnvironmentFile=/etc/ddtree/tree.env" in service_section
    assert "SyslogIdentifier=ddtree-tree" in service_section
    assert "\nCacheDirectory=ddtree/tree\n" in service_section, "compiled kernels outlive restarts (TRITON_CACHE_DIR)"
    exec_line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_line == (
        "ExecStart=/opt/ddtree/envs/abc123/bin/ddtree-engine serve --target /models/qwen --draft /models/dflash "
        "--algorithm ddtree --budget 15 --topk 8 --hybrid-mode safe --host 0.0.0.0 --port 30001 "
        '--metrics-log-interval 32 --served-model-name "qwen 27b"'
    )
    assert "WantedBy=multi-user.target" in unit
    assert "User=" not in unit
    assert "User=ddtree\n" in render_unit(
        spec_of(project(), "tree", "gpu-1"), "/opt/ddtree/envs/abc123", ddtree_deploy_service_user="ddtree"
    )


def test_env_file_holds_the_api_key_only_when_given():
    p = project()
    without = render_env_file(spec_of(p, "tree", "gpu-1"))
    assert "DDTREE_API_KEY" not in without
    assert 'DDTREE_SERVICE="tree"' in without
    with_key = render_env_file(spec_of(p, "tree", "gpu-1", api_key="s3cret$"))
    assert 'DDTREE_API_KEY="s3cret$"\n' in with_key
    unit = render_unit(spec_of(p, "tree", "gpu-1", api_key="s3cret$"), "/opt/ddtree/envs/abc123")
    assert "s3cret" not in unit, "secrets live only in the 0600 env file"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_rendered_unit_passes_systemd_analyze_verify(tmp_path):
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    engine = env / "bin" / "ddtree-engine"
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    unit_path = tmp_path / "ddtree-tree.service"
    unit_path.write_text(render_unit(spec_of(project(), "tree", "gpu-1"), str(env)))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit_path)], check=False, capture_output=True, text=True)
    complaints = [line for line in proc.stderr.splitlines() if "ddtree-tree.service" in line]
    assert proc.returncode == 0 and not complaints, proc.stderr

    # The same check catches a unit whose engine is missing (what the role relies on).
    unit_path.write_text(render_unit(spec_of(project(), "tree", "gpu-1"), str(tmp_path / "missing")))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit_path)], check=False, capture_output=True, text=True)
    assert proc.returncode != 0 and "not executable" in proc.stderr


def container_project():
    return project(install={"mode": "container"})


def test_container_unit_runs_the_engine_image_under_docker_with_gpus_by_uuid():
    p = container_project()
    unit = render_unit(spec_of(p, "tree", "gpu-1", api_key="s3cret"), "", image="ddtree-engine:0123456789abcdef")
    unit_section = unit.split("[Service]")[0]
    assert "Requires=docker.service" in unit_section and "After=docker.service" in unit_section
    exec_line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_line == (
        "ExecStart=/usr/bin/docker run --rm --name ddtree-tree --network host --init "
        "-e PYTHONUNBUFFERED -e HF_HUB_OFFLINE -e DDTREE_SERVICE -e TRITON_CACHE_DIR -e DDTREE_API_KEY "
        "-v /var/cache/ddtree/tree:/var/cache/ddtree/tree "
        f'--gpus "\\"device={UUID_B}\\"" '
        "-v /models/qwen:/models/qwen:ro -v /models/dflash:/models/dflash:ro "
        "ddtree-engine:0123456789abcdef serve --target /models/qwen --draft /models/dflash "
        "--algorithm ddtree --budget 15 --topk 8 --hybrid-mode safe --host 0.0.0.0 --port 30001 "
        '--metrics-log-interval 32 --served-model-name "qwen 27b"'
    )
    # Values reach the container by name from the unit's 0600 EnvironmentFile, never on a command line.
    assert "s3cret" not in unit and "EnvironmentFile=/etc/ddtree/tree.env" in unit
    assert "CUDA_VISIBLE_DEVICES" not in unit, "inside the container --gpus decides what CUDA sees"
    assert "ExecStartPre=-/usr/bin/docker rm -f ddtree-tree" in unit
    assert "ExecStop=-/usr/bin/docker stop -t 55 ddtree-tree" in unit, "a container already gone is no stop failure"
    assert "SuccessExitStatus=143" in unit
    assert "/opt/ddtree/envs" not in unit


def test_container_unit_gives_all_gpus_when_the_service_pins_none_and_none_on_a_cpu_host():
    from ddtree_ops.deploy.units import container_run_args

    p = container_project()
    unpinned = p.service("baseline").model_copy(update={"gpus": []})
    assert container_run_args(unpinned, p.host("gpu-1"), p.engine, [])[-6:-4] == ["--gpus", "all"]
    assert "--gpus" not in container_run_args(p.service("cpu-tree"), p.host("cpu-1"), p.engine, [])
    lab = project(install={"mode": "container"}, target="lab", draft="lab")
    lab_args = container_run_args(lab.service("cpu-tree"), lab.host("cpu-1"), lab.engine, [])
    assert [lab_args[i + 1] for i, a in enumerate(lab_args) if a == "-v"] == [
        "/var/cache/ddtree/cpu-tree:/var/cache/ddtree/cpu-tree"], "no model mounts for the engine's own lab pair"


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or shutil.which("docker") is None, reason="systemd-analyze or docker missing"
)
def test_container_unit_passes_systemd_analyze_verify(tmp_path):
    unit_path = tmp_path / "ddtree-cpu-tree.service"
    unit_path.write_text(render_unit(spec_of(container_project(), "cpu-tree", "cpu-1"), "", image="ddtree-engine:abc"))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit_path)], check=False, capture_output=True, text=True)
    complaints = [line for line in proc.stderr.splitlines() if "ddtree-cpu-tree.service" in line]
    assert proc.returncode == 0 and not complaints, proc.stderr
