"""Validate a command's real `--json` output against its schema in ddtree_ops/schemas/ (the shipped files).

`validate(doc)` picks the schema by the document's own `command` (`lab up` -> lab-up.json); every
schema's `$ref`s to common.json resolve through one registry of the shipped files.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry, Resource

BASE = "https://ddtree-ops.local/schemas/"


def schema_files() -> dict[str, dict[str, Any]]:
    """file name -> parsed schema, read from the installed package's data (what users get)."""
    folder = resources.files("ddtree_ops") / "schemas"
    return {p.name: json.loads(p.read_text()) for p in folder.iterdir() if p.name.endswith(".json")}


def _registry() -> Registry:
    return Registry().with_resources((BASE + name, Resource.from_contents(doc)) for name, doc in schema_files().items())


def schema_name(command: str) -> str:
    return command.replace(" ", "-") + ".json"


def validate(doc: dict[str, Any]) -> dict[str, Any]:
    """Raise jsonschema.ValidationError unless `doc` matches the schema of the command it names.

    Returns:
        the document, for chaining in asserts.
    """
    schema = schema_files()[schema_name(doc["command"])]
    validator = jsonschema.Draft202012Validator(schema, registry=_registry())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        # oneOf hides the useful message; name the deepest ones.
        details = [f"{list(sub.absolute_path)}: {sub.message}" for e in errors for sub in (e.context or [e])]
        raise jsonschema.ValidationError(f"{doc['command']} --json does not match {schema_name(doc['command'])}:\n" + "\n".join(details[:12]))
    return doc
