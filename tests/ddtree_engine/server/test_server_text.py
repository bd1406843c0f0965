"""Incremental decoding with stop strings, on the tiny pair's byte-level tokenizer."""

import pytest
from ddtree_engine.server.text import CompletionText


@pytest.fixture(scope="module")
def tokenizer(server_engine):
    return server_engine.tokenizer


def ids_of(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_multibyte_character_is_held_until_complete(tokenizer):
    euro = ids_of(tokenizer, "€")
    assert len(euro) == 3  # byte-level: three tokens for one character
    text = CompletionText(tokenizer)
    assert [text.add([t]) for t in euro] == ["", "", "€"]
    assert text.finish() == ""


def test_a_possible_stop_prefix_is_held_then_released(tokenizer):
    text = CompletionText(tokenizer, ["xyz"])
    assert text.add(ids_of(tokenizer, "abx")) == "ab"  # "x" may begin "xyz"
    assert text.add(ids_of(tokenizer, "xy")) == "x"  # "abxxy": only "xy" may still
    assert text.add(ids_of(tokenizer, "q")) == "xyq"
    assert text.finish() == ""
    assert text.text == "abxxyq" and not text.stopped


def test_output_is_cut_before_the_first_stop_and_later_tokens_add_nothing(tokenizer):
    text = CompletionText(tokenizer, ["END", "zz"])
    deltas = [text.add(ids_of(tokenizer, piece)) for piece in ("hello E", "N", "D more zz")]
    assert "".join(deltas) + text.finish() == "hello "
    assert text.stopped and text.text == "hello "
    assert text.add(ids_of(tokenizer, "again")) == ""


def test_special_tokens_are_not_text(tokenizer):
    text = CompletionText(tokenizer)
    assert text.add(ids_of(tokenizer, "ok") + [tokenizer.eos_token_id]) + text.finish() == "ok"
