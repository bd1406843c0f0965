"""The held-out prompt sets in ddtree_ops/prompts.py really are held out from the lab pair's
training data, and the built-in set really is not.

The corpus is regenerated exactly as training/train_lab_pair.py built it for the shipped
snapshot: the seed and size come from the shipped training log, and the regenerated corpus must
reproduce that log's "corpus:" line (transcripts, tokens, longest) before any claim is checked
against it. Generating it takes about a second, once per session.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from repo_scripts import load_script

from ddtree_engine.reference.tokenizer import SPECIAL_TOKENS, build_byte_tokenizer
from ddtree_ops.compare.prompts import BUILTIN_PROMPTS, HELDOUT_NOVEL_PROMPTS, HELDOUT_TEMPLATE_PROMPTS

ROOT = Path(__file__).resolve().parents[2]
TRAIN_LOG = ROOT / "training" / "lab_pair_train_log.json"
USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def _corpus_module():
    # training/ is a folder of scripts, not a package: load corpus.py by path, as training does.
    return load_script("training/corpus.py", "lab_training_corpus")


CORPUS = _corpus_module()


def _format_pattern(template: str) -> str:
    """A str.format template as a regex: each {slot} matches any non-empty text."""
    return "(.+?)".join(re.escape(part) for part in re.split(r"\{\w+\}", template))


# Every prompt the training generator can produce, by family. The code family's prompt is an
# f-string inside corpus.code_sample ("{verb} a Python function {name} that returns {what}.",
# with "Write a short a" collapsed); test_patterns_cover_every_training_prompt keeps these
# patterns honest against the generator's real output.
TEMPLATE_PATTERNS: dict[str, list[re.Pattern]] = {
    family: [re.compile(p, re.S) for p in patterns]
    for family, patterns in {
        "code": [
            re.escape(CORPUS.FIB_PROMPT),
            r"(?:Write a|Write a short|Implement a) Python function (\w+) that returns (.+?)\.",
        ],
        "arith-short": [_format_pattern(CORPUS.ADD_PROMPT)],
        "arith-steps": [_format_pattern(CORPUS.STEPS_PROMPT)],
        "json": [_format_pattern(CORPUS.JSON_PROMPT)],
        "prose": [_format_pattern(CORPUS.PROSE_PROMPT)],
    }.items()
}


def template_family(prompt: str) -> str | None:
    """The training family whose template generates `prompt` verbatim, or None."""
    for family, patterns in TEMPLATE_PATTERNS.items():
        if any(p.fullmatch(prompt) for p in patterns):
            return family
    return None


def token_count(transcript: str) -> int:
    # The lab tokenizer is byte-level (one token per UTF-8 byte) plus one token per special
    # token; test_token_count_is_the_tokenizers checks this against the real tokenizer.
    return len(transcript.encode()) - sum((len(s.encode()) - 1) * transcript.count(s) for s in SPECIAL_TOKENS)


@dataclass(frozen=True)
class ShippedCorpus:
    transcripts: list[str]
    text: str  # all transcripts joined: prompts and replies
    user_prompts: dict[str, int]  # user turn -> how many transcripts open with it
    max_len: int
    log_line: str  # the "corpus: ..." line the shipped training run logged


@pytest.fixture(scope="session")
def shipped_corpus() -> ShippedCorpus:
    log = json.loads(TRAIN_LOG.read_text())
    args = log["args"]
    transcripts = CORPUS.build_corpus(int(args["samples"]), int(args["seed"]))
    counts: dict[str, int] = {}
    for t in transcripts:
        prompt = USER_TURN.match(t).group(1)
        counts[prompt] = counts.get(prompt, 0) + 1
    line = next(entry for entry in log["log"] if entry.startswith("corpus: "))
    return ShippedCorpus(transcripts, "".join(transcripts), counts, int(args["max_len"]), line)


def prompt_text(prompt) -> str:
    (message,) = prompt.messages
    return message["content"]


def test_token_count_is_the_tokenizers(shipped_corpus):
    tok = build_byte_tokenizer()
    sample = shipped_corpus.transcripts[::397]
    assert [token_count(t) for t in sample] == [len(tok.encode(t)) for t in sample]


def test_regenerated_corpus_is_the_shipped_one(shipped_corpus):
    lengths = [min(shipped_corpus.max_len, token_count(t)) for t in shipped_corpus.transcripts]
    regenerated = f"corpus: {len(lengths)} transcripts, {sum(lengths)} tokens, longest {max(lengths)}"
    assert regenerated == shipped_corpus.log_line


def test_patterns_cover_every_training_prompt(shipped_corpus):
    unmatched = [p for p in shipped_corpus.user_prompts if template_family(p) is None]
    assert unmatched == [], f"{len(unmatched)} training prompts match no template, e.g. {unmatched[:3]}"
    families = {template_family(p) for p in shipped_corpus.user_prompts}
    assert families == set(TEMPLATE_PATTERNS)


def test_builtin_prompts_are_training_prompts(shipped_corpus):
    # Every built-in prompt is a training template instance, and the fixed ones (code, prose)
    # are training prompts word for word, hundreds of times: the bar in test_lab_pair.py is
    # in distribution. (The three with numbers drew values the 40 000 samples happen to miss.)
    assert {p.name: template_family(prompt_text(p)) for p in BUILTIN_PROMPTS} == {
        p.name: p.name for p in BUILTIN_PROMPTS
    }
    for name in ("code", "prose"):
        (prompt,) = [p for p in BUILTIN_PROMPTS if p.name == name]
        assert shipped_corpus.user_prompts.get(prompt_text(prompt), 0) >= 100, name


def test_heldout_template_prompts_use_training_templates_with_unseen_values(shipped_corpus):
    families = {}
    for p in HELDOUT_TEMPLATE_PROMPTS:
        text = prompt_text(p)
        families[p.name] = template_family(text)
        assert families[p.name] is not None, f"{p.name}: no training template generates {text!r}"
        # Not a training prompt, and not even a substring of any transcript (prompt or reply).
        assert text not in shipped_corpus.user_prompts, p.name
        assert text not in shipped_corpus.text, p.name
    assert set(families.values()) == set(TEMPLATE_PATTERNS), "every training family needs held-out values"


def test_heldout_novel_prompts_come_from_no_training_template(shipped_corpus):
    for p in HELDOUT_NOVEL_PROMPTS:
        text = prompt_text(p)
        assert template_family(text) is None, f"{p.name}: the {template_family(text)} template generates it"
        assert text not in shipped_corpus.text, p.name


def test_heldout_sets_share_nothing_with_the_builtin_set():
    texts = [prompt_text(p) for p in BUILTIN_PROMPTS + HELDOUT_TEMPLATE_PROMPTS + HELDOUT_NOVEL_PROMPTS]
    names = [p.name for p in BUILTIN_PROMPTS + HELDOUT_TEMPLATE_PROMPTS + HELDOUT_NOVEL_PROMPTS]
    assert len(set(texts)) == len(texts) and len(set(names)) == len(names)
