"""The end-of-run summary: steps, time, the training-reward trend, the held-out gain over the
base, where the policy and checkpoints are and the next command to run. Logged (console and
train.log) and written to RUN_DIR/summary.json by `jagg_lab.train` once `fit` returns."""
from __future__ import annotations

import json
import logging
import math
import shlex
import time
from datetime import timedelta
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from jagg_lab.callbacks.heldout import HeldoutEval
from jagg_lab.rundir import evaluate_command, resume_command

__all__ = ["RunSummary"]

log = logging.getLogger(__name__)


def _mean(values: list[float]) -> float:
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


class RunSummary(Callback):
    """Collects the training reward of every rollout (rank 0); `report` writes the summary."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.rewards: list[float] = []
        self.start_step = 0
        self._t0 = time.monotonic()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start_step, self._t0 = trainer.global_step, time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        self.rewards.append(float(trainer.callback_metrics.get("reward", math.nan)))

    def report(self, trainer: L.Trainer, heldout: HeldoutEval, overrides: list[str], interrupted: str | None,
               trained: bool = False) -> dict:
        """The summary as a dict (also logged and written to summary.json). overrides: the run's
        command-line overrides, for the resume command; interrupted: the signal's name, if any;
        trained: the signal came after the last optimizer step (it cut the end-of-run work short)."""
        run, steps = self.run_dir, trainer.global_step
        seconds = time.monotonic() - self._t0
        tail = max(1, math.ceil(len(self.rewards) / 10))
        summary = {
            "steps": steps, "steps_this_run": steps - self.start_step, "time_s": round(seconds, 1),
            "reward_first": _mean(self.rewards[:tail]), "reward_last": _mean(self.rewards[-tail:]), "reward_window": tail,
            "interrupted": interrupted, "policy": str(run / "policy.safetensors"), "checkpoints": str(run / "checkpoints"),
        }
        in_training = interrupted and not trained
        lines = [f"{'interrupted' if in_training else 'finished'} after {steps} steps "
                 f"({summary['steps_this_run']} in this run, {timedelta(seconds=round(seconds))})",
                 f"training reward (mean of the first / last {tail} rollouts): "
                 f"{summary['reward_first']:.3f} -> {summary['reward_last']:.3f}"]
        if heldout.enabled and heldout.latest is not None and heldout.latest.get("gain"):
            latest, gain = heldout.latest, heldout.latest["gain"]
            summary["heldout"] = {"n_samples": heldout.n_samples, "step": latest["step"],
                                  "base": {k: heldout.base[k] for k in ("strict_accuracy", "dense_score")},
                                  "final": {k: latest[k] for k in ("strict_accuracy", "dense_score")},
                                  **{k: v for k, v in gain.items() if k != "per_category"},
                                  "best_step": heldout.best[1], "best_" + heldout.metric: heldout.best[0]}
            lines.append(f"held-out at step {latest['step']} (n={heldout.n_samples}, paired with the base): "
                         f"dense {heldout.base['dense_score']:.3f} -> {latest['dense_score']:.3f} "
                         f"({gain['dense_gain']:+.3f} ± {gain['dense_gain_se']:.3f}), strict "
                         f"{heldout.base['strict_accuracy']:.3f} -> {latest['strict_accuracy']:.3f} "
                         f"({gain['strict_gain']:+.3f} ± {gain['strict_gain_se']:.3f})")
            if heldout.verdict is not None:
                verdict, vgain = heldout.verdict, heldout.verdict["gain"]
                summary["heldout_final"] = {"n_samples": heldout.final_n_samples, "seed": heldout.final_seed, "step": verdict["step"],
                                            **{k: v for k, v in vgain.items() if k != "per_category"}}
                lines.append(f"held-out verdict at step {verdict['step']} (n={heldout.final_n_samples}, seed {heldout.final_seed}, "
                             f"a set apart from the one above; heldout_final.json): dense {vgain['dense_gain']:+.3f} ± "
                             f"{vgain['dense_gain_se']:.3f}, strict {vgain['strict_gain']:+.3f} ± {vgain['strict_gain_se']:.3f} over the base")
            best = "checkpoints/best.ckpt" if heldout.best[1] > 0 and (run / "checkpoints" / "best.ckpt").exists() else "the base"
            lines.append(f"best held-out {heldout.metric}: {heldout.best[0]:.3f} at step {heldout.best[1]} ({best})")
            if heldout.restored is not None:
                summary["policy_step"] = heldout.restored[1]
                lines.append(f"the run went back to that policy (heldout.restore_best): policy.safetensors is of step "
                             f"{heldout.restored[1]}, checkpoints/last.ckpt of step {steps}")
        elif heldout.enabled:
            lines.append("held-out: no final evaluation (interrupted)")
        if interrupted and trained:
            summary["unfinished"] = list(heldout.unfinished)
            lines.append(f"{interrupted} after the last step: " + (f"not finished: {', '.join(heldout.unfinished)}"
                                                                    if heldout.unfinished else "nothing was left unfinished"))
        lines.append(f"policy: {summary['policy']}; checkpoints: {summary['checkpoints']}/ (last.ckpt: step {steps})")
        if in_training:
            summary["next"] = resume_command(run / "checkpoints" / "last.ckpt", overrides)
        elif heldout.unfinished:  # what the held-out work would have measured, by the evaluation command
            settings = heldout.args(trainer.lightning_module.policy, final="held-out verdict" in heldout.unfinished)
            base = run / "checkpoints" / "last.ckpt"  # holds the base's scores: the command grades against them
            summary["next"] = evaluate_command(run, settings, base if base.is_file() else None)
        else:
            summary["next"] = f"python -m jagg_lab.evaluate source=policy run={shlex.quote(str(run))} n_samples=512 seed=1"
        lines.append(f"next: {summary['next']}")
        for line in lines:
            log.info("summary: %s", line)
        (run / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary
