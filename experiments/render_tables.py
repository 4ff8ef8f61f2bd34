"""Render the results tables of README.md and docs/ from the committed files under experiments/results/.

    python experiments/render_tables.py            # rewrite every table between its markers
    python experiments/render_tables.py --check    # exit 1, naming each stale table, if any differs

A table lives in a Markdown file between two marker comments:

    <!-- table:strategies -->
    | ... rendered here ... |
    <!-- /table -->

and NAME (here `strategies`) is one of `TABLES` below. Every number is read from a result file
that a measuring command wrote (`experiments/strategy_choice.py`'s choice.json, `bench speed`'s
speed.json, `bench step`'s reports, `experiments/quality.py`'s quality.md); nothing is
re-measured or re-derived here beyond formatting. A new measurement: re-run the command that
writes the file, then this script; `tests/test_render_tables.py` fails while a committed table
differs from what this script renders.

The README's one figure (`docs/figures/gain_vs_step_time.png`) is drawn from the same files;
what it draws is kept beside it as JSON, and `--check` compares that with the files like a table.
The check uses only the standard library (matplotlib draws the figure, imported only then), so
it runs in a fraction of a second.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

__all__ = ["TABLES", "render", "stale", "stale_figure", "figure_data", "draw_figure", "markdown_files", "main"]

ROOT = Path(__file__).resolve().parent.parent  # the repository
RESULTS = "experiments/results"
CHOICE = f"{RESULTS}/choice/table/choice.json"  # full, plain JAGG, jagg_cv, subsampling (experiments/strategy_choice.py)
CHOICE_CAUSAL = f"{RESULTS}/choice_causal/table/choice.json"  # jagg_causal arms beside full and subsampling
COUNTING = f"{RESULTS}/choice_counting/choice.json"  # every arm graded on the verdict set's counting samples
OBJECTIVES = f"{RESULTS}/objectives"  # forward-process objectives beside full, all/ and counting/ (clock=step)
SPEED = f"{RESULTS}/speed/speed.json"  # python -m jagg_lab.bench speed
STEP_TAILS = f"{RESULTS}/step/default_tails.json"  # python -m jagg_lab.bench step, the default experiment's tails
QUALITY = f"{RESULTS}/quality/quality.md"  # experiments/quality.py
STEP_DIR = f"{RESULTS}/step"
BIAS_MAP = f"{RESULTS}/bias_map/map/map.md"  # experiments/bias_map.py over experiments/bias_map.sh's reports
PAPER_STEP = f"{STEP_DIR}/paper_regime.json"  # python -m jagg_lab.bench step of the paper_* experiments
ROUTING = f"{RESULTS}/bias_map/routing20.json"  # bench bias window_detail=true in the authors' regime

# where each kind of number is argued (links from the README's table)
TRAINING_DOC = "docs/results/training.md"
WHOLE_STEP_DOC = "docs/results/whole_step.md"
LEARNING_DOC = "docs/results/learning.md"

MARKER = re.compile(r"<!-- table:(?P<name>[a-z_]+) -->\n(?P<body>.*?)<!-- /table -->", re.S)


def _load(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _arms(path: str) -> dict[str, dict]:
    return {arm["arm"]: arm for arm in _load(path)["arms"]}


def _choice_arm(name: str) -> tuple[dict, str]:
    """The arm's row and the file it came from: the jagg_causal arms were timed in their own
    `bench arms` run (beside `full`), every other arm in experiments/results/choice/."""
    path = CHOICE_CAUSAL if name.startswith("jagg_causal") else CHOICE
    return _arms(path)[name], path


def _gain(arm: dict, metric: str = "strict") -> str:
    return f"{arm[f'{metric}_gain_mean']:+.3f} +- {arm[f'{metric}_gain_std']:.3f}"


def _items(arm: dict) -> str:
    return f"{arm['items_per_step']:g} ({arm['items_vs_reference']:.2f})"


def _seconds(arm: dict) -> str:
    return f"{arm['gradient_s_per_step']:.2f} ({arm['time_vs_reference']:.2f})"


def _bold(text: str, on: bool) -> str:
    return f"**{text}**" if on else text


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(titles: list[str]) -> list[str]:
    return [_row(titles), "|" + "---|" * len(titles)]


# ---- whole-step ratios -------------------------------------------------------------------
def whole_step_ratios() -> dict[str, tuple[float, str]]:
    """{experiment: (its whole step's seconds / full's, the file)} from every `bench step` report
    that timed `full` beside other experiments with the SDE rollout on the default task (the
    shipped shapes DiT), in float32 and eager as the table's runs trained; empty where no such
    report is committed."""
    ratios = {}
    for path in sorted((ROOT / STEP_DIR).glob("*.json")):
        report = json.loads(path.read_text())
        policy = report.get("setting", {}).get("policy", {})
        if policy.get("checkpoint") != "shipped":
            continue  # another model (e.g. a smoke run of SD3.5-Medium's shape)
        if any(r.get("compile") or r.get("gradient_compile") for r in report["rows"]):
            continue  # a report about compiling: the table's runs trained eager
        sde = {r["experiment"]: r["step_s"] for r in report["rows"]
               if r["rollout"] == "sde" and r.get("precision", "32-true") == "32-true"}
        if "full" in sde:
            for name, seconds in sde.items():
                ratios.setdefault(name, (seconds / sde["full"], path.relative_to(ROOT).as_posix()))
    return ratios


# ---- README: the one results table -------------------------------------------------------
README_ARMS = ["full", "subsample_w6", "subsample_w4", "jagg_w4", "jagg_cv_w4", "jagg_cv_w6",
               "jagg_causal_w4", "jagg_causal_w5", "jagg_causal_w6"]
RECOMMENDED = "subsample_w6"


def _paired_z(name: str, paired: dict[str, dict]) -> str:
    """The paired per-sample test's z against the reference ("-" for the reference itself)."""
    row = paired.get(name)
    if row is None:
        return "-"
    return f"{row['strict_gain'] / row['strict_gain_se']:+.1f}" if row["strict_gain_se"] > 0 else "n/a"


