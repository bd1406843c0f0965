"""The `ddtree-engine` command: JSON and text output of generate, one clear message with exit 2 for bad
input, the help of every command, and the lab pair's note."""

from __future__ import annotations

import json
import math
import random
import shlex
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from repo_scripts import load_script

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


# ---- issue 16, point 10: honest, helpful output ------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [[], *([name] for name in cli.list_commands(None))]  # the group itself, then each command


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "ddtree-engine")
def test_every_help_has_runnable_examples_exit_codes_and_described_options(runner, path, tmp_path):
    res = invoke(runner, [*path, "--help"])
    assert res.exit_code == 0
    assert "Exit codes: 0 ok, 1 failed, 2 bad usage or a model that does not load." in res.output
    assert "Examples:" in res.output
    block = res.output.split("Examples:", 1)[1].split("Exit codes:", 1)[0]
    examples = [shlex.split(line) for line in block.splitlines() if line.strip().startswith("ddtree-engine ")]
    if path:  # a command's own examples run that command
        assert examples and all(argv[1] == path[0] for argv in examples), block
    for argv in examples:
        # Each example parses as written: real option names, valid choices and ranges. Model
        # directories other than `lab` are stood in for by empty ones (their callback checks isdir).
        args = argv[2:]
        for i, arg in enumerate(args[:-1]):
            if arg in ("--target", "--draft") and args[i + 1] != "lab":
                args[i + 1] = str(tmp_path / args[i + 1].strip("/."))
                Path(args[i + 1]).mkdir(parents=True, exist_ok=True)
        command = cli.commands[argv[1]]
        with command.make_context(argv[1], args) as ctx:
            assert ctx.params
    command = cli.commands[path[0]] if path else cli
    undescribed = [p.opts[0] for p in command.params if isinstance(p, click.Option) and not p.hidden and not p.help]
    assert undescribed == [], f"options without a description: {undescribed}"


def test_commands_are_listed_in_the_order_of_use(runner):
    listing = invoke(runner, ["--help"]).output.split("Commands:", 1)[1]
    assert [line.split()[0] for line in listing.strip().splitlines()[:3]] == ["generate", "serve", "make-tiny-pair"]


