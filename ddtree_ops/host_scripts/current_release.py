#!/usr/bin/env python3
"""Print the release.json of each service's current release, and the stored ABI manifest, that state.json names.

Runs on the host with a bare python3 (standard library only), fed on stdin in the same SSH round trip
that reads the units and state.json (`ddtree_ops.hosts.query`), so a healthcheck logs in once per host:

    python3 - STATE_PATH RELEASES_DIR ENV_KEY MANIFEST_NAME SERVICE... < current_release.py

Output, after a `### releases` line: for each SERVICE whose state.json entry names a current release,
a `### unit SERVICE` line and that release's release.json (nothing when it cannot be read); then, unless
ENV_KEY is `-`, a `### follow-up` line and the manifest stored beside the env (or image record) at
state.json's ENV_KEY.path (nothing when there is none). The control side reads state.json itself:
this only follows its pointers. Never fails on a missing or broken file.
"""

import json
import os
import sys


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        return ""


def main(argv):
    state_path, releases_dir, env_key, manifest_name = argv[:4]
    try:
        state = json.loads(read(state_path))
    except ValueError:
        state = None
    state = state if isinstance(state, dict) else {}
    entries = state.get("services")
    entries = entries if isinstance(entries, dict) else {}
    out = ["### releases"]
    for service in argv[4:]:
        entry = entries.get(service)
        current = entry.get("current") if isinstance(entry, dict) else None
        if isinstance(current, str) and current and "/" not in current and current not in (".", ".."):
            out += ["### unit " + service, read(os.path.join(releases_dir, current, "release.json")).rstrip("\n")]
    if env_key != "-":
        env = state.get(env_key)
        path = env.get("path") if isinstance(env, dict) else None
        out.append("### follow-up")
        if isinstance(path, str) and path:
            out.append(read(os.path.join(path, manifest_name)).rstrip("\n"))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
