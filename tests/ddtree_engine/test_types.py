"""The neutral types module: the reference engine satisfies the `Engine` Protocol (checked at
runtime and by signature, so a renamed member fails here), and the server and the CLI load
neither torch nor the Hugging Face backend just to know these types."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from ddtree_engine.reference.engine import ReferenceEngine
from ddtree_engine.types import ENGINE_MEMBERS, Engine, SamplingParams, Tokenizer, missing_engine_members

# The /server_info fields every backend must report (the server contract in the README).
CONTRACT_INFO_KEYS = {
    "speculative_algorithm",
    "speculative_ddtree_budget",
    "speculative_ddtree_topk",
    "speculative_num_draft_tokens",
    "model_path",
    "version",
}


class _Without:
    """The real engine with one member hidden."""

    def __init__(self, engine, hidden: str) -> None:
        self._engine, self._hidden = engine, hidden

    def __getattr__(self, name):
        if name == self._hidden:
            raise AttributeError(name)
        return getattr(self._engine, name)


def test_the_reference_engine_is_an_engine(engines):
    engine = engines["qwen3"]
    assert isinstance(engine, Engine)
    assert isinstance(engine.tokenizer, Tokenizer)
    assert missing_engine_members(engine) == []
    # Every Protocol member is required: hiding any one of them makes the engine not an Engine.
    for member in ENGINE_MEMBERS:
        stand_in = _Without(engine, member)
        assert not isinstance(stand_in, Engine), member
        assert missing_engine_members(stand_in) == [member]


def test_engine_members_are_the_ones_the_server_calls():
    assert set(ENGINE_MEMBERS) == {"tokenizer", "generate", "chat_prompt_ids", "server_info"}


@pytest.mark.parametrize("method", ["generate", "chat_prompt_ids", "server_info"])
def test_reference_engine_methods_take_the_protocols_parameters(method):
    # isinstance only checks that the names exist; the server calls by keyword (on_tokens=...).
    want = list(inspect.signature(getattr(Engine, method)).parameters)
    got = list(inspect.signature(getattr(ReferenceEngine, method)).parameters)
    assert got == want, f"ReferenceEngine.{method}{got} vs Engine.{method}{want}"


def test_server_info_carries_the_contract_fields(engines):
    info = engines["qwen3"].server_info()
    assert CONTRACT_INFO_KEYS <= set(info), CONTRACT_INFO_KEYS - set(info)


def test_the_streaming_callback_sees_every_token_in_order(engines):
    engine = engines["qwen3"]
    chunks: list[list[int]] = []
    result = engine.generate([60, 9, 200], SamplingParams(max_new_tokens=12), on_tokens=chunks.append)
    assert [t for c in chunks for t in c] == result.token_ids
    assert len(chunks) == 1 + result.verify_steps  # the prefill's token, then one chunk per step


def test_server_and_cli_import_neither_torch_nor_a_backend():
    code = (
        "import sys\n"
        "import ddtree_engine.cli, ddtree_engine.server.app, ddtree_engine.types\n"
        "loaded = sorted(m for m in sys.modules if m in ('torch', 'transformers') or m.startswith('ddtree_engine.reference'))\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported on start-up: {out.stdout.strip()}"
