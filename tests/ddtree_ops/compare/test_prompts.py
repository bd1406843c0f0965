import json

import pytest

from ddtree_ops.exceptions import ConfigError
from ddtree_ops.compare.prompts import (
    BUILTIN_PROMPTS,
    HELDOUT_NOVEL_PROMPTS,
    HELDOUT_TEMPLATE_PROMPTS,
    PROMPT_SETS,
    load_prompts,
    parse_prompts,
)


def test_builtin_set_covers_what_operators_test():
    names = [p.name for p in BUILTIN_PROMPTS]
    assert len(set(names)) == len(names)
    text = " ".join(p.messages[0]["content"] for p in BUILTIN_PROMPTS).lower()
    for needle in ("fibonacci", "2+2", "json", "paragraph"):
        assert needle in text
    assert all(p.messages[0]["role"] == "user" for p in BUILTIN_PROMPTS)
    assert load_prompts(None) == list(BUILTIN_PROMPTS)


def test_yaml_strings_and_mappings(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("- What is 3+4?\n- name: fib\n  prompt: Write fib in Rust.\n")
    prompts = load_prompts(f)
    assert [p.name for p in prompts] == ["p0-what-is-3-4", "fib"]
    assert prompts[1].messages == ({"role": "user", "content": "Write fib in Rust."},)


def test_json_file(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps([{"name": "a", "prompt": "hello"}, "bye"]))
    assert [p.messages[0]["content"] for p in load_prompts(f)] == ["hello", "bye"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"a": 1}, "expected a non-empty list"),
        ([], "expected a non-empty list"),
        (["ok", 3], r"item \[1\] is a int"),
        ([{"prompt": "x", "tokens": 3}], r"item \[0\] has unknown key\(s\) \['tokens'\]"),
        ([{"name": "x"}], r"item \[0\]\.prompt must be a non-empty string"),
        (["  "], r"item \[0\] is an empty prompt"),
        ([{"name": "a", "prompt": "x"}, {"name": "a", "prompt": "y"}], r"item \[1\]\.name 'a' appears twice"),
    ],
)
def test_bad_documents_name_the_item(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_prompts(data, "p.yaml")


def test_unparsable_and_missing_files(tmp_path):
    f = tmp_path / "p.json"
    f.write_text("[1,")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_prompts(f)
    with pytest.raises(ConfigError, match="cannot read prompts file"):
        load_prompts(tmp_path / "nope.yaml")


def test_builtin_sets_by_name(tmp_path, monkeypatch):
    assert load_prompts("builtin") == list(BUILTIN_PROMPTS)
    assert load_prompts("heldout-templates") == list(HELDOUT_TEMPLATE_PROMPTS)
    assert load_prompts("heldout-novel") == list(HELDOUT_NOVEL_PROMPTS)
    heldout = load_prompts("heldout")
    assert heldout == list(HELDOUT_TEMPLATE_PROMPTS + HELDOUT_NOVEL_PROMPTS)
    assert len({p.name for p in heldout}) == len(heldout) >= 10
    assert all(len(p.messages) == 1 and p.messages[0]["role"] == "user" for p in heldout)
    # A set name means the set even beside a file of that name; "./heldout" reaches the file.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "heldout").write_text("- mine\n")
    assert load_prompts("heldout") == heldout
    assert [p.messages[0]["content"] for p in load_prompts("./heldout")] == ["mine"]


def test_unknown_name_lists_the_sets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sets = ", ".join(PROMPT_SETS)
    with pytest.raises(ConfigError, match=f"cannot read prompts file held-out: .*built-in sets: {sets}"):
        load_prompts("held-out")
