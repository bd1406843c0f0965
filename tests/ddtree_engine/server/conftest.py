"""Server-test fixtures: one real tiny engine, and helpers to read SSE and Prometheus text."""

from __future__ import annotations

import json

import pytest
from ddtree_engine.reference.engine import load_engine
from ddtree_engine.types import SpeculativeConfig
from prometheus_client.parser import text_string_to_metric_families

BUDGET, TOPK = 15, 8


@pytest.fixture(scope="session")
def qwen3_pair(tiny_pairs):
    return tiny_pairs["qwen3"]


@pytest.fixture(scope="session")
def server_engine(qwen3_pair):
    """A ddtree engine the server tests own (the shared `engines` fixture gets mutated by others)."""
    target, draft = qwen3_pair
    return load_engine(
        str(target), str(draft), SpeculativeConfig("ddtree", BUDGET, TOPK), device="cpu", dtype="float32"
    )


def sse_events(body: str) -> list:
    """The `data:` payloads of an SSE body, JSON-decoded except the final `[DONE]`."""
    events = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), f"not an SSE data event: {block!r}"
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric_values(text: str) -> dict[str, float]:
    """{sample name: value} as prometheus_client's own parser reads the text (one series per metric here)."""
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


# Test modules run under --import-mode=importlib and cannot import this file: hand out the helpers.
@pytest.fixture(scope="session")
def parse_sse():
    return sse_events


@pytest.fixture(scope="session")
def parse_metrics():
    return metric_values
