"""Held-out evaluation during training: the policy's verifier scores on fixed held-out prompts
of the shapes world, from fixed noise, so every evaluation of a run (and the base's, at the
start) is paired sample by sample with every other.

At the start the policy is the base: its evaluation is kept (in checkpoints too, so a resumed
run still compares against the policy its first run started from). Every `every` optimizer
steps and at the end, the policy is evaluated again, logged (`heldout.csv`, and the TensorBoard
/ W&B loggers as `heldout/*`), compared with the base (paired gain and its standard error), and
written to `checkpoints/best.ckpt` when it beats every earlier evaluation. With `stop_margin`,
the run stops once the score falls that far below its best.

The settings match `python -m jagg_lab.evaluate` (same defaults): with the same n_samples and
seed, its evaluations see the same prompts and noise as these, and `args` says so.
"""
from __future__ import annotations

import csv
import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from jagg_lab.callbacks.interrupt import SafeStop
from jagg_lab.evaluation import eval_prompts, paired_gain, sample_images, score_images
from jagg_lab.sharding import FSDPStrategy

__all__ = ["HeldoutEval"]

log = logging.getLogger(__name__)

METRICS = ("dense_score", "strict_accuracy")


class HeldoutEval(Callback):
    """n_samples: held-out samples per evaluation (0 = no held-out evaluation at all).
    every: also evaluate every N optimizer steps (0 = only at the start and the end).
    seed, num_steps, guidance, shift, batch_size: as `python -m jagg_lab.evaluate` (ODE sampling).
    metric: what best.ckpt and the early stop follow: dense_score or strict_accuracy.
    stop_margin: stop once the metric is this far below its best (null = never).
    run_dir: where heldout.csv and checkpoints/best.ckpt go."""

    def __init__(self, n_samples: int = 32, every: int = 50, seed: int = 1, num_steps: int = 20, guidance: float = 3.0,
                 shift: float = 1.0, batch_size: int = 64, metric: str = "dense_score", stop_margin: float | None = None,
                 run_dir: str | Path | None = None):
        checks = {"n_samples": n_samples >= 0, "every": every >= 0, "seed": seed >= 0, "num_steps": num_steps >= 1, "guidance": guidance >= 1,
                  "shift": shift > 0, "batch_size": batch_size >= 1, "metric": metric in METRICS,
                  "stop_margin": stop_margin is None or stop_margin > 0}
        bad = [key for key, ok in checks.items() if not ok]
        if bad:
            values = dict(n_samples=n_samples, every=every, seed=seed, num_steps=num_steps, guidance=guidance, shift=shift,
                          batch_size=batch_size, metric=metric, stop_margin=stop_margin)
            raise ValueError(", ".join(f"heldout.{key} = {values[key]!r} is invalid" for key in bad)
                             + " (n_samples, every, seed >= 0; num_steps, batch_size >= 1; guidance >= 1; shift > 0; "
                             f"metric one of {METRICS}; stop_margin > 0 or null)")
        self.n_samples, self.every, self.seed, self.metric, self.stop_margin = n_samples, every, seed, metric, stop_margin
        self.num_steps, self.guidance, self.shift, self.batch_size = num_steps, guidance, shift, batch_size
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.base: dict | None = None  # the base policy's evaluation
        self.best: tuple[float, int] | None = None  # (score, step); step 0 = the base
        self.latest: dict | None = None  # the last evaluation, with its step and gains

    @property
    def enabled(self) -> bool:
        return self.n_samples > 0

    def args(self, policy) -> dict:
        """The evaluation's settings, as `python -m jagg_lab.evaluate` records them."""
        return {"source": "policy", "n_samples": self.n_samples, "seed": self.seed, "split": "heldout",
                "resolution": policy.sample_shape[-1], "num_steps": self.num_steps, "guidance": self.guidance,
                "shift": self.shift, "noise_level": 0.0, "batch_size": self.batch_size}

    def evaluate(self, policy) -> dict:
        """Scores of `policy` on the held-out prompts; the global random state is left untouched,
        so evaluating does not change training (exact resume holds whenever it runs)."""
        prompts = eval_prompts(self.n_samples, self.seed)
        training = policy.training
        policy.eval()
        with torch.random.fork_rng(devices=[]):
            images = sample_images(policy, prompts, seed=self.seed, num_steps=self.num_steps, guidance=self.guidance,
                                   shift=self.shift, batch_size=self.batch_size)
        policy.train(training)
        return {"args": self.args(policy), **score_images(images, prompts)}

    # ---- hooks -----------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and isinstance(trainer.strategy, FSDPStrategy):
            # Sampling on rank 0 alone would wait forever for the other ranks' weight shards.
            log.warning("held-out evaluation is off under FSDP (sharded weights); evaluate the exported policy instead")
            self.n_samples = 0
        if not self.enabled:
            return
        if self.base is not None and self.base["args"] != self.args(pl_module.policy):
            log.warning("held-out settings differ from the resumed run's: gains are measured from this resume on")
            self.base = self.best = None
        if self.base is None and trainer.is_global_zero:
            self.base = self.evaluate(pl_module.policy)
            self._record(trainer, self.base, trainer.global_step)
        self.base = trainer.strategy.broadcast(self.base, src=0)
        if self.best is None:
            self.best = (self.base[self.metric], trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if self.enabled and self.every and trainer.global_step % self.every == 0:
            self._check(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        done = self.latest is not None and self.latest["step"] == trainer.global_step
        interrupted = any(isinstance(c, SafeStop) and c.signal is not None for c in trainer.callbacks)
        if self.enabled and not interrupted and not done:  # an interrupted run ends at once
            self._check(trainer, pl_module)

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Evaluate (rank 0), then, on every rank: best.ckpt, early stop."""
        result = self.evaluate(pl_module.policy) if trainer.is_global_zero else None
        if result is not None:
            self._record(trainer, result, trainer.global_step)
        score = trainer.strategy.broadcast(result[self.metric] if result is not None else None, src=0)
        if score > self.best[0]:
            self.best = (score, trainer.global_step)
            trainer.save_checkpoint(self.run_dir / "checkpoints" / "best.ckpt")
            log.info("held-out %s %.3f: new best, wrote checkpoints/best.ckpt", self.metric, score)
        elif self.stop_margin is not None and score < self.best[0] - self.stop_margin:
            log.warning("held-out %s %.3f fell more than %g below its best %.3f (step %d): stopping early",
                        self.metric, score, self.stop_margin, *self.best)
            trainer.should_stop = True

    def _record(self, trainer: L.Trainer, result: dict, step: int) -> None:
        """Log one evaluation (rank 0): heldout.csv, the non-CSV loggers, the console."""
        gain = paired_gain(result, self.base) if self.base is not None else {}
        row = {"step": step, "strict_accuracy": result["strict_accuracy"], "dense_score": result["dense_score"],
               **{k: v for k, v in gain.items() if k.endswith(("_gain", "_gain_se"))}}
        self.latest = {**result, **row, "gain": gain}
        path = self.run_dir / "heldout.csv"
        new = not path.exists()
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["step", "strict_accuracy", "dense_score", "strict_gain",
                                                   "strict_gain_se", "dense_gain", "dense_gain_se"], restval="")
            if new:
                writer.writeheader()
            writer.writerow(row)
        for logger in trainer.loggers:
            if not isinstance(logger, CSVLogger):  # metrics.csv keeps one row per optimizer step
                logger.log_metrics({f"heldout/{k}": v for k, v in row.items() if k != "step"}, step=step)
        text = f"held-out (n={self.n_samples}) at step {step}: strict {row['strict_accuracy']:.3f}, dense {row['dense_score']:.3f}"
        if gain:
            text += f"; vs base: dense {gain['dense_gain']:+.3f} ± {gain['dense_gain_se']:.3f}, strict {gain['strict_gain']:+.3f} ± {gain['strict_gain_se']:.3f}"
        log.info(text)

    # ---- checkpoints: the base and the best survive a resume ---------------------------
    def state_dict(self) -> dict:
        return {"base": self.base, "best": list(self.best) if self.best is not None else None}

    def load_state_dict(self, state_dict: dict) -> None:
        self.base = state_dict["base"]
        self.best = tuple(state_dict["best"]) if state_dict["best"] is not None else None

