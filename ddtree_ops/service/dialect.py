"""How each engine backend's server says what the tools read: the one place the two differ.

Both backends serve `/health`, `/metrics` (SGLang's metric names), `/v1/models`, `/v1/completions` and
`/v1/chat/completions` alike. They differ in `/server_info`, and in how `/health` relates to generation:

- `reference` (`ddtree-engine serve`): `/server_info` already has the contract's keys (DESIGN.md, "The
  server contract"); `/health` turns 200 only once the engine is warm.
- `sglang` (stock SGLang 0.5.23 with the DDTree plugin): `/server_info` (srt/entrypoints/http_server.py:863;
  `/get_server_info` is its deprecated alias) is `ServerArgs.resolved_dict()` plus scheduler state,
  `launch_command` (the argv, " "-joined), `version`. It carries the API key in plain text (`api_key`, and
  in `launch_command` after `--api-key`), so it is redacted here before anything stores it. The plugin's
  tree flags are read from the top level when the plugin reports them there, else from `launch_command`.
  A server without speculative decoding reports `speculative_algorithm: null`, read as `AR`. `/health` is
  200 once SGLang's own warm-up request succeeded and stays 200 without generating
  (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION off); `/health_generate` runs a one-token generation (or
  waits for a running batch), so healthcheck asks it too.
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("reference", "sglang")
REDACTED = "<redacted>"
# SGLang's ServerArgs fields that hold secrets (srt/arg_groups/fields/serving.py: api_key, admin_api_key).
SGLANG_SECRET_FIELDS = ("api_key", "admin_api_key")
SGLANG_SECRET_FLAGS = ("--api-key", "--admin-api-key")
# The plugin's flags, as `/server_info` keys -> how to read them (`launch_command` fallback).
DDTREE_FLAGS = {
    "speculative_ddtree_budget": ("--speculative-ddtree-budget", int),
    "speculative_ddtree_topk": ("--speculative-ddtree-topk", int),
    "speculative_ddtree_spine_depth": ("--speculative-ddtree-spine-depth", int),
    "speculative_ddtree_hybrid_mode": ("--speculative-ddtree-hybrid-mode", str),
}


def check_backend(backend: str) -> str:
    """`backend`, or ValueError naming the known ones (a programming error: config validates it first)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown engine backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    return backend


def health_generate_path(backend: str) -> str | None:
    """The endpoint that proves the server can generate now, beyond `/health` (None: `/health` already does)."""
    return "/health_generate" if check_backend(backend) == "sglang" else None


def _redact_command(command: str) -> str:
    words = command.split(" ")
    out: list[str] = []
    hide_next = False
    for word in words:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif word in SGLANG_SECRET_FLAGS:
            out.append(word)
            hide_next = True
        elif word.split("=", 1)[0] in SGLANG_SECRET_FLAGS and "=" in word:
            out.append(word.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(word)
    return " ".join(out)


def _flag_value(command: str, flag: str) -> str | None:
    words = command.split()
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def normalize_info(backend: str, raw: dict[str, Any]) -> dict[str, Any]:
    """`/server_info` as the contract reads it, secrets redacted (the reference server's is returned as is).

    Args:
        backend: the project's engine backend.
        raw: the JSON object the server answered.
    Returns:
        a new dict: for sglang, the DDTree keys filled from `launch_command` when missing,
        `speculative_algorithm` None read as "AR", a DDTREE server's verify width moved to
        `speculative_verify_tokens` (`expected_draft_keys`), `api_key`/`admin_api_key` and `--api-key VALUE` redacted.
    """
    if check_backend(backend) == "reference":
        return dict(raw)
    info = dict(raw)
    for key in SGLANG_SECRET_FIELDS:
        if info.get(key):
            info[key] = REDACTED
    command = info.get("launch_command")
    if isinstance(command, str):
        info["launch_command"] = command = _redact_command(command)
        for key, (flag, kind) in DDTREE_FLAGS.items():
            value = _flag_value(command, flag)
            if info.get(key) is None and value is not None:
                try:
                    info[key] = kind(value)
                except ValueError:
                    info[key] = value  # shown as the server said it; the expected-value check names it
    if info.get("speculative_algorithm") is None and "speculative_algorithm" in info:
        info["speculative_algorithm"] = "AR"
    if str(info.get("speculative_algorithm")).upper() == "DDTREE":
        # SGLang's value is max(block size, budget + 1) here (expected_draft_keys): the block size only
        # when it exceeds budget + 1.
        verify, budget = info.get("speculative_num_draft_tokens"), info.get("speculative_ddtree_budget")
        info["speculative_verify_tokens"] = verify
        shows_block = isinstance(verify, int) and isinstance(budget, int) and verify > budget + 1
        info["speculative_num_draft_tokens"] = verify if shows_block else None
    return info


def expected_draft_keys(backend: str, algorithm: str, block_size: int | None, budget: int | None) -> dict[str, int]:
    """The block-size keys `/server_info` must show for a service (empty: none is checked).

    The reference server reports the drafter's block size as `speculative_num_draft_tokens`, and so does
    SGLang for DFLASH. For DDTREE SGLang reports the tokens it reserves per verify step, which the plugin
    sets to max(block size, budget + 1): `normalize_info` moves that to `speculative_verify_tokens`, checked
    here, and a tree at least as wide as the block hides the block size (only the width is checked then).
    """
    if algorithm not in ("dflash", "ddtree") or block_size is None:
        return {}
    if check_backend(backend) == "sglang" and algorithm == "ddtree" and budget is not None:
        return {"speculative_verify_tokens": max(block_size, budget + 1)}
    return {"speculative_num_draft_tokens": block_size}
