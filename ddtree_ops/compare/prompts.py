"""The prompts `compare` sends: a built-in set (PROMPT_SETS), or a YAML/JSON file of the operator's own."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..exceptions import ConfigError


@dataclass(frozen=True)
class Prompt:
    name: str
    messages: tuple[dict[str, str], ...]  # OpenAI chat messages

    def to_dict(self) -> dict:
        return {"name": self.name, "messages": [dict(m) for m in self.messages]}


def _user(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


# What operators paste into a chat window to see whether speculation helps: code, arithmetic,
# structured output and free prose (drafters accept very differently on each).
BUILTIN_PROMPTS: tuple[Prompt, ...] = (
    Prompt("code", _user("Write a Python function fibonacci(n) that returns the n-th Fibonacci number iteratively.")),
    Prompt("arith-short", _user("What is 2+2? Answer with the number only.")),
    Prompt("arith-steps", _user("Compute 17 + 25 + 38 + 12 step by step, then give the total.")),
    Prompt(
        "json",
        _user(
            'Parse this JSON and return it with the age increased by one, as JSON only: '
            '{"name": "Ada", "age": 36, "languages": ["en", "fr"]}'
        ),
    ),
    Prompt("prose", _user("Write a short paragraph about why the sea looks blue.")),
)

# The lab pair (training/corpus.py) was trained on prompts drawn from the same five templates as
# BUILTIN_PROMPTS, and `code` and `prose` above occur in its corpus hundreds of times, so the
# built-in set measures the lab pair in distribution. Two held-out sets measure it outside
# (tests/ddtree_engine/test_lab_heldout.py regenerates the shipped corpus and checks both):
#
# - HELDOUT_TEMPLATE_PROMPTS: the corpus's own prompt templates with values its 40 000 samples
#   never drew: number pairs, terms and JSON documents the generator can produce but did not,
#   and function names or prose topics outside its closed lists;
# - HELDOUT_NOVEL_PROMPTS: the same four kinds of task (code, arithmetic, structured output,
#   prose) and a few others, worded so that no training template generates them.
HELDOUT_TEMPLATE_PROMPTS: tuple[Prompt, ...] = (
    Prompt("tmpl-code-new-fn", _user("Write a Python function min_value that returns the smallest number in a list.")),
    Prompt(
        "tmpl-code-new-desc", _user("Implement a Python function factorial that returns the factorial of n recursively.")
    ),
    Prompt("tmpl-arith-short", _user("What is 58+31? Answer with the number only.")),
    Prompt("tmpl-arith-short-2", _user("What is 6+94? Answer with the number only.")),
    Prompt("tmpl-arith-steps", _user("Compute 23 + 41 + 7 + 55 step by step, then give the total.")),
    Prompt("tmpl-arith-steps-2", _user("Compute 14 + 59 + 33 step by step, then give the total.")),
    Prompt(
        "tmpl-json",
        _user(
            'Parse this JSON and return it with the age increased by one, as JSON only: '
            '{"name": "Grace", "age": 52, "languages": ["de", "ja"]}'
        ),
    ),
    Prompt(
        "tmpl-json-new-name",
        _user(
            'Parse this JSON and return it with the age increased by one, as JSON only: '
            '{"name": "Tim", "age": 29, "languages": ["en", "nl"]}'
        ),
    ),
    Prompt("tmpl-prose-moon", _user("Write a short paragraph about why the moon changes shape.")),
    Prompt("tmpl-prose-dogs", _user("Write a short paragraph about why dogs wag their tails.")),
)

HELDOUT_NOVEL_PROMPTS: tuple[Prompt, ...] = (
    Prompt("novel-code-js", _user("Write a JavaScript function that reverses a string.")),
    Prompt("novel-code-sql", _user("Write a SQL query that returns all users older than 30.")),
    Prompt("novel-arith-times", _user("What is 12 times 7?")),
    Prompt("novel-arith-primes", _user("List three prime numbers greater than 50.")),
    Prompt("novel-json-book", _user("Give me a JSON object describing a book with a title and an author.")),
    Prompt("novel-json-csv", _user("Convert this CSV row to JSON: name,age,city / Bob,41,Lyon")),
    Prompt("novel-prose-hash", _user("Explain in two sentences what a hash table is.")),
    Prompt("novel-prose-haiku", _user("Write a haiku about autumn leaves.")),
    Prompt("novel-translate", _user("Translate 'good morning' into French.")),
    Prompt("novel-summary", _user("Summarise the plot of Romeo and Juliet in one sentence.")),
)

# The sets `load_prompts` knows by name. "heldout" is both held-out sets, templates first.
PROMPT_SETS: dict[str, tuple[Prompt, ...]] = {
    "builtin": BUILTIN_PROMPTS,
    "heldout-templates": HELDOUT_TEMPLATE_PROMPTS,
    "heldout-novel": HELDOUT_NOVEL_PROMPTS,
    "heldout": HELDOUT_TEMPLATE_PROMPTS + HELDOUT_NOVEL_PROMPTS,
}

_NAME_OK = re.compile(r"[^A-Za-z0-9_.-]+")


def _default_name(index: int, text: str) -> str:
    words = _NAME_OK.sub("-", text.strip().lower())[:24].strip("-")
    return f"p{index}-{words}" if words else f"p{index}"


def parse_prompts(data: object, source: str) -> list[Prompt]:
    """Turn a parsed prompts document into prompts.

    Args:
        data: a list whose items are strings or mappings {name, prompt}.
        source: the file name, for error messages.

    Raises:
        ConfigError: naming the item and what to fix.
    """
    if not isinstance(data, list) or not data:
        raise ConfigError(
            f"{source}: expected a non-empty list of prompts (strings, or mappings with 'name' and 'prompt')"
        )
    prompts: list[Prompt] = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            if not item.strip():
                raise ConfigError(f"{source}: item [{i}] is an empty prompt: remove it or give it text")
            prompts.append(Prompt(_default_name(i, item), _user(item)))
        elif isinstance(item, dict):
            unknown = set(item) - {"name", "prompt"}
            if unknown:
                raise ConfigError(
                    f"{source}: item [{i}] has unknown key(s) {sorted(unknown)}: only 'name' and 'prompt' are allowed"
                )
            text = item.get("prompt")
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(f"{source}: item [{i}].prompt must be a non-empty string")
            name = item.get("name", _default_name(i, text))
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"{source}: item [{i}].name must be a non-empty string")
            prompts.append(Prompt(name.strip(), _user(text)))
        else:
            raise ConfigError(
                f"{source}: item [{i}] is a {type(item).__name__}; use a string or a mapping with 'name' and 'prompt'"
            )
    seen: set[str] = set()
    for i, p in enumerate(prompts):
        if p.name in seen:
            raise ConfigError(f"{source}: item [{i}].name {p.name!r} appears twice; prompt names must be unique")
        seen.add(p.name)
    return prompts


def load_prompts(path: str | Path | None) -> list[Prompt]:
    """The prompts `compare` sends.

    Args:
        path: None for the built-in set; a set name from PROMPT_SETS ("builtin", "heldout",
            "heldout-templates", "heldout-novel"), which wins over a file of the same name
            (write "./heldout" for the file); else a YAML or JSON file (see parse_prompts).

    Returns:
        The prompts, in order.

    Raises:
        ConfigError: the file cannot be read or parsed, or its items are invalid.
    """
    if path is None:
        return list(BUILTIN_PROMPTS)
    if isinstance(path, str) and path in PROMPT_SETS:
        return list(PROMPT_SETS[path])
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(
            f"cannot read prompts file {p}: {err.strerror} (built-in sets: {', '.join(PROMPT_SETS)})"
        ) from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {err}") from None
    return parse_prompts(data, str(p))
