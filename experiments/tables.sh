#!/usr/bin/env bash
# Regenerate the speed table and the quality table (with its reward-curve plots) in one go.
# Usage: bash experiments/tables.sh OUT_DIR [scale=paper] [device=cuda]   (keys both scripts take)
#   OUT_DIR/speed/    speed.{md,csv,json}       (python -m jagg_lab.bench speed)
#   OUT_DIR/quality/  quality.{md,csv,json}, reward_vs_step.png, reward_vs_time.png, ...
# Both refuse an existing output directory. About 34 minutes on 2 CPU cores (5.5 + 28 measured).
set -euo pipefail
out=${1:?usage: tables.sh OUT_DIR [key=value ...]}
shift
if [ -e "$out" ]; then
  echo "tables.sh: $out already exists; choose a new OUT_DIR" >&2
  exit 2
fi
mkdir -p "$out"
python -m jagg_lab.bench speed out="$out/speed" "$@"
python experiments/quality.py out="$out/quality" "$@"
echo "tables in $out/speed/speed.md and $out/quality/quality.md"
