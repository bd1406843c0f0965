"""The rules a service's `env:` is checked against (config.Service): the variables ddtree-ops sets itself, and
the engine's own (engine_env.yaml: a `DDTREE_` name it does not read is a likely typo)."""

from __future__ import annotations

import difflib
import re

from . import engine_env

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

# Variables ddtree-ops sets itself in a service's environment, with the setting that controls each.
TOOL_SET_ENV = {
    "PYTHONUNBUFFERED": "always 1 (the journal gets lines as they are written)",
    "HF_HUB_OFFLINE": "always 1 (models come from local paths)",
    "DDTREE_SERVICE": "the service's name",
    "DDTREE_API_KEY": "the API key: set api_key_env or api_key_file (see the README's \"The API key\")",
    "CUDA_VISIBLE_DEVICES": "the GPUs: set the service's gpus (indexes into the host's gpus)",
    "CUDA_DEVICE_ORDER": "the GPUs: set the service's gpus",
}


def env_entry_problems(name: str, value: str) -> list[str]:
    """What is wrong with one `services[].env` entry (nothing: []), each with how to fix it."""
    if not re.match(ENV_NAME_PATTERN, name):
        return [f"{name!r} is not an environment variable name (letters, digits and _, not starting with a digit)"]
    if name in TOOL_SET_ENV:
        return [f"{name} is set by ddtree-ops ({TOOL_SET_ENV[name]}): remove it from env"]
    if "\n" in value or "\0" in value:
        return [f"{name}: values cannot contain newlines or NUL bytes"]
    known = engine_env()
    if name.startswith("DDTREE_") and name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"the engine reads {', '.join(sorted(known))}"
        return [f"{name} is not a variable the DDTree engine reads: {hint}"]
    allowed = known.get(name, {}).get("values")
    if allowed and value.strip().lower() not in allowed:
        return [f"{name}={value!r} is not one of {', '.join(allowed)} ({known[name]['what']})"]
    return []