def test_chat_with_prompt_ids_is_a_usage_error_naming_both(runner, tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    res = invoke(runner, ["generate", "--target", str(target), "--draft", str(draft), "--device", "cpu",
                          "--chat", "--prompt-ids", "1,2,3"])
    assert res.exit_code == 2, res.output
    assert "--chat" in res.stderr and "--prompt-ids" in res.stderr
    assert res.stdout == ""


def test_text_output_shows_the_acceptance_of_every_verify_step(runner, tiny_pairs):
    target, draft = tiny_pairs["qwen3-next"]
    args = ["generate", "--target", str(target), "--draft", str(draft), "--algorithm", "ddtree", "--budget", "7",
            "--topk", "4", "--prompt-ids", "5,6,7", "--max-new-tokens", "20", "--device", "cpu", "--dtype", "float64"]
    doc = json.loads(invoke(runner, [*args, "--json"]).stdout)
    res = invoke(runner, args)
    assert res.exit_code == 0, res.output
    assert res.stdout == doc["text"] + "\n"  # stdout is the text alone, ready to pipe
    steps = doc["accepted_per_step"]
    assert len(steps) >= 2 and 1 + sum(steps) == len(doc["token_ids"])  # the prefill's token is in no step
    mean = sum(steps) / len(steps)
    assert res.stderr.splitlines()[-2:] == [
        f"{len(doc['token_ids'])} tokens (1 from the prefill), finish reason {doc['finish_reason']}",
        f"steps: {len(steps)}, accepted per step: {' '.join(map(str, steps))}, mean {mean:.2f} "
        "(committed tokens per verify step, prefill excluded)",
    ]


def test_acceptance_line_lists_the_first_steps_and_points_long_runs_to_json():
    from ddtree_engine.cli import STEPS_SHOWN, acceptance_line

    many = [(i % 7) + 1 for i in range(STEPS_SHOWN + 5)]
    line = acceptance_line(many)
    shown = " ".join(map(str, many[:STEPS_SHOWN]))
    assert line.startswith(f"steps: {len(many)}, accepted per step: {shown} … (+5 more")
    assert f"mean {sum(many) / len(many):.2f} " in line
    assert acceptance_line([]).startswith("steps: 0 ")


def test_json_is_indented_like_the_control_side(runner, tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    res = invoke(runner, ["generate", "--target", str(target), "--draft", str(draft), "--prompt-ids", "1,2",
                          "--max-new-tokens", "3", "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    assert res.stdout == json.dumps(json.loads(res.stdout), indent=2) + "\n"


def test_the_lab_pair_says_what_it_was_trained_on_and_other_targets_do_not(runner, tiny_pairs):
    from ddtree_engine.cli_options import LAB_PAIR_TEMPLATES

    res = invoke(runner, ["generate", "--target", "lab", "--draft", "lab", "--prompt", "def fib(n):",
                          "--max-new-tokens", "4", "--json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["token_ids"]) == 4  # the note never reaches the JSON on stdout
    notes = [line for line in res.stderr.splitlines() if line.startswith("note: the lab pair")]
    assert len(notes) == 1
    chat_hint = "; add --chat, it never saw a prompt outside a chat turn"
    assert all(t in notes[0] for t in LAB_PAIR_TEMPLATES) and notes[0].endswith(chat_hint)

    chat = invoke(runner, ["generate", "--target", "lab", "--draft", "lab", "--chat", "--prompt",
                           "What is 17+25? Answer with the number only.", "--max-new-tokens", "8"])
    assert chat.exit_code == 0, chat.output
    assert chat.stdout == "42\n"  # in its domain it answers
    assert chat.stderr.splitlines()[0] == notes[0].removesuffix(chat_hint)

    target, draft = tiny_pairs["qwen3"]
    other = invoke(runner, ["generate", "--target", str(target), "--draft", str(draft), "--prompt-ids", "1,2",
                            "--max-new-tokens", "2", "--device", "cpu"])
    assert other.exit_code == 0 and "note:" not in other.stderr


def _training_corpus():
    # training/ is a folder of scripts, not a package: load corpus.py by path, as training does.
    return load_script("training/corpus.py", "lab_training_corpus_cli")


def test_the_lab_note_matches_the_shipped_weights_and_the_training_corpus():
    from ddtree_engine.cli_options import LAB_PAIR_TEMPLATES, LAB_TARGET_PARAMS
    from ddtree_engine.reference.models import LAB_DIR
    from safetensors import safe_open

    # Trained parameters: the all-zero tensors of the identity layers the Qwen3.5 conversion
    # inserted (training/convert_lab_pair_qwen35.py) carry none.
    with safe_open(str(LAB_DIR / "target" / "model.safetensors"), "pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if f.get_tensor(k).any())
    assert LAB_TARGET_PARAMS == f"{params / 1e6:.1f}M"
    corpus = _training_corpus()
    assert len(LAB_PAIR_TEMPLATES) == len(corpus.FAMILIES)
    assert f"a paragraph on {len(corpus.TOPICS)} topics" in LAB_PAIR_TEMPLATES
    # The families the note names, in the generator's order: code, a+b, steps, JSON, prose.
    samples = [family(random.Random(0))[0] for family in corpus.FAMILIES]
    assert "Python function" in samples[0] and "Answer with the number only" in samples[1]
    assert "step by step" in samples[2] and "JSON" in samples[3] and "paragraph" in samples[4]


def test_loading_shows_no_progress_bar_and_restores_the_callers_hook(runner, tiny_pairs):
    from transformers.utils import logging as hf_logging

    seen = []

    def callers_hook(factory, args, kwargs):
        seen.append(kwargs)
        return factory(*args, **kwargs)

    hf_logging.set_tqdm_hook(callers_hook)
    try:
        target, draft = tiny_pairs["qwen3"]
        res = invoke(runner, ["generate", "--target", str(target), "--draft", str(draft), "--prompt-ids", "1,2",
                              "--max-new-tokens", "2", "--device", "cpu"])
        assert res.exit_code == 0, res.output
    finally:
        after = hf_logging.set_tqdm_hook(None)
    assert "Loading weights" not in res.stderr and "it/s" not in res.stderr, res.stderr
    # transformers did create its bar, disabled, through the caller's hook; the hook is back.
    assert any(k.get("desc") == "Loading weights" and k.get("disable") is True for k in seen), seen
    assert after is callers_hook
    assert hf_logging.is_progress_bar_enabled()