def _linked(title: str, target: str) -> str:
    return f"[{title}]({target})"


def strategies(doc_dir: str = "") -> str:
    """The README's strategy table: per strategy, backward items, gradient-phase and whole-step
    seconds as ratios to `full`; the held-out strict gain over the base on counting (where the gain
    is, the benchmark's grading) with the paired per-sample test against `full`, and on every
    category (mean +- std over training seeds). The cells hold numbers only; each column's header
    links to the document that holds its evidence."""
    learns = f"{doc_dir}{TRAINING_DOC}#which-strategy-learns-unbiased-jagg-subsampling-and-full-over-seeds"
    pick = f"{doc_dir}{TRAINING_DOC}#which-strategy-should-i-use"
    graded = f"{doc_dir}{LEARNING_DOC}#the-strategy-table-graded-on-counting"
    whole = whole_step_ratios()
    graded_file = _load(COUNTING)
    by_category = {arm["arm"]: arm for arm in graded_file["arms"]}
    paired = {r["arm"]: r for r in graded_file["paired"]}
    lines = _header(["strategy", _linked("backward items / step (x `full`)", learns),
                     _linked("gradient-phase s (x `full`)", learns), _linked("whole-step s (x `full`)", f"{doc_dir}{WHOLE_STEP_DOC}"),
                     _linked("strict gain on counting (seeds)", graded), _linked("paired z vs `full`", graded),
                     _linked("strict gain, all categories (seeds)", pick)])
    for name in README_ARMS:
        arm, _ = _choice_arm(name)
        count = by_category[name]
        lines.append(_row([_bold(f"`{name}`", name == RECOMMENDED), f"{arm['items_per_step']:g} ({arm['items_vs_reference']:.2f})",
                           f"{arm['time_vs_reference']:.2f}", f"{whole[name][0]:.2f}" if name in whole else "n/m",
                           f"{_gain(count)} ({count['seeds']})", _paired_z(name, paired), f"{_gain(arm)} ({arm['seeds']})"]))
    return "\n".join(lines)


