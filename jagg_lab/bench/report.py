"""The benchmarks' reports as markdown tables and files; the numbers come from
`strategies.bench_strategies` and `speed.bench_speed` unchanged."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

__all__ = ["markdown_table", "strategies_table", "write_strategies", "SPEED_COLUMNS", "speed_table", "write_speed"]


# ---- `strategies` ------------------------------------------------------------------------
def _cell(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def strategies_table(report: dict) -> str:
    lines = ["| strategy | W / spacing / budget | mode | items per pass | status | backward passes | backward items | "
             "time (s) | speedup vs full | peak memory (MiB) | grad cosine |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        bound = r.get("max_pass_items")
        lines.append(f"| {r['strategy']} | {r['window']} | {r['mode']} | {'all' if bound is None else bound} | "
                     f"{r.get('status', 'ok')} | {_cell(r['backward_passes'], '{:.0f}')} | {_cell(r['backward_items'], '{:.0f}')} | "
                     f"{_cell(r['time_s'], '{:.3f}')} | {_cell(r['speedup_vs_full'], '{:.2f}x')} | "
                     f"{_cell(r.get('peak_memory_mib'), '{:.1f}')} | {_cell(r['grad_cosine'], '{:.4f}')} |")
    return "\n".join(lines)


def write_strategies(report: dict, out: str | None) -> None:
    """The report as JSON to `out` (if given) and the table to stdout."""
    if out:
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(f"policy: {report['policy']}; {report['samples']} samples x {report['trained_steps']} trained steps; "
                     f"{report['machine']}\n")
    sys.stdout.write(strategies_table(report) + "\n")


# ---- `speed` -----------------------------------------------------------------------------
# (row key, column title, format), in table order
SPEED_COLUMNS = [("size", "size", "{}"), ("resolution", "res", "{}"), ("strategy", "strategy", "{}"), ("window", "W", "{}"),
                 ("backward_passes", "backward passes", "{:.0f}"), ("backward_items", "backward items", "{:.0f}"),
                 ("gradient_s", "gradient phase (s)", "{:.3f}"), ("gradient_speedup", "speedup (gradient)", "{:.2f}x"),
                 ("step_s", "whole step (s)", "{:.3f}"), ("step_speedup", "speedup (step)", "{:.2f}x"),
                 ("rollout_s", "rollout (s)", "{:.3f}"), ("reward_s", "reward + advantages (s)", "{:.3f}"),
                 ("peak_memory_mib", "gradient peak memory (MiB)", "{:.1f}"), ("weights", "weights", "{}")]


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """rows as a markdown table of `columns` (row key, title, format); "-" where a row has no value."""
    lines = ["| " + " | ".join(title for _, title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join("-" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in columns) + " |")
    return "\n".join(lines)


def speed_table(report: dict) -> str:
    return markdown_table(report["rows"], SPEED_COLUMNS)


def write_speed(report: dict, out: str) -> None:
    """OUT/speed.json, speed.csv and speed.md (machine, settings, table, notes); the table
    also to stdout. Refuses, writing nothing, if `out` was filled while the benchmark ran."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise FileExistsError(f"out: {out_dir} is no longer empty; nothing written")
    (out_dir / "speed.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out_dir / "speed.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(report["rows"][0]))
        writer.writeheader()
        writer.writerows(report["rows"])
    m, a = report["machine"], report["args"]
    header = [
        "# Speed table (`python -m jagg_lab.bench speed`)", "",
        f"Machine: {m['device']}; {m['platform']}; {m['cpu']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads; "
        f"torch {m['torch']}" + (f", CUDA {m['cuda']}" if m["cuda"] else "") + f"; Python {m['python']}; "
        f"load average {m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end.", "",
        f"Settings: {a['prompts']} prompts x {a['group_size']} samples, {a['num_steps']}-step SDE (shift {a['shift']}, "
        f"CFG {a['guidance']}), {report['rows'][0]['trained_steps']} trained steps, {report['dtype']}, "
        f"scale={a['scale']}. Full args in speed.json.", "",
        f"Peak memory: {report['memory_method']}.", "",
    ]
    table = speed_table(report)
    notes = ["", *(f"- {note}" for note in report["notes"])]
    (out_dir / "speed.md").write_text("\n".join(header + [table] + notes) + "\n")
    sys.stdout.write(table + f"\nwrote {out_dir}/speed.json, speed.csv, speed.md\n")
