#!/usr/bin/env bash
# Bias and added variance of the strategies at SDE noise levels 0.3 and 0.5 (0.7 is the
# default: experiments/results/bias/noise07.json), side by side, one process per level.
# Usage: bash experiments/bias_noise.sh OUT_DIR [key=value ...]   (e.g. device=cuda, n_rollouts=16;
#        more training-config overrides in OVERRIDES="a=1,b=2"; the interpreter in PYTHON)
set -uo pipefail
out=${1:?usage: bias_noise.sh OUT_DIR [key=value ...]}
shift
mkdir -p "$out"
status=0
for level in 0.3 0.5; do
  "${PYTHON:-python}" -m jagg_lab.bench bias out="$out/noise${level/./}.json" "strategies=[jagg,subsample,jagg_cv,jagg_cv_bend]" \
    "windows=[4,6]" "overrides=[sampler.noise_level=$level${OVERRIDES:+,$OVERRIDES}]" "$@" > "$out/noise${level/./}.log" 2>&1 &
done
for job in $(jobs -p); do wait "$job" || status=1; done
exit $status