def readme_objectives(doc_dir: str = "") -> str:
    """The README's objectives table: each arm's whole-step seconds (x `full`) and its strict gain
    on counting and on every category, each with the paired test against `full`; numbers only in
    the cells, the evidence linked from the headers."""
    everything, graded = _load(f"{OBJECTIVES}/all/choice.json"), _load(f"{OBJECTIVES}/counting/choice.json")
    by_category = {arm["arm"]: arm for arm in graded["arms"]}
    paired = {key: {r["arm"]: r for r in result["paired"]} for key, result in (("all", everything), ("counting", graded))}
    compare = f"{doc_dir}docs/objectives.md#how-they-compare"
    lines = _header(["arm", _linked("whole-step s (x `full`)", compare), _linked("strict gain on counting", compare),
                     _linked("paired z vs `full`", compare), _linked("strict gain, all categories", compare),
                     _linked("paired z vs `full`", compare)])
    for arm in everything["arms"]:
        name, seconds = arm["arm"], arm.get("step_s_per_step")
        lines.append(_row([_bold(f"`{name}`", name == "awm"),
                           "-" if seconds is None else f"{seconds:.2f} ({arm['time_vs_reference']:.2f})",
                           _gain(by_category[name]), _paired_z(name, paired["counting"]),
                           _gain(arm), _paired_z(name, paired["all"])]))
    return "\n".join(lines)


# ---- README: the one figure --------------------------------------------------------------
FIGURE = "docs/figures/gain_vs_step_time"  # .json (what is drawn, checked like the tables) and .png


def figure_data() -> dict:
    """What the README's figure draws: every strategy and objective arm's whole-step seconds as a
    ratio to `full`'s (strategies: `bench step` reports, objectives: their own `bench step` run) and
    its per-seed strict gains over the base on the verdict set's counting samples."""
    whole = whole_step_ratios()
    arms = []
    for kind, path in (("strategy", COUNTING), ("objective", f"{OBJECTIVES}/counting/choice.json")):
        for arm in _load(path)["arms"]:
            name = arm["arm"]
            if kind == "strategy":
                ratio = whole[name][0] if name in whole else None
            else:
                ratio = arm["time_vs_reference"] if arm.get("step_s_per_step") else None
            if ratio is None or any(a["arm"] == name for a in arms):
                continue  # not timed as a whole step, or already drawn (full, subsample_w6 are in both)
            arms.append({"arm": name, "kind": kind, "whole_step_vs_full": round(ratio, 4),
                         "strict_gains": [round(r["strict_gain"], 6) for r in arm["runs"]],
                         "strict_gain_mean": round(arm["strict_gain_mean"], 6), "strict_gain_std": round(arm["strict_gain_std"], 6)})
    return {"reads": [COUNTING, f"{OBJECTIVES}/counting/choice.json", STEP_DIR], "arms": arms}


def draw_figure(data: dict, path: Path) -> None:
    """Counting gain against whole-step time, each arm's seeds as dots and its mean +- std as a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm in data["arms"]:
        x, color = arm["whole_step_vs_full"], "tab:red" if arm["kind"] == "objective" else "tab:blue"
        ax.scatter([x] * len(arm["strict_gains"]), arm["strict_gains"], s=10, color=color, alpha=0.35)
        ax.errorbar(x, arm["strict_gain_mean"], yerr=arm["strict_gain_std"], fmt="o", color=color, capsize=3)
        ax.annotate(arm["arm"], (x, arm["strict_gain_mean"]), textcoords="offset points", xytext=(5, 3), fontsize=7)
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.set_xlabel("whole training step, seconds (x full's)")
    ax.set_ylabel("held-out strict gain on counting")
    ax.set_title("100 steps from the shipped base: gain (seeds, mean +- std) against step time", fontsize=9)
    ax.scatter([], [], color="tab:blue", label="gradient strategies (GRPO trajectory)")
    ax.scatter([], [], color="tab:red", label="objectives table (AWM, NFT, the peers' SDE windows)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stale_figure(root: Path = ROOT) -> list[str]:
    """A diff if the committed figure's data differ from what the result files give (or it is missing)."""
    committed = root / f"{FIGURE}.json"
    new = json.dumps(figure_data(), indent=1) + "\n"
    old = committed.read_text() if committed.is_file() else ""
    if new == old and (root / f"{FIGURE}.png").is_file():
        return []
    return ["".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{FIGURE}.json (committed)",
                                         f"{FIGURE}.json (rendered)", n=0)) or f"{FIGURE}.png is missing\n"]


