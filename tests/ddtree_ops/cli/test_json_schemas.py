"""One schema family for every `--json` document: the shipped schemas are valid, every command that
takes --json has one, and real documents (here: doctor, lab, the error shape; deploy, rollback,
undeploy, healthcheck and compare in their own tests and the lab tests) validate against them."""

from __future__ import annotations

import json
import shutil

import click
import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from json_schemas import schema_files, schema_name, validate

from ddtree_ops.cli import cli


def _json_commands(group: click.Group, prefix: str = "") -> list[str]:
    names = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            names += _json_commands(command, f"{prefix}{name} ")
        elif any(p.name == "json_" for p in command.params):
            names.append(prefix + name)
    return names


def test_every_shipped_schema_is_a_valid_json_schema():
    files = schema_files()
    assert "common.json" in files
    for name, schema in files.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$id"].endswith("/" + name), name


def test_every_command_with_json_output_has_a_schema():
    commands = _json_commands(cli)
    assert {"deploy", "rollback", "undeploy", "healthcheck", "compare", "doctor", "lab up", "lab status", "lab down", "provision"} <= set(commands)
    missing = [c for c in commands if schema_name(c) not in schema_files()]
    assert missing == [], f"commands with --json but no schema in ddtree_ops/schemas/: {missing}"


def test_the_envelope_is_enforced(tmp_path):
    good = {"ok": True, "command": "lab down", "warnings": [], "failures": [], "lab_dir": "/x", "lab_id": "x-1", "removed": []}
    validate(good)
    for broken in ({**good, "failures": ["a bare string"]}, {k: v for k, v in good.items() if k != "warnings"},
                   {**good, "failure": "old key", "ok": "yes"}):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)


def test_doctor_json_is_the_envelope_with_one_failure_per_failed_check(tmp_path):
    config = tmp_path / "ddtree.yaml"
    config.write_text(yaml.safe_dump({
        "hosts": [{"name": "closed", "address": "127.0.0.1", "ssh": {"port": 9}}],
        "engine": {"target": "lab", "draft": "lab"},
        "services": [{"name": "baseline", "algorithm": "dflash", "port": 30000}],
    }))  # fmt: skip
    result = CliRunner().invoke(cli, ["-c", str(config), "doctor", "--json", "--no-manifest"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    doc = validate(json.loads(result.stdout))
    assert doc["command"] == "doctor" and doc["ok"] is False
    failed = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [(f["host"], f["message"]) for f in doc["failures"]] == [
        (None if c["scope"] == "control" else c["scope"], f"{c['name']}: {c['detail']}") for c in failed
    ]
    assert ("closed", "reachable") in {(f["host"], f["message"].split(":")[0]) for f in doc["failures"]}


def test_usage_errors_of_nested_commands_are_the_error_document():
    result = CliRunner().invoke(cli, ["lab", "up", "--hosts", "99", "--json"], catch_exceptions=False)
    assert result.exit_code == 2
    doc = validate(json.loads(result.stdout))
    assert (doc["command"], doc["error"]["kind"], doc["error"]["exit_code"]) == ("lab up", "usage", 2)
    assert "--hosts" in doc["error"]["message"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="lab status asks Docker")
def test_lab_status_json_has_ok_and_the_envelope(tmp_path):
    result = CliRunner().invoke(cli, ["lab", "status", "--dir", str(tmp_path / "no-lab"), "--json"], catch_exceptions=False)
    if result.exit_code != 0:
        pytest.skip(f"Docker is not usable here: {result.output}")
    doc = validate(json.loads(result.stdout))
    assert doc["ok"] is True and doc["command"] == "lab status" and doc["hosts"] == []
