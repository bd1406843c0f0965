"""The project's known_hosts file: reading and writing host keys, fingerprints, and what ssh says when
a key is missing or changed.

Every SSH connection of ddtree-ops (the Transport in `ssh.py` and Ansible through `inventory.py`) checks
the host's key against one file per project (`Host.known_hosts`: `ssh.known_hosts` in ddtree.yaml, else
`known_hosts` beside it). Keys get there only through `ddtree-ops hosts trust` (which shows their
fingerprints first) or, for lab hosts, `lab up` (which reads them inside the container).

The file is OpenSSH's own format, written unhashed: `ADDRESS TYPE BASE64` for port 22,
`[ADDRESS]:PORT TYPE BASE64` for any other port (what ssh looks up).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..config import DEFAULT_CONFIG_NAME, Host

# What ssh prints (stderr, exit 255) when StrictHostKeyChecking=yes refuses a host.
CHANGED_MARKER = "REMOTE HOST IDENTIFICATION HAS CHANGED"
FAILED_MARKER = "Host key verification failed"
MISSING = "missing"
CHANGED = "changed"


@dataclass(frozen=True)
class HostKey:
    """One public host key: `key_type` (ssh-ed25519, ecdsa-sha2-nistp256, ssh-rsa, …) and its base64 blob."""

    key_type: str
    blob: str

    @property
    def fingerprint(self) -> str:
        """`SHA256:…`, as `ssh-keygen -lf` and ssh's own prompts print it."""
        return fingerprint(self.blob)

    def line(self, pattern: str) -> str:
        return f"{pattern} {self.key_type} {self.blob}"


def fingerprint(blob: str) -> str:
    """The SHA256 fingerprint of a base64 public key blob: unpadded base64 of the blob's SHA-256.

    Raises:
        ValueError: `blob` is not base64.
    """
    try:
        raw = base64.b64decode(blob, validate=True)
    except binascii.Error as err:
        raise ValueError(f"not a base64 public key: {blob[:20]}…") from err
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def host_pattern(address: str, port: int) -> str:
    """The name ssh looks a host up by in known_hosts: `ADDRESS` on port 22, `[ADDRESS]:PORT` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


def pattern_of(host: Host) -> str:
    return host_pattern(host.address, host.ssh.port)


def _matches_hashed(entry: str, name: str) -> bool:
    # `|1|SALT|HASH`: HASH = HMAC-SHA1(key=SALT, name), both base64 (ssh-keygen -H, HashKnownHosts=yes).
    try:
        _, _, salt, digest = entry.split("|", 3)
        expected = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(expected, base64.b64decode(digest))
    except (ValueError, binascii.Error):
        return False


def _names_match(names_field: str, name: str) -> bool:
    for entry in names_field.split(","):
        if entry.startswith("|1|") and _matches_hashed(entry, name):
            return True
        if entry == name:
            return True
    return False


def parse_key_line(line: str) -> tuple[str, HostKey] | None:
    """`NAMES TYPE BLOB [comment]` -> (NAMES, key); None for blank lines, comments, `@cert-authority`
    / `@revoked` lines and anything else that is not a plain host key entry."""
    fields = line.split()
    if len(fields) < 3 or fields[0].startswith(("#", "@")):
        return None
    return fields[0], HostKey(fields[1], fields[2])


def parse_keyscan(text: str) -> list[HostKey]:
    """The keys in `ssh-keyscan` output (its `# host:port SSH-2.0-…` comment lines skipped), in order, unique."""
    keys: list[HostKey] = []
    for line in text.splitlines():
        parsed = parse_key_line(line)
        if parsed is not None and parsed[1] not in keys:
            keys.append(parsed[1])
    return keys


def recorded_keys(path: Path, pattern: str) -> list[HostKey]:
    """The keys `path` records for `pattern` (plain or hashed names); [] when the file does not exist."""
    if not path.exists():
        return []
    keys: list[HostKey] = []
    for line in path.read_text().splitlines():
        parsed = parse_key_line(line)
        if parsed is not None and _names_match(parsed[0], pattern) and parsed[1] not in keys:
            keys.append(parsed[1])
    return keys


def _without(line: str, pattern: str) -> str | None:
    # The line with `pattern` taken out of its names (None: no name left, drop the line).
    parsed = parse_key_line(line)
    if parsed is None or not _names_match(parsed[0], pattern):
        return line
    names = [n for n in parsed[0].split(",") if not (n == pattern or (n.startswith("|1|") and _matches_hashed(n, pattern)))]
    if not names:
        return None
    return " ".join([",".join(names), *line.split()[1:]])


def record_keys(path: Path, pattern: str, keys: list[HostKey], replace: bool = False) -> None:
    """Record `keys` for `pattern` in `path` (created with its folder if missing), atomically.

    Args:
        replace: first remove every key recorded for `pattern` (only that name: other hosts' lines, and
            other names sharing a line, stay); otherwise the keys are added beside any already there.
    """
    lines = path.read_text().splitlines() if path.exists() else []
    if replace:
        lines = [kept for kept in (_without(line, pattern) for line in lines) if kept is not None]
    present = set(recorded_keys(path, pattern)) if not replace else set()
    lines += [key.line(pattern) for key in keys if key not in present]
    write_atomically(path, "".join(line + "\n" for line in lines))


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def host_key_problem(ssh_stderr: str) -> str | None:
    """What ssh's stderr says about the host key: `changed`, `missing` (not recorded), or None (no key problem)."""
    if CHANGED_MARKER in ssh_stderr:
        return CHANGED
    if FAILED_MARKER in ssh_stderr:
        return MISSING
    return None


def trust_command(host: Host, replace: bool = False) -> str:
    """The exact `ddtree-ops [-c FILE] hosts trust NAME [--replace]` that records `host`'s key in its project's file."""
    project_file = host.project_file
    config = f"-c {project_file} " if project_file is not None and str(project_file) != DEFAULT_CONFIG_NAME else ""
    return f"ddtree-ops {config}hosts trust {host.name}" + (" --replace" if replace else "")


def host_key_message(host: Host, problem: str, ssh_stderr: str = "") -> str:
    """Why `host` is refused, which file was checked, and the exact command that records its key.

    Args:
        problem: `changed` or `missing` (`host_key_problem`).
        ssh_stderr: what ssh printed; the fingerprint it reports for a changed key is quoted.
    """
    target = f"{host.ssh.user}@{host.address}:{host.ssh.port}"
    if problem == CHANGED:
        offered = re.search(r"SHA256:[A-Za-z0-9+/]+", ssh_stderr)
        now = f" (it now offers {offered.group(0)})" if offered else ""
        return (
            f"host {host.name} ({target}): its SSH host key has CHANGED since it was recorded in {host.known_hosts}{now}; "
            "nothing was run on it. A reinstalled or re-keyed host does this, and so does a man in the middle: "
            f"confirm the new fingerprint with the host's console or owner, then run `{trust_command(host, replace=True)}`"
        )
    return (
        f"host {host.name} ({target}): its SSH host key is not recorded in {host.known_hosts}, and ddtree-ops "
        f"connects only to hosts whose key it knows; nothing was run on it. Run `{trust_command(host)}` "
        "(it shows the key's fingerprints, then records them)"
    )
