"""The rules a service's `env:` is checked against (config.Project): the variables ddtree-ops sets itself, names
that would break the service, and the engine's own (engine_env.yaml: a `DDTREE_` name it does not read is a likely
typo; a switch takes its words; some apply to one backend or install mode only)."""

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


def switches_as_words(env: dict) -> dict:
    """`env` with the engine switches' YAML booleans and integers as their words (a bare `off` reads as false,
    `0` as 0); every other value as it is (one that is not text is refused where it is checked)."""
    switches = {name for name, rule in engine_env().items() if rule.get("values")}
    return {name: (("true" if value else "false") if isinstance(value, bool) else str(value))
            if name in switches and isinstance(value, int) else value for name, value in env.items()}


def env_entry_problems(name: str, value: str, backend: str | None, mode: str | None) -> list[str]:
    """What is wrong with one `services[].env` entry (nothing: []), each with how to fix it.

    Args:
        name, value: the entry, both text.
        backend, mode: `engine.backend` and `engine.install.mode` (None where the file leaves them malformed).
    """
    if not re.match(ENV_NAME_PATTERN, name):
        return [f"{name!r} is not an environment variable name (letters, digits and _, not starting with a digit)"]
    if name in TOOL_SET_ENV:
        return [f"{name} is set by ddtree-ops ({TOOL_SET_ENV[name]}): remove it from env"]
    if name == "PYTHONHOME":
        return ["PYTHONHOME would point the service's Python away from its provisioned env, which then cannot start: remove it"]
    if mode == "container" and name.startswith("DOCKER_"):
        return [f"{name}: in container mode the env file also reaches the unit's own docker commands, which it would "
                "redirect: set it in the host's docker configuration instead"]
    if "\n" in value or "\0" in value:
        return [f"{name}: values cannot contain newlines or NUL bytes"]
    known = engine_env()
    if name.upper().startswith("DDTREE_") and name not in known:
        if name.upper() in known:
            return [f"{name} is not a variable the DDTree engine reads: names are case-sensitive, did you mean {name.upper()}?"]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"the engine reads {', '.join(sorted(known))}"
        return [f"{name} is not a variable the DDTree engine reads: {hint}"]
    rule = known.get(name)
    if rule is None:
        return []
    if rule.get("values") and value.strip().lower() not in rule["values"]:
        return [f"{name}={value!r} is not one of {', '.join(rule['values'])} ({rule['what']})"]
    if rule.get("backends") and backend is not None and backend not in rule["backends"]:
        return [f"{name} is read by the {' and '.join(rule['backends'])} backend only; with engine.backend {backend} it "
                "would do nothing: remove it"]
    if rule.get("absolute_path") and not value.startswith("/"):
        return [f"{name}={value!r}: give an absolute path on the host ({rule['what']})"]
    if rule.get("venv_only") and mode == "container":
        return [f"{name}: in container mode the file would be written inside the container, which is removed when the "
                "service stops: trace with engine.install.mode venv"]
    return []


def env_problems(document: dict) -> list[tuple[tuple, str]]:
    """Every `services[N].env` entry's problems, located at `services[N].env.NAME`, read leniently from the raw
    document (entries that are not text are left to their field errors)."""
    engine = document.get("engine") if isinstance(document.get("engine"), dict) else {}
    backend = engine.get("backend", "reference")
    install = engine.get("install") if isinstance(engine.get("install"), dict) else {}
    mode = install.get("mode", "venv")
    backend = backend if isinstance(backend, str) else None
    mode = mode if isinstance(mode, str) else None
    services = document.get("services")
    problems = []
    for i, service in enumerate(services if isinstance(services, list) else []):
        env = service.get("env") if isinstance(service, dict) else None
        if not isinstance(env, dict):
            continue
        for name, value in switches_as_words(env).items():
            if isinstance(name, str) and isinstance(value, str):
                problems += [(("services", i, "env", name), p) for p in env_entry_problems(name, value, backend, mode)]
    return problems
