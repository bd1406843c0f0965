"""Container mode: render the engine image's Dockerfile from a lock, build it with the Docker SDK
(progress shown), tag it by the lock's hash, and ship it to hosts (`docker save | ssh docker load`).

The template is docker/cuda/Dockerfile.j2; its flavour follows the lock: `cu130`/`cu129` start from
the matching nvidia/cuda image (or an lmsysorg/sglang tag that matches the lock exactly), `cpu` from a
plain OS image — the lab's, which needs no registry.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2

from ..progress import Progress, silent
from ..config import Host
from ..exceptions import ConfigError, DdtreeOpsError, HostError
from ..hosts import layout
from ..hosts.probe import MANIFEST_SCRIPT
from ..hosts.ssh import SSH, Transport
from ..lab.image import LAB_ROOTFS_IMAGE as LAB_BASE_IMAGE  # Debian bookworm, Python 3.11, built without a registry
from ..lab.image import ensure_image as ensure_lab_image
from ..state import repo_root
from .engine_source import engine_wheel_name
from .install import install_commands

IMAGE_REPO = layout.IMAGE_REPO
ENV_DIR = layout.IMAGE_ENV_DIR
STAGING = "/tmp/ddtree-install"  # in the build stage: the wheelhouse, or the engine wheel and constraints
TEMPLATE = "docker/cuda/Dockerfile.j2"


def docker_sdk():
    """The Docker SDK module, or None. The repository's own docker/ folder is a namespace package
    when the checkout is on sys.path; it has no `from_env`, so it does not count."""
    try:
        import docker  # deferred on purpose: an optional dependency only container mode needs
    except ImportError:
        return None
    return docker if hasattr(docker, "from_env") else None


def image_present_here(tag: str) -> bool:
    """Whether this machine's Docker already has `tag` (tags are lock hashes: present = up to date)."""
    proc = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    return proc.returncode == 0


def image_python_version(base: str) -> str | None:
    """`3.12` for a base image whose Python ddtree-ops knows (by its OS), else None."""
    tag = _image_python_tag(base)
    return f"{tag[2]}.{tag[3:]}" if tag else None


def base_python_version(cpu_base: str = LAB_BASE_IMAGE) -> str:
    """The Python (`3.11`) of the CPU flavour's base image: reference locks for images are made for it."""
    version = image_python_version(cpu_base)
    if version is None:
        raise ConfigError(f"the Python version of the base image {cpu_base} is unknown to ddtree-ops")
    return version


def ensure_engine_image(
    lock, wheelhouse_tar: Path, source: str = "wheelhouse", progress: Progress = silent
) -> tuple[str, bool]:
    """The engine image of `lock` on this machine: (tag, built now?). Built from the wheelhouse unless present.

    Raises:
        ConfigError / DdtreeOpsError: as render_dockerfile and build_image do.
    """
    tag = image_tag(lock)
    if image_present_here(tag):
        return tag, False
    if lock.image_base() is None and not image_present_here(LAB_BASE_IMAGE):
        ensure_lab_image()  # builds the Debian root filesystem image the CPU flavour starts from
    return build_image(lock, render_dockerfile(lock, wheelhouse_tar, source), progress), True


def image_tag(lock) -> str:
    """The image's tag: one image per lock, like one env dir per lock."""
    return layout.image_tag(lock.short_hash)


def flavour_of(lock) -> str:
    return lock.image_flavour


def base_image(lock, cpu_base: str = LAB_BASE_IMAGE) -> str:
    """nvidia/cuda of the lock's CUDA (or an exact lmsysorg/sglang match); the OS image for `cpu`."""
    return lock.image_base() or cpu_base


def _image_python_tag(base: str) -> str | None:
    # Ubuntu 24.04 ships Python 3.12, 22.04 ships 3.10, Debian bookworm 3.11.
    for marker, tag in (("ubuntu24.04", "cp312"), ("ubuntu:24.04", "cp312"), ("ubuntu22.04", "cp310"), ("bookworm", "cp311")):
        if marker in base:
            return tag
    return None


@dataclass(frozen=True)
class RenderedContext:
    dockerfile: str
    files: dict[str, Path]  # name in the build context -> source file


