#!/usr/bin/env bash
# The shared bundle (../shared/sglang-h200/build-bundle.sh, 48 MiB) and this repository (~18 MiB) are over
# the device's 64 MiB per call. Repack it for the trip: sglang's zip as one solid tar.xz (21 -> 12 MB), the
# other files as they are, and the install script beside them (the device has no ../shared). run.sh takes
# the packed folder as its BUNDLE_DIR and unpacks it there.
#   bash benchmarks/sglang_h200/pack-bundle.sh BUNDLE_DIR PACKED_DIR      (then carry PACKED_DIR)
set -euo pipefail
B=${1:?usage: pack-bundle.sh BUNDLE_DIR PACKED_DIR}; P=${2:?usage: pack-bundle.sh BUNDLE_DIR PACKED_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$P"
cp "$B"/*.whl "$B"/sgl_kernel-*.zip "$P"/
tmp=$(mktemp -d)
python3 -m zipfile -e "$B"/sglang-0.5.23-pruned.zip "$tmp"
tar cJf "$P"/sglang.tar.xz -C "$tmp" .
rm -rf "$tmp"
cp "${INSTALL:-$HERE/../../../shared/sglang-h200/install-on-gpu.sh}" "$P"/install-on-gpu.sh
du -sh "$P"
