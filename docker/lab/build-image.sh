#!/usr/bin/env bash
# Build the lab host image (Debian bookworm running systemd and sshd) without any registry:
# debootstrap a root filesystem from the Debian mirror, `docker import` it, then `docker build`
# docker/lab/Dockerfile on top. Reused when the tag already exists; the root filesystem tarball is
# cached, so a rebuild after `docker rmi` takes seconds.
#
# usage: build-image.sh TAG   (env: DDTREE_LAB_CACHE, DDTREE_DEBIAN_MIRROR)
set -euo pipefail

tag="${1:?usage: build-image.sh TAG}"
here="$(cd "$(dirname "$0")" && pwd)"
cache="${DDTREE_LAB_CACHE:-$HOME/.cache/ddtree-ops/lab}"
mirror="${DDTREE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Bump when the package list changes, so a stale cached tarball is not reused.
rootfs_version=1
rootfs_tar="$cache/debian-bookworm-rootfs-v$rootfs_version.tar"
base_tag="ddtree-lab-base:bookworm-v$rootfs_version"
# bookworm's python3 is 3.11: the same interpreter the control node builds the wheelhouse for.
packages=systemd,systemd-sysv,dbus,openssh-server,python3,python3-venv,sudo,iproute2,procps,ca-certificates,curl

say() { echo "build-image: $*" >&2; }

if docker image inspect "$tag" >/dev/null 2>&1; then
    say "$tag is present; reusing it"
    exit 0
fi

if [ ! -s "$rootfs_tar" ]; then
    command -v debootstrap >/dev/null 2>&1 || { say "debootstrap is missing: apt-get install debootstrap"; exit 1; }
    [ "$(id -u)" = 0 ] || { say "debootstrap needs root"; exit 1; }
    mkdir -p "$cache"
    work="$(mktemp -d "$cache/rootfs.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    say "debootstrap bookworm into $work (a few minutes)"
    debootstrap --variant=minbase --include="$packages" bookworm "$work/root" "$mirror" >&2
    # What the image does not need: package caches, and identities that must differ per host.
    rm -rf "$work/root"/var/cache/apt/archives/*.deb "$work/root"/var/lib/apt/lists/*
    rm -f "$work/root"/etc/ssh/ssh_host_*
    : >"$work/root/etc/machine-id"
    tar -C "$work/root" --numeric-owner -cf "$rootfs_tar.part" .
    mv "$rootfs_tar.part" "$rootfs_tar"
    say "cached the root filesystem at $rootfs_tar"
fi

if ! docker image inspect "$base_tag" >/dev/null 2>&1; then
    say "docker import $rootfs_tar as $base_tag"
    docker import "$rootfs_tar" "$base_tag" >&2
fi

say "docker build $tag"
DOCKER_BUILDKIT=0 docker build --build-arg "BASE=$base_tag" -t "$tag" "$here" >&2
say "built $tag"
