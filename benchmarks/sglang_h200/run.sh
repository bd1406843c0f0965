#!/usr/bin/env bash
# DDTREE in stock SGLang 0.5.23 on an H200, from the shared ~50 MiB bundle (shared/sglang-h200).
# Each configuration runs in its own process (sglang.Engine, input_ids in, ids out, T = 0);
# every DDTREE / DFLASH output is compared with the same pair's AR output.
#   [PAR=N] bash benchmarks/sglang_h200/run.sh BUNDLE_DIR OUT_DIR 'CONFIGS_JSON'      (lossless.py)
# BUNDLE_DIR: the shared recipe's bundle, or that bundle packed by pack-bundle.sh (what fits a device call).
#   SCRIPT=step_cost bash benchmarks/sglang_h200/run.sh BUNDLE_DIR OUT_DIR 'GROUPS_JSON'   (step_cost.py)
#   SCRIPT=gdn_kernel bash benchmarks/sglang_h200/run.sh BUNDLE_DIR OUT_DIR '{}'          (gdn_verify_kernel.py)
#   SCRIPT=conv_kernel bash benchmarks/sglang_h200/run.sh BUNDLE_DIR OUT_DIR '{}'         (conv_verify_kernel.py)
# CONFIGS_JSON: [{"label": "lab ar", "pair": "lab"},
#                {"label": "lab ddtree 15/8", "pair": "lab", "algo": "DDTREE",
#                 "ddt": {"speculative_ddtree_budget": 15, "speculative_ddtree_topk": 8}}, ...]
# pairs: lab (the shipped qwen3_5_text hybrid lab pair) and q3 (make-tiny-pair --arch qwen3).
set -euo pipefail
BUNDLE=${1:?bundle dir}; OUT=${2:?out dir}; CONFIGS=${3:?configs json}
SITE=${SITE:-/tmp/site}
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
if [ ! -f "$SITE/.ok" ]; then
  INSTALL=${INSTALL:-$REPO/../shared/sglang-h200/install-on-gpu.sh}
  if [ -f "$BUNDLE/sglang.tar.xz" ]; then
    # A bundle packed by pack-bundle.sh: rebuild sglang's zip, use the install script that travelled with it.
    unpacked=$(mktemp -d); tree=$(mktemp -d)
    cp "$BUNDLE"/*.whl "$BUNDLE"/sgl_kernel-*.zip "$unpacked"/
    tar xJf "$BUNDLE/sglang.tar.xz" -C "$tree"
    python3 -c "import shutil, sys; shutil.make_archive(sys.argv[1], 'zip', sys.argv[2])" "$unpacked/sglang-0.5.23-pruned" "$tree"
    [ -f "$INSTALL" ] || INSTALL=$BUNDLE/install-on-gpu.sh
    BUNDLE=$unpacked
  fi
  bash "$INSTALL" "$BUNDLE" "$SITE"
  touch "$SITE/.ok"
fi
# The engine's entry point, as its wheel declares it (engine_patches/ddtree_engine/pyproject.toml).
mkdir -p "$SITE/ddtree_engine_ep-0.0.dist-info"
printf 'Metadata-Version: 2.1\nName: ddtree-engine-ep\nVersion: 0.0\n' > "$SITE/ddtree_engine_ep-0.0.dist-info/METADATA"
printf '[sglang.srt.plugins]\nddtree = ddtree_engine.sglang_plugin:register\n' > "$SITE/ddtree_engine_ep-0.0.dist-info/entry_points.txt"
export PYTHONPATH=$SITE:$REPO/engine_patches/ddtree_engine/src SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
M=/tmp/models; mkdir -p $M "$OUT"
[ -d $M/q3 ] || python3 -m ddtree_engine.cli make-tiny-pair $M/q3 --arch qwen3 >/dev/null
# The q3 pair's prompts: the 4 of 64 candidates with the widest fp32 top-2 margins, so bf16 cannot flip a
# greedy choice and a token-exact comparison tests the algorithm (pick_prompts.py).
[ -f $M/q3_prompts.json ] || python3 "$HERE/pick_prompts.py" $M/q3/target $M/q3_prompts.json
rm -rf $M/lab && mkdir -p $M/lab
cp -r "$REPO/engine_patches/ddtree_engine/src/ddtree_engine/lab_models/target" "$REPO/engine_patches/ddtree_engine/src/ddtree_engine/lab_models/draft" $M/lab/
cp "$HERE/lab_prompts.json" $M/lab_prompts.json   # the compare prompts (builtin + 3 held-out), chat-templated
cp -r "$HERE/configs/." $M/   # the dummy-weight models (configs only): step cost, and the budget that does not fit
if [ "${SCRIPT:-lossless}" = conv_kernel ]; then
  # SGLang's tree conv update against the engine's (DDTREE_SGLANG_TREE_CONV), and the chain conv.
  python3 "$HERE/conv_verify_kernel.py" "$OUT"
elif [ "${SCRIPT:-lossless}" = gdn_kernel ]; then
  # SGLang's tree-verify gated-delta kernel: stock, with the parent reload skipped, and chain (DFLASH's).
  python3 "$HERE/gdn_verify_kernel.py" "$OUT"
elif [ "${SCRIPT:-lossless}" = step_cost ]; then
  # Step cost (issue 12): CONFIGS_JSON is step_cost.py's groups.
  python3 "$HERE/step_cost.py" $M "$OUT" "$CONFIGS"
else
  python3 "$HERE/lossless.py" $M "$OUT/sglang_h200_lossless.json" "$CONFIGS"
fi
