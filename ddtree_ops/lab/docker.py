"""A thin wrapper over the `docker` command line (the lab needs a handful of calls, not an SDK)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from ..exceptions import DdtreeOpsError
from ..state import repo_root


class DockerUnavailable(DdtreeOpsError):
    """No Docker engine answers on this machine."""

    exit_code = 1


ENSURE_SCRIPT = "docker/lab/ensure-docker.sh"


def docker(*args: str, check: bool = True, input_text: str | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run `docker ARGS…` and return the completed process (stdout/stderr as text).

    Raises:
        DockerUnavailable: the client is missing.
        DdtreeOpsError: `check` is set and docker exited non-zero (its stderr in the message).
    """
    if shutil.which("docker") is None:
        raise DockerUnavailable(f"the docker client is not installed: run `sudo {repo_root() / ENSURE_SCRIPT}`")
    proc = subprocess.run(
        ["docker", *args], input=input_text, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and proc.returncode != 0:
        raise DdtreeOpsError(f"`docker {' '.join(args)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=15, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def ensure_docker() -> None:
    """Make the Docker engine answer, running docker/lab/ensure-docker.sh (installs/starts it as root).

    Raises:
        DockerUnavailable: it still does not answer; the script's output says why.
    """
    if engine_answers():
        return
    script = repo_root() / ENSURE_SCRIPT
    if not script.exists():
        raise DockerUnavailable("no Docker engine answers on this machine: start Docker, then retry")
    proc = subprocess.run(["bash", str(script)], stdout=sys.stderr, stderr=sys.stderr, check=False)
    if proc.returncode != 0 or not engine_answers():
        raise DockerUnavailable(
            f"no Docker engine answers on this machine and {script} could not start one (see above); "
            "start Docker yourself (as root: dockerd), then retry"
        )
