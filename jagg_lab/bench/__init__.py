"""Benchmarks that print ratios measured side by side in one run.

    python -m jagg_lab.bench strategies out=FILE.json [key=value ...]
    python -m jagg_lab.bench speed out=DIR [scale=cpu|paper] [device=cuda dtype=bfloat16] [key=value ...]
    python -m jagg_lab.bench COMMAND --help      (the command's keys, types and defaults)

common.py: the module, one rollout's advantages, the timed gradient phase (the training
step's `GRPOObjective.backward`), the machine. strategies.py: the gradient phase of many
strategies on one rollout, with each gradient's cosine to full's. speed.py: whole GRPO steps
per DiT size x resolution x strategy, with peak memory. report.py: tables and files.
"""
from jagg_lab.bench.common import advantages, dit_policy, gradient_phase, grouped_prompts, grpo_module, machine
from jagg_lab.bench.report import speed_table, strategies_table, write_speed, write_strategies
from jagg_lab.bench.speed import SpeedArgs, bench_speed, peak_memory_mib
from jagg_lab.bench.strategies import StrategiesArgs, bench_strategies, strategy_configs

__all__ = [
    "StrategiesArgs", "bench_strategies", "strategy_configs", "SpeedArgs", "bench_speed", "peak_memory_mib",
    "strategies_table", "write_strategies", "speed_table", "write_speed",
    "dit_policy", "grpo_module", "grouped_prompts", "advantages", "gradient_phase", "machine",
]