def render_dockerfile(lock, wheelhouse_tar: Path, source: str = "wheelhouse", cpu_base: str = LAB_BASE_IMAGE) -> RenderedContext:
    """The Dockerfile (and the files its context needs) for `lock`.

    The env is built in a build stage with the same pip commands a host runs (`ddtree_ops.provision.install`),
    and only the env is copied into the final image.

    Args:
        lock: a CudaLock (sglang) or a reference Lock.
        wheelhouse_tar: the lock's wheelhouse (`ensure_wheelhouse`): every wheel, or with `source="index"`
            (sglang locks) only the engine wheel, the constraints and the lock.
        source: `wheelhouse` installs offline; `index` downloads from the lock's package indexes.
    Raises:
        ConfigError: the lock cannot be built into an image (Python of the base image differs).
    """
    base = base_image(lock, cpu_base)
    want = lock.python_tag
    have = _image_python_tag(base)
    if have and have != want and not base.startswith("lmsysorg/"):
        raise ConfigError(
            f"the {flavour_of(lock)} base image {base} has Python {have}, the lock is for {want}: "
            "provision the hosts with the base image's Python (engine.install.python) or pick a base with it"
        )
    commands = install_commands(lock, STAGING, source=source, engine_wheel=engine_wheel_name())
    files: dict[str, Path] = {"abi_manifest.py": MANIFEST_SCRIPT, "wheelhouse.tar": Path(wheelhouse_tar)}
    manifest_args = lock.image_build_manifest_args()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(repo_root())), undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    text = env.get_template(TEMPLATE).render(
        lock_hash=lock.hash,
        flavour=flavour_of(lock),
        base_image=base,
        install_python=flavour_of(lock) != "cpu" or "bookworm" not in base,
        python_tag=want,
        env_dir=ENV_DIR,
        staging=STAGING,
        offline=source == "wheelhouse",
        commands=[" ".join(shlex.quote(arg) for arg in command) for command in commands],
        build_manifest_args=" ".join(manifest_args),
    )
    return RenderedContext(text, files)


def build_image(
    lock,
    context: RenderedContext,
    progress: Progress = silent,
) -> str:
    """Build the image with the Docker SDK, streaming its output to `progress`; returns the tag.

    Raises:
        DdtreeOpsError: Docker is unreachable or the build failed (with the failing step's output).
    """
    docker = docker_sdk()
    if docker is None:
        raise ConfigError("container mode needs the Docker SDK on this machine: pip install docker") from None
    tag = image_tag(lock)
    with tempfile.TemporaryDirectory(prefix="ddtree-image-") as tmp:
        ctx = Path(tmp)
        (ctx / "Dockerfile").write_text(context.dockerfile)
        for name, source in context.files.items():
            shutil.copy2(source, ctx / name)
        try:
            client = docker.from_env(timeout=600)
            stream = client.api.build(path=str(ctx), tag=tag, rm=True, forcerm=True, decode=True, labels={"ddtree.lock": lock.hash})
            tail: list[str] = []
            for chunk in stream:
                if "stream" in chunk:
                    for line in chunk["stream"].splitlines():
                        if line.strip():
                            tail = (tail + [line])[-40:]
                            progress(line)
                elif "status" in chunk:
                    progress(f"{chunk['status']} {chunk.get('progress', '')}".strip())
                if "error" in chunk:
                    raise DdtreeOpsError(f"building {tag} failed: {chunk['error'].strip()}\n" + "\n".join(tail[-15:]))
        except DdtreeOpsError:
            raise
        except Exception as err:  # noqa: BLE001 - docker.errors.* and connection errors
            raise DdtreeOpsError(f"Docker could not build {tag}: {err}") from None
    return tag


def remote_docker(host: Host) -> str:
    """`docker` on the host, through `sudo -n` for a non-root SSH user (as Ansible's become does)."""
    return "docker" if host.ssh.user == "root" else "sudo -n docker"


def ship_image(host: Host, tag: str, timeout_s: float = 3600, transport: Transport = SSH) -> bool:
    """`docker save TAG | ssh HOST docker load`, skipped when the host already has the tag.

    Streamed: neither side writes the (GB-sized) archive to disk. Returns whether it loaded the image.

    Raises:
        HostError: the host is unreachable, its Docker cannot be used, or the load failed or timed out.
    """
    docker = remote_docker(host)
    check = transport.exec(host, f"{docker} image inspect --format '{{{{.Id}}}}' {tag}", timeout_s=60)
    if check.returncode == 0:
        return False
    if "No such image" not in (check.stderr + check.stdout):
        # Not "absent" but "cannot ask": streaming GBs would only fail at the end.
        raise HostError(f"host {host.name}: cannot query its Docker Engine: {(check.stderr or check.stdout).strip()[-300:]}")
    save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        load = transport.call(host, f"{docker} load", stdin=save.stdout, timeout_s=timeout_s)
    except subprocess.TimeoutExpired:
        save.kill()
        raise HostError(f"host {host.name}: loading {tag} took longer than {timeout_s:.0f}s; check the link, then run provision again") from None
    finally:
        save.stdout.close()
        save_err = save.stderr.read().decode(errors="replace")
        save.wait()
    # The receiving side first: when ssh fails, `docker save` only sees a broken pipe.
    if load.returncode != 0:
        raise HostError(f"host {host.name}: docker load of {tag} failed: {(load.stderr or load.stdout).strip()[-400:]}")
    if save.returncode != 0:
        raise DdtreeOpsError(f"docker save {tag} failed here: {save_err.strip()}")
    return True
