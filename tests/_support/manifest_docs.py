"""The real H200 ABI manifest (tests/fixtures/manifests), and the same manifest with one failed import."""

from __future__ import annotations

import json
from pathlib import Path

H200_MANIFEST = Path(__file__).resolve().parents[1] / "fixtures" / "manifests" / "h200-manifest.json"


def failed_manifest_doc() -> dict:
    """The H200 manifest after `safetensors` went missing: the engine's import fails, classified."""
    doc = json.loads(H200_MANIFEST.read_text())
    doc["checks"].append(
        {
            "name": "import:ddtree_engine.reference.engine",
            "status": "fail",
            "ok": False,
            "class": "missing-python-dependency",
            "reason": "importing ddtree_engine.reference.engine needs the Python module 'safetensors', which is not installed",
        }
    )
    doc["ok"] = False
    return doc
