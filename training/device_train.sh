#!/usr/bin/env bash
# Train the lab pair on a GPU machine and evaluate every drafter snapshot; results in $OUT.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
WORK=/tmp/lab
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
python3 training/train_lab_pair.py --out "$WORK" --device cuda "$@" 2>&1 | grep -v "falling back" | tee "$OUT/train.log"
drafts=$(ls -d "$WORK"/draft-step* | sort -V)
python3 training/eval_acceptance.py --target "$WORK/target" --draft $drafts --device cuda --dtype float32 --json > "$OUT/eval.json" || true
python3 training/eval_acceptance.py --target "$WORK/target" --draft $drafts --device cuda --dtype float32 | tee "$OUT/eval.txt" || true
tar czf "$OUT/lab-target.tgz" -C /tmp lab/target lab/train_log.json
# Each file that comes back must stay under 16 MB: three snapshots per archive.
snaps=($(cd /tmp && ls -d lab/draft-step* | sort -V))
tar czf "$OUT/lab-drafts-1.tgz" -C /tmp "${snaps[@]:0:3}"
tar czf "$OUT/lab-drafts-2.tgz" -C /tmp "${snaps[@]:3:3}"
ls -la "$OUT"
