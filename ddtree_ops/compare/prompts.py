"""The prompts `compare` sends: a built-in set, or a YAML/JSON file of the operator's own."""

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
    """The built-in set when `path` is None, else the prompts in a YAML or JSON file."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read prompts file {p}: {err.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {err}") from None
    return parse_prompts(data, str(p))