def counting() -> str:
    """experiments/results/choice_counting/: every arm on the verdict set's counting samples."""
    result = _load(COUNTING)
    paired = {r["arm"]: r for r in result["paired"]}
    lines = _header(["arm", "seeds", "backward items / step (x `full`)", "gradient s / step (x `full`)", "strict gain",
                     "vs `full` (its std)", "paired vs `full`", "z", "dense gain", "vs `full` (its std)"])
    for arm in result["arms"]:
        name, ref = arm["arm"], arm["arm"] == "full"
        pair = paired.get(name)
        seconds = _seconds(arm) if arm.get("gradient_s_per_step") else "-"
        lines.append(_row([f"`{name}`", str(arm["seeds"]), _items(arm), seconds, _bold(_gain(arm), ref),
                           "0" if ref else f"{arm['strict_vs_reference_in_std']:+.1f}",
                           "-" if pair is None else f"{pair['strict_gain']:+.3f} +- {pair['strict_gain_se']:.3f}",
                           _paired_z(name, paired), _gain(arm, "dense"),
                           "0" if ref else f"{arm['dense_vs_reference_in_std']:+.1f}"]))
    return "\n".join(lines)


def objectives() -> str:
    """experiments/results/objectives/: each arm's whole-step seconds, its strict gain on counting
    and on every category with the paired test against `full`, and at equal whole-step time
    against `full`'s curve (all categories; `at`: whose end the other's curve is read at)."""
    everything, graded = _load(f"{OBJECTIVES}/all/choice.json"), _load(f"{OBJECTIVES}/counting/choice.json")
    by_category = {arm["arm"]: arm for arm in graded["arms"]}
    paired = {key: {r["arm"]: r for r in result["paired"]} for key, result in (("all", everything), ("counting", graded))}
    at_time = {r["arm"]: r for r in everything["equal_time"]}
    lines = _header(["arm", "seeds", "whole-step s (x `full`)", "strict gain on counting", "paired z vs `full`",
                     "strict gain, all categories", "paired z vs `full`", "equal whole-step time: arm vs `full`"])
    for arm in everything["arms"]:
        name = arm["arm"]
        row = at_time.get(name)
        if row is None:
            equal = "-"
        else:
            steps = f"step {row['steps']:.0f} vs `full`'s {row['reference_steps']:.0f}"
            equal = f"{row['strict_gain_mean']:+.3f} vs {row['reference_strict_gain_mean']:+.3f} ({steps})"
        seconds = arm.get("step_s_per_step")
        lines.append(_row([f"`{name}`", str(arm["seeds"]),
                           "-" if seconds is None else f"{seconds:.2f} ({arm['time_vs_reference']:.2f})",
                           _gain(by_category[name]), _paired_z(name, paired["counting"]),
                           _gain(arm), _paired_z(name, paired["all"]), equal]))
    return "\n".join(lines)


# ---- docs/results/training.md ------------------------------------------------------------
SHOULD_USE = [  # (arm, label, what it means): the notes are the argument of the doc, the numbers come from the files
    ("full", "`full`", "the reference"),
    ("subsample_w6", "`subsample_w6` (3 random steps of 6)", "within one seed std of `full` (0.7 below; 1.0 on counting, paired z -1.9) at equal steps, level with it at equal time"),
    ("subsample_w4", "`subsample_w4` (2 random steps of 4)", "plain JAGG's budget, unbiased: 0.5 std below `full` (0.6 on counting, paired z -1.0)"),
    ("jagg_w4", "`jagg_w4` (plain JAGG)", "biased: 2.0 std below `full`, not above the base; on counting it keeps none of `full`'s gain (paired z -8.9)"),
    ("jagg_cv_w4", "`jagg_cv_w4` (unbiased JAGG)", "learns nearly like `full` (0.2 std below; 0.9 on counting), but saves little"),
    ("jagg_cv_w6", "`jagg_cv_w6`", "unbiased, yet below `subsample_w6` (same items) at every one of five seeds; one collapsed (-0.170)"),
    ("jagg_causal_w4", "`jagg_causal_w4` (knots {0, 3, 4, 5})", "half of subsampling's per-rollout error, trains like `subsample_w4` (0.4 std below `full`), but its 4-knot joint pass is slower per item"),
    ("jagg_causal_w5", "`jagg_causal_w5` (knots {0, 4, 5})", "half of subsampling's error at the same items, yet 0.9 std below `full` and a little below `subsample_w6`"),
    ("jagg_causal_w6", "`jagg_causal_w6` (knots {0, 5})", "a third of the items: does not measurably improve the base"),
]


def should_use() -> str:
    lines = _header(["strategy", "backward items / step (x full)", "gradient s / step, CPU (x full)",
                     "held-out strict gain", "what it means"])
    for name, label, note in SHOULD_USE:
        arm, _ = _choice_arm(name)
        lines.append(_row([label, _items(arm), _seconds(arm), _gain(arm), note]))
    return "\n".join(lines)


