"""The `ddtree-engine` command: JSON output of generate, and one clear message with exit 2 for bad input."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from ddtree_engine.cli import cli


@pytest.fixture()
def runner():
    return CliRunner()


def invoke(runner, args):
    return runner.invoke(cli, args, catch_exceptions=False)


def test_generate_json_matches_between_algorithms(runner, tiny_pairs):
    target, draft = tiny_pairs["qwen3-next"]
    outs = {}
    for algorithm in ("ar", "dflash", "ddtree"):
        res = invoke(runner, ["generate", "--target", str(target), "--draft", str(draft), "--algorithm", algorithm,
                              "--budget", "15", "--topk", "8", "--prompt-ids", "1,2,3", "--max-new-tokens", "12",
                              "--device", "cpu", "--dtype", "float64", "--json"])
        assert res.exit_code == 0, res.output
        outs[algorithm] = json.loads(res.stdout)
    for doc in outs.values():
        assert {"token_ids", "text", "steps", "accepted_per_step"} <= doc.keys()
        assert len(doc["token_ids"]) == 12 and doc["steps"] == len(doc["accepted_per_step"])
    assert outs["ar"]["token_ids"] == outs["dflash"]["token_ids"] == outs["ddtree"]["token_ids"]


def test_generate_with_lab_names_and_text_prompt(runner):
    res = invoke(runner, ["generate", "--target", "lab", "--draft", "lab", "--prompt", "def fib(n):",
                          "--max-new-tokens", "4", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["token_ids"]) == 4


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--budget", "-1"], "--budget"),
        (["--topk", "0"], "--topk"),
        (["--hybrid-mode", "unsafe"], "--allow-hybrid-unsafe"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--prompt-ids", "1,x"], "--prompt-ids"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(runner, tiny_pairs, extra, needle):
    target, draft = tiny_pairs["qwen3"]
    args = ["generate", "--target", str(target), "--draft", str(draft), "--device", "cpu"]
    if "--prompt-ids" not in extra:
        args += ["--prompt-ids", "1,2"]
    res = invoke(runner, args + extra)
    assert res.exit_code == 2
    assert needle in res.output
    assert "Traceback" not in res.output


def test_missing_and_malformed_model_directories(runner, tiny_pairs, tmp_path):
    target, draft = tiny_pairs["qwen3"]
    res = invoke(runner, ["generate", "--target", str(tmp_path / "nope"), "--draft", str(draft), "--prompt-ids", "1"])
    assert res.exit_code == 2 and "is not a directory" in res.output and "--target" in res.output
    broken = tmp_path / "broken"
    shutil.copytree(target, broken)
    (broken / "config.json").write_text("{not json")
    res = invoke(runner, ["generate", "--target", str(broken), "--draft", str(draft), "--prompt-ids", "1"])
    assert res.exit_code == 2 and "not valid JSON" in res.output


def test_drafter_that_does_not_fit_the_target(runner, tiny_pairs, tmp_path):
    target, draft = tiny_pairs["qwen3"]
    wrong = tmp_path / "wrong-draft"
    shutil.copytree(draft, wrong)
    config = json.loads((wrong / "config.json").read_text())
    config["vocab_size"] = 999
    (wrong / "config.json").write_text(json.dumps(config))
    res = invoke(runner, ["generate", "--target", str(target), "--draft", str(wrong), "--prompt-ids", "1"])
    assert res.exit_code == 2 and "vocabulary size 999" in res.output
    config["vocab_size"], config["hidden_size"] = 260, 32
    (wrong / "config.json").write_text(json.dumps(config))
    res = invoke(runner, ["generate", "--target", str(target), "--draft", str(wrong), "--prompt-ids", "1"])
    assert res.exit_code == 2 and "hidden size 32" in res.output


def test_block_size_below_two_is_refused(runner, tmp_path):
    res = invoke(runner, ["make-tiny-pair", str(tmp_path / "p"), "--block-size", "1"])
    assert res.exit_code == 2 and "--block-size" in res.output


def test_make_tiny_pair_writes_loadable_pairs(runner, tmp_path):
    res = invoke(runner, ["make-tiny-pair", str(tmp_path / "p"), "--arch", "qwen3", "--seed", "3"])
    assert res.exit_code == 0, res.output
    for sub in ("target", "draft"):
        assert (tmp_path / "p" / sub / "config.json").exists()
        assert (tmp_path / "p" / sub / "model.safetensors").exists()
    assert (tmp_path / "p" / "target" / "tokenizer.json").exists()
