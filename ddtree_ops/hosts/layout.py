"""The host layout, in one place: every path ddtree-ops leaves on a host, unit names, state.json keys.

```
/opt/ddtree/envs/<lock-hash>/        immutable venv built from a lock
/opt/ddtree/images/<lock-hash>/      container mode: the record (and stored manifest) of the image
/opt/ddtree/releases/<release-id>/   engine wheel, rendered env files, release.json
/opt/ddtree/wheelhouse/<lock-hash>/  a wheelhouse unpacked while an env is built
/etc/ddtree/<service>.env            0600; secrets (API key) live only here
/etc/systemd/system/ddtree-<service>.service
/var/lib/ddtree/state.json           current and previous release per service, the env or image
/var/lib/ddtree/deploy.lock          flock(1)ed while deploy, rollback, undeploy or sweep changes the host
/var/cache/ddtree/<service>/         the service's compile caches (systemd CacheDirectory=; Triton's under triton/)
```

The Ansible roles receive these values as variables (or carry the same defaults, named there).
`host_scripts/current_release.py` follows state.json's `current` and env `path` on the host itself
(healthcheck's one SSH query passes it STATE_PATH, RELEASES_DIR and MANIFEST_NAME).
"""

from __future__ import annotations

from typing import Any

ROOT = "/opt/ddtree"
ENVS_DIR = f"{ROOT}/envs"
IMAGES_DIR = f"{ROOT}/images"
RELEASES_DIR = f"{ROOT}/releases"
STAGING_DIR = f"{ROOT}/wheelhouse"  # where a wheelhouse is unpacked on the host while an env is built
IMAGE_ENV_DIR = f"{ROOT}/env"  # the engine's env inside the engine image
ENV_FILE_DIR = "/etc/ddtree"
UNIT_DIR = "/etc/systemd/system"
STATE_PATH = "/var/lib/ddtree/state.json"
# Held (flock) by the SSH session of the ddtree-ops run changing the host's services; it holds the holder's
# description (hosts/lock.py) while held.
LOCK_PATH = "/var/lib/ddtree/deploy.lock"
# A service's compile caches, kept across restarts and releases (the unit's CacheDirectory=, relative to /var/cache).
SERVICE_CACHE_ROOT = "/var/cache"
MANIFEST_NAME = "abi-manifest.json"  # the ABI manifest stored beside an env (or an image's record)
ENGINE_ENTRY_POINT = "bin/ddtree-engine"  # inside an env
IMAGE_REPO = "ddtree-engine"

# state.json: {"services": {name: {"current": id, "previous": id, "deploy_id": id, "rolled_back_by": id}},
#              "env" | "image": {"path": dir, …}}
STATE_SERVICES = "services"
STATE_CURRENT = "current"
STATE_PREVIOUS = "previous"
STATE_DEPLOY_ID = "deploy_id"
STATE_ROLLED_BACK_BY = "rolled_back_by"
STATE_PATH_KEY = "path"


def unit_name(service: str) -> str:
    """`tree` → `ddtree-tree.service`."""
    return f"ddtree-{service}.service"


def syslog_identifier(service: str) -> str:
    """The journal tag (`journalctl -t`) and the `-u` unit stem: `ddtree-<service>`."""
    return f"ddtree-{service}"


def container_name(service: str) -> str:
    """The name of the service's container in container mode (`docker ps`, `docker logs`)."""
    return f"ddtree-{service}"


def cache_directory(service: str) -> str:
    """The unit's `CacheDirectory=` (relative to /var/cache): `ddtree/<service>`."""
    return f"ddtree/{service}"


def cache_dir(service: str) -> str:
    """The service's cache directory on the host (and, mounted at the same path, in its container)."""
    return f"{SERVICE_CACHE_ROOT}/{cache_directory(service)}"


def env_file_path(service: str) -> str:
    return f"{ENV_FILE_DIR}/{service}.env"


def env_dir(short_hash: str) -> str:
    """The venv of a lock: /opt/ddtree/envs/<short hash>."""
    return f"{ENVS_DIR}/{short_hash}"


def image_record_dir(short_hash: str) -> str:
    """Container mode: where provision records a lock's image and stores its manifest."""
    return f"{IMAGES_DIR}/{short_hash}"


def staging_dir(short_hash: str) -> str:
    return f"{STAGING_DIR}/{short_hash}"


def image_tag(short_hash: str) -> str:
    """The engine image's tag: one image per lock, like one env dir per lock."""
    return f"{IMAGE_REPO}:{short_hash}"


def stored_manifest_path(env: str) -> str:
    """The ABI manifest stored beside `env` (a venv or an image's record directory)."""
    return f"{env.rstrip('/')}/{MANIFEST_NAME}"


def state_key(mode: str) -> str:
    """Where provision records what it built in state.json: `env` (a venv) or `image` (container mode).

    Both records carry `path`, the directory on the host that holds the stored ABI manifest.
    """
    return "image" if mode == "container" else "env"


def env_of_state(state: object, mode: str = "venv") -> str | None:
    """The env (or image) directory provision recorded in a host's state.json (parsed), or None."""
    env = state.get(state_key(mode)) if isinstance(state, dict) else None
    path = env.get(STATE_PATH_KEY) if isinstance(env, dict) else None
    return path if isinstance(path, str) and path else None


def service_entries(state: Any) -> dict[str, Any]:
    """state.json's per-service entries ({} when there are none or the document is not an object)."""
    entries = state.get(STATE_SERVICES) if isinstance(state, dict) else None
    return entries if isinstance(entries, dict) else {}