CHOICE_LABELS = {"subsample_w4": "subsample_w4 (2 of 4)", "subsample_w6": "subsample_w6 (3 of 6)",
                 "jagg_cv_w6": "jagg_cv_w6 (p = 1)", "jagg_cv_w6_p50": "jagg_cv_w6_p50 (p = 0.5)"}


def choice() -> str:
    """The arms of experiments/results/choice/: gains on the verdict set against `full`."""
    lines = _header(["arm", "seeds", "backward items / step (x full)", "gradient s / step (x full)",
                     "strict gain", "vs full", "dense gain", "vs full"])
    for arm in _load(CHOICE)["arms"]:
        ref = arm["arm"] == "full"
        strong = arm["arm"] == RECOMMENDED
        lines.append(_row([CHOICE_LABELS.get(arm["arm"], arm["arm"]), str(arm["seeds"]), _items(arm), _seconds(arm),
                           _bold(_gain(arm), strong), _bold("0" if ref else f"{arm['strict_vs_reference_in_std']:.1f}", strong),
                           _gain(arm, "dense"), "0" if ref else f"{arm['dense_vs_reference_in_std']:.1f}"]))
    return "\n".join(lines)


EQUAL_TIME_ORDER = ["subsample_w6", "subsample_w4", "jagg_cv_w4", "jagg_w4", "jagg_cv_w6", "jagg_cv_w6_p50"]


def equal_time() -> str:
    """Each arm's 100-step policies against `full`'s curve at the same gradient-phase seconds."""
    rows = {r["arm"]: r for r in _load(CHOICE)["equal_time"]}
    lines = _header(["arm (100 steps)", "gradient s", "`full` at the same seconds", "arm's strict gain",
                     "`full`'s strict gain", "difference"])
    for name in EQUAL_TIME_ORDER:
        r = rows[name]
        lines.append(_row([name, f"{r['gradient_s']:.0f}", f"step {r['reference_steps']:.1f}", _gain(r), _gain(r, "reference_strict"),
                           f"{r['strict_gain_mean'] - r['reference_strict_gain_mean']:+.3f}"]))
    return "\n".join(lines)


def quality() -> str:
    """experiments/quality.py's table as it wrote it."""
    return "\n".join(line for line in (ROOT / QUALITY).read_text().splitlines() if line.startswith("|"))


# ---- docs/results/speed.md and whole_step.md ---------------------------------------------
def speed() -> str:
    lines = _header(["size", "res", "strategy", "W", "backward passes (items)", "gradient phase (s)", "speedup",
                     "whole step (s)", "speedup", "gradient peak memory (MiB)"])
    for r in _load(SPEED)["rows"]:
        lines.append(_row([r["size"], str(r["resolution"]), r["strategy"], str(r["window"]),
                           f"{r['backward_passes']:.0f} ({r['backward_items']:.0f})", f"{r['gradient_s']:.3f}",
                           f"{r['gradient_speedup']:.2f}x", f"{r['step_s']:.3f}", f"{r['step_speedup']:.2f}x",
                           f"{r['peak_memory_mib']:.0f}"]))
    return "\n".join(lines)


TAIL_LABELS = {"sde": "`sde` (default)", "euler": "`euler` (4 steps)"}
BEST_TAIL = "euler:1"  # the setting the doc adopts as opt-in


def step_tails() -> str:
    lines = _header(["rollout", "policy calls", "rollout s", "gradient s", "step s", "step x SDE", "reward vs SDE", "strict vs SDE"])
    for r in _load(STEP_TAILS)["rows"]:
        ref = r["rollout"] == "sde"
        pair = (lambda key: "-" if ref else f"{r[key]:+.3f} +- {r[key + '_se']:.3f}")
        lines.append(_row([TAIL_LABELS.get(r["rollout"], f"`{r['rollout']}`"), str(r["rollout_calls"]), f"{r['rollout_s']:.2f}",
                           f"{r['gradient_s']:.2f}", f"{r['step_s']:.2f}", _bold(f"{r['step_speedup']:.2f}", r["rollout"] == BEST_TAIL),
                           pair("reward_vs_reference"), pair("strict_vs_reference")]))
    return "\n".join(lines)


