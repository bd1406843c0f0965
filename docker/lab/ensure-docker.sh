#!/usr/bin/env bash
# Make a Docker engine answer on this machine, installing and starting it when needed.
# Idempotent: when `docker info` already answers it does nothing. Used by .ci/run, `make demo`
# and the lab test fixture.
#
# Machines of this kind have the docker client but no engine and no init system to start one,
# so dockerd is started directly in the background (log: $DDTREE_DOCKERD_LOG).
set -euo pipefail

log="${DDTREE_DOCKERD_LOG:-/var/log/ddtree-dockerd.log}"

say() { echo "ensure-docker: $*" >&2; }

engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

# The lab image is built with debootstrap, so it is needed even where an engine already runs.
if command -v docker >/dev/null 2>&1 && engine_answers && command -v debootstrap >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    say "no Docker engine answers and starting one needs root; run this script as root (or start Docker yourself)"
    exit 1
fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]} (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q "${need[@]}" >&2
fi
if command -v docker >/dev/null 2>&1 && engine_answers; then
    exit 0
fi

# overlay2 needs a kernel overlay mount on the backing filesystem; fall back to vfs (slower,
# more disk) when the mount is refused, e.g. inside some sandboxes.
storage_driver() {
    local probe
    probe="$(mktemp -d)"
    mkdir -p "$probe"/{lower,upper,work,merged}
    if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
        umount "$probe/merged"
        rm -rf "$probe"
        echo overlay2
    else
        rm -rf "$probe"
        echo vfs
    fi
}

if ! pgrep -x dockerd >/dev/null 2>&1; then
    driver="$(storage_driver)"
    say "starting dockerd (storage driver $driver, log $log)"
    mkdir -p "$(dirname "$log")"
    # setsid: the engine must outlive the shell (and the test session) that started it.
    setsid nohup dockerd --storage-driver "$driver" >>"$log" 2>&1 </dev/null &
fi

for _ in $(seq 1 60); do
    if engine_answers; then
        say "Docker engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
        exit 0
    fi
    sleep 1
done

say "dockerd did not answer within 60 s; the last lines of $log:"
tail -n 20 "$log" >&2 || true
exit 1
