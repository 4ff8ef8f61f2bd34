#!/usr/bin/env bash
# Strategies through SD3.5-Medium's transformer (random weights, bf16, LoRA r32) on one GPU:
#  - gradient phase at 512 and 1024 px, each strategy with its joint pass whole and bounded to
#    full's rows (max_pass_items=1, "equal memory"), with time, peak memory and status per row;
#  - the same at 1024 px with gradient checkpointing;
#  - whole GRPO steps (rollout with CFG + reward + gradient phase) at 512 px.
# A configuration that runs out of memory is recorded as "oom" and the rest goes on; one
# failing command does not stop the others. About 7 minutes on an 80 GB GPU.
# Usage: bash experiments/gpu_bench.sh OUT_DIR [key=value ...]   (e.g. memory_limit_gib=80 to
#        behave like an 80 GB card on a larger one; the keys go to every strategies run)
set -uo pipefail
out=${1:?usage: gpu_bench.sh OUT_DIR [key=value ...]}
shift
mkdir -p "$out"
common=(strategies policy=sd3_random device=cuda dtype=bfloat16 num_steps=10 shift=3 guidance=4.5 prompts=1
        "modes=[cached]" "knot_budgets=[]" repeats=2 "$@")
status=0
run() {  # run NAME ARGS...: one benchmark; its failure is reported and the script goes on
  local name=$1; shift
  echo "== $name"
  python -m jagg_lab.bench "$@" || { echo "!! $name failed (exit $?)" >&2; status=1; }
}
run sd35m_512 "${common[@]}" resolution=512 group_size=4 "windows=[4,8]" "knot_spacings=[3]" \
    "max_pass_items=[null,1]" out="$out/sd35m_512.json"
run sd35m_1024 "${common[@]}" resolution=1024 group_size=2 "windows=[4,8]" "knot_spacings=[3]" \
    "max_pass_items=[null,1]" out="$out/sd35m_1024.json"
run sd35m_1024_checkpointed "${common[@]}" resolution=1024 group_size=2 gradient_checkpointing=true "windows=[4]" \
    "knot_spacings=[]" "max_pass_items=[null,1]" out="$out/sd35m_1024_checkpointed.json"
run sd35m_512_whole_step speed policy=sd3_random device=cuda dtype=bfloat16 "resolutions=[512]" num_steps=10 shift=3 \
    guidance=4.5 train_fraction=0.6 prompts=1 group_size=4 "windows=[4]" "subsample_windows=[4]" repeats=2 warmup=1 \
    out="$out/sd35m_512_whole_step"
exit $status