# ---- docs/results/paper_regime.md -------------------------------------------------------
def bias_map() -> str:
    """experiments/bias_map.py's table as it wrote it."""
    return "\n".join(line for line in (ROOT / BIAS_MAP).read_text().splitlines() if line.startswith("|"))


def routing_windows() -> str:
    """JAGG per window position in the authors' regime: noise levels, routing score, bias and error."""
    report = _load(ROUTING)
    lines = _header(["window", "steps", "noise levels", "routing score", "JAGG z (no bias ~1)", "cos(odd, even mean d)",
                     "per-rollout error / noise of the window's f"])
    for w in report["windows"]:
        lines.append(_row([str(w["position"]), f"{w['steps'][0]}-{w['steps'][-1]}",
                           f"{w['noise_levels'][0]:.2f} -> {w['noise_levels'][1]:.2f}", f"{w['mean_score']:.3f}",
                           f"{w['z']:.2f}", f"{w['halves_cosine']:.2f}", f"{w['rel_error']:.2f}"]))
    return "\n".join(lines)


def paper_step() -> str:
    """The paper_* experiments' steps, timed side by side: backward items and seconds as shares of paper_full's."""
    rows = _load(PAPER_STEP)["rows"]
    ref = next(r for r in rows if r["experiment"] == "paper_full")
    lines = _header(["experiment", "backward items / step (x `paper_full`)", "gradient-phase s (x `paper_full`)",
                     "rollout s", "whole-step s (x `paper_full`)"])
    for r in rows:
        lines.append(_row([f"`{r['experiment']}`", f"{r['backward_items']:g} ({r['backward_items'] / ref['backward_items']:.2f})",
                           f"{r['gradient_s']:.2f} ({r['gradient_s'] / ref['gradient_s']:.2f})", f"{r['rollout_s']:.2f}",
                           f"{r['step_s']:.2f} ({r['step_s'] / ref['step_s']:.2f})"]))
    return "\n".join(lines)


TABLES = {"strategies": strategies, "readme_objectives": readme_objectives, "should_use": should_use, "choice": choice, "equal_time": equal_time, "counting": counting,
          "quality": quality, "speed": speed, "step_tails": step_tails, "objectives": objectives,
          "bias_map": bias_map, "paper_step": paper_step, "routing_windows": routing_windows}


# ---- files -------------------------------------------------------------------------------
def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render(text: str, path: Path, root: Path = ROOT) -> str:
    """`text` with every marked table replaced by its rendering; links inside a table are made
    relative to `path`'s directory (the tables name them from the repository root)."""
    prefix = "../" * len(path.resolve().parent.relative_to(root.resolve()).parts)

    def replace(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise KeyError(f"{path}: unknown table {name!r}; known: {sorted(TABLES)}")
        body = TABLES[name](prefix) if name in ("strategies", "readme_objectives") else TABLES[name]()
        return f"<!-- table:{name} -->\n{body}\n<!-- /table -->"

    return MARKER.sub(replace, text)


def stale(paths: list[Path], root: Path = ROOT) -> list[str]:
    """A unified diff per file whose marked tables differ from their rendering (empty: all current)."""
    diffs = []
    for path in paths:
        text = path.read_text()
        new = render(text, path, root)
        if new != text:
            diffs.append("".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                      f"{path} (committed)", f"{path} (rendered)", n=0)))
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=f"tables: {', '.join(TABLES)}; files: README.md and docs/**/*.md")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed table is stale")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files inside the repository (default: README.md, docs/**/*.md)")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.files] or markdown_files()
    diffs = stale(paths) + (stale_figure() if not args.files else [])
    if args.check:
        sys.stdout.write("".join(diffs))
        if diffs:
            sys.stderr.write(f"render_tables: {len(diffs)} file(s) hold stale tables or figure data; run python experiments/render_tables.py\n")
        return 1 if diffs else 0
    if not args.files and stale_figure():
        (ROOT / FIGURE).parent.mkdir(parents=True, exist_ok=True)
        data = figure_data()
        (ROOT / f"{FIGURE}.json").write_text(json.dumps(data, indent=1) + "\n")
        draw_figure(data, ROOT / f"{FIGURE}.png")
        sys.stdout.write(f"rendered {FIGURE}.png\n")
    for path in paths:
        text = path.read_text()
        new = render(text, path)
        if new != text:
            path.write_text(new)
            sys.stdout.write(f"rendered {path.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
