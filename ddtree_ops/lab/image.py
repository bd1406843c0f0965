"""The lab host image: built here from Debian's mirror (no registry), reused when present."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

from ..exceptions import DdtreeOpsError
from ..state import cache_dir, repo_root
from .docker import docker

# Bump with docker/lab/Dockerfile or build-image.sh changes that hosts must see.
LAB_IMAGE = "ddtree-lab:bookworm-2"
# The plain Debian root filesystem under it (python3 + venv, no systemd set-up): the CPU engine image's base.
LAB_ROOTFS_IMAGE = "ddtree-lab-base:bookworm-v1"
BUILD_SCRIPT = "docker/lab/build-image.sh"
log = logging.getLogger(__name__)


def image_present(tag: str = LAB_IMAGE) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


def ensure_image(tag: str = LAB_IMAGE) -> float:
    """Build the lab image unless it exists. Returns the seconds spent building (0.0 when reused).

    Raises:
        DdtreeOpsError: the build failed (its output went to stderr).
    """
    if image_present(tag):
        return 0.0
    script = repo_root() / BUILD_SCRIPT
    if not script.exists():
        raise DdtreeOpsError(f"the lab image {tag} is missing and {script} is not here to build it")
    log.info("building the lab image %s (debootstrap; a few minutes, cached afterwards)", tag)
    started = time.monotonic()
    env = dict(os.environ, DDTREE_LAB_CACHE=str(cache_dir() / "lab"))
    proc = subprocess.run(["bash", str(script), tag], stdout=sys.stderr, stderr=sys.stderr, env=env, check=False)
    if proc.returncode != 0:
        raise DdtreeOpsError(f"building the lab image {tag} failed (exit {proc.returncode}); its output is above")
    return time.monotonic() - started
