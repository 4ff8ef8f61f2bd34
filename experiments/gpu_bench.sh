#!/usr/bin/env bash
# Gradient-phase timing of full vs jagg vs knots through SD3.5-Medium's transformer (random
# weights, bf16, LoRA r32) at 512 and 1024 px on one GPU, side by side in one process per size.
# Usage: bash experiments/gpu_bench.sh OUT_DIR
set -euo pipefail
out=${1:?usage: gpu_bench.sh OUT_DIR}
mkdir -p "$out"
common=(strategies policy=sd3_random device=cuda dtype=bfloat16 num_steps=10 shift=3 guidance=4.5 prompts=1
        "windows=[2,4]" "modes=[cached,interpolated]" "knot_spacings=[3]" "knot_budgets=[]" repeats=2)
python -m jagg_lab.bench "${common[@]}" resolution=512 group_size=4 out="$out/sd35m_512.json"
python -m jagg_lab.bench "${common[@]}" resolution=1024 group_size=2 out="$out/sd35m_1024.json"
