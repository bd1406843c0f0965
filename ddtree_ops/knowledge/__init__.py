"""Versioned facts (YAML, each with its source): SGLang releases and CUDA rules (the resolver applies them), and
the environment variables the engine reads (a service's `env:` is checked against them)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

KNOWLEDGE_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """The parsed knowledge file `<name>.yaml` (cached; treat it as read-only)."""
    with open(KNOWLEDGE_DIR / f"{name}.yaml") as fh:
        return yaml.safe_load(fh)


def releases() -> dict:
    return load("sglang_releases")


def cuda() -> dict:
    return load("cuda")


def engine_env() -> dict:
    return load("engine_env")
