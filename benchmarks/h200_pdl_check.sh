#!/usr/bin/env bash
# What makes programmatic dependent launch the tree kernels' default (kernels/gdc.py DEFAULT), in one device call:
# 1. the GPU's kernel and SGLang-worker suites with DDTREE_PDL=1 (every TreeStep launches with PDL), verbose, so a
#    run cut by the call's limit still says which tests passed;
# 2. the break-check: the PDL replay test on a copy of the engine whose gdc_enter does not wait
#    (break_gdc_wait.py) must fail.
#   bash benchmarks/h200_pdl_check.sh OUT_DIR [PYTEST_WORKERS [TEST_PATH...]]      (on the GPU host, from the repository root)
# TEST_PATHs (relative to the repository root; a pytest node id, FILE::TEST, too) narrow step 1 to what an earlier,
# cut run did not reach, e.g. tests/ddtree_engine/kernels/test_tree_build.py; by default the kernel and SGLang-worker suites.
set -uo pipefail
OUT=${1:?out dir}; WORKERS=${2:-14}
REPO=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -gt 2 ]; then
  SUITES=("${@:3}")
else
  SUITES=(tests/ddtree_engine/kernels tests/ddtree_engine/sglang_worker)
fi
for path in "${SUITES[@]}"; do
  [ -e "$REPO/${path%%::*}" ] || { echo "h200_pdl_check.sh: no ${path%%::*} under $REPO (TEST_PATHs are relative to the repository root)" >&2; exit 2; }
done
mkdir -p "$OUT"
export TRITON_DEFAULT_FP_FUSION=1 PYTHONUNBUFFERED=1
SUPPORT=$REPO/tests/_support
broken=$(mktemp -d)
cp -r "$REPO/engine_patches/ddtree_engine/src" "$broken/src"
python3 "$REPO/benchmarks/break_gdc_wait.py" "$broken/src" || exit 2
# The break-check first (one test, four shapes): short, and its answer matters whatever the suite reaches.
PYTHONPATH=$broken/src:$SUPPORT python3 -m pytest -q -p no:cacheprovider -n 4 "$REPO/tests/ddtree_engine/kernels/test_gdc.py" \
  -k dependent_launch_step_replays > "$OUT/break_check.txt" 2>&1
rc=$?
# Caught only by the test's own assertions (arrays differing between PDL and plain replays, or from the reference),
# not by an error of another kind (a compile or import failure would also exit 1).
if [ "$rc" -eq 1 ] && grep -q "AssertionError" "$OUT/break_check.txt" \
   && ! grep -qE "CompilationError|ImportError|RuntimeError|ModuleNotFoundError" "$OUT/break_check.txt"; then
  echo "break-check: the replay test fails without the wait, as it must" | tee -a "$OUT/break_check.txt"
else
  echo "break-check: NOT caught (pytest exit $rc; 0 means the test passed without the wait)" | tee -a "$OUT/break_check.txt"
fi
tail -3 "$OUT/break_check.txt"
PYTHONPATH=$REPO/engine_patches/ddtree_engine/src:$SUPPORT DDTREE_PDL=1 python3 -m pytest -v -rfE -p no:cacheprovider \
  -n "$WORKERS" "${SUITES[@]/#/$REPO/}" > "$OUT/suite_pdl.txt" 2>&1
echo "suite with DDTREE_PDL=1: pytest exit $?"
grep -c " PASSED " "$OUT/suite_pdl.txt" | sed 's/^/passed: /'
grep -E " (FAILED|ERROR) " "$OUT/suite_pdl.txt" | head -20
tail -3 "$OUT/suite_pdl.txt"
