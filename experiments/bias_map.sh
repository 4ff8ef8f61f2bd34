#!/usr/bin/env bash
# The bias map: plain JAGG against `subsample` at equal backward items (2 per window) as a
# function of the steps per trajectory and the window W, i.e. of the noise span of a window.
# One `bench bias` process per column, one after the other (torch jobs sharing cores slow each
# other far more than 2x), each on its own rollouts of the training setting it names:
#   paper20  the JAGG authors' regime: 20 SDE steps, every step trained (their random 60 % of
#            windows only picks which windows train; the bias of a window does not depend on it), W = 5
#   steps10, steps20, steps40: the project's regime (the first 60 % of the steps trained, from the
#            high-noise end) at 10, 20 and 40 steps, W = 3, 4, 5, 8
#   routing20 paper20's setting with window_detail: JAGG's bias and error per window position, the
#            routing score of each window, and how well the score predicts JAGG's error there
# A column that fails is recorded in OUT/failed.txt and the next one runs.
# Usage: bash experiments/bias_map.sh OUT_DIR [COLUMN ...] [-- key=value ...]
#   (columns: paper20 steps10 steps20 steps40 routing20, all by default; key=value goes to every bench bias,
#    e.g. device=cuda; the interpreter in PYTHON; N10, N20, N40, NPAPER, NROUTE set the rollouts per column)
# Then: python experiments/bias_map.py OUT_DIR   (table and figure)
set -uo pipefail
out=${1:?usage: bias_map.sh OUT_DIR [COLUMN ...] [-- key=value ...]}
shift
columns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do columns+=("$1"); shift; done
[ $# -gt 0 ] && shift
extra=("$@")
[ ${#columns[@]} -eq 0 ] && columns=(paper20 steps20 steps40 routing20 steps10)
mkdir -p "$out"

run() {  # run COLUMN N_ROLLOUTS WINDOWS OVERRIDES [key=value ...]
  local name=$1 n=$2 windows=$3 overrides=$4
  shift 4
  if [ -e "$out/$name.json" ]; then
    echo "$name: $out/$name.json exists, skipped" >&2
    return 0
  fi
  if ! "${PYTHON:-python}" -m jagg_lab.bench bias out="$out/$name.json" "strategies=[jagg,subsample]" \
      "windows=[$windows]" n_rollouts="$n" "overrides=[$overrides]" "$@" ${extra[@]+"${extra[@]}"} > "$out/$name.log" 2>&1; then
    echo "$name: failed, see $out/$name.log" | tee -a "$out/failed.txt" >&2
  fi
}

for column in "${columns[@]}"; do
  case $column in
    paper20) run paper20 "${NPAPER:-32}" 5 "sampler.num_steps=20,grpo.train_fraction=1.0" ;;
    steps10) run steps10 "${N10:-32}" 3,4,5,8 "sampler.num_steps=10" ;;
    steps20) run steps20 "${N20:-32}" 3,4,5,8 "sampler.num_steps=20" ;;
    steps40) run steps40 "${N40:-16}" 3,4,5,8 "sampler.num_steps=40" ;;
    routing20) run routing20 "${NROUTE:-16}" 5 "sampler.num_steps=20,grpo.train_fraction=1.0" window_detail=true ;;
    *) echo "unknown column $column (paper20 steps10 steps20 steps40 routing20)" | tee -a "$out/failed.txt" >&2 ;;
  esac
done
[ ! -e "$out/failed.txt" ]
