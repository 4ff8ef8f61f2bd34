"""Held-out evaluation during training: the policy's verifier scores on fixed held-out prompts
of the shapes world, from fixed noise, so every evaluation of a run (and the base's, at the
start) is paired sample by sample with every other.

At the start the policy is the base: its evaluation is kept (in checkpoints too, so a resumed
run still compares against the policy its first run started from). Every `every` optimizer
steps and at the end, the policy is evaluated again, logged (`heldout.csv`, and the TensorBoard
/ W&B loggers as `heldout/*`), compared with the base (paired gain and its standard error), and
written to `checkpoints/best.ckpt` when it beats every earlier evaluation. With `stop_margin`,
the run stops once the score falls that far below its best. With `restore_best`, a run that
ends (by its step budget or the early stop, not by a signal) goes back to its best held-out
policy: `policy.safetensors` and the verdict are then the best's (the base's, written to
best.ckpt at the start, when no evaluation beat it), while `checkpoints/last.ckpt` still
resumes the last step.

With `final_n_samples`, the run ends with a verdict on a second, larger set (its own seed,
`final_seed`, so the set that picked best.ckpt does not grade it): the run's policy against the
base on the same samples, in `heldout_final.json`, the loggers (`heldout_final/*`) and the
summary. The base's scores on that set are evaluated at the start, unless a stored evaluation of
the very same weights and settings ships with the package (the shipped base's does).

Evaluations of more than one batch log their progress (samples done / total, ETA). The end-of-run
ones run after `checkpoints/last.ckpt` is written; a SIGINT / SIGTERM there stops them after the
batch in progress, the policy is still exported, and `unfinished` names what was left (the
summary gives the command that finishes it).

The settings match `python -m jagg_lab.evaluate` (same defaults): with the same n_samples and
seed, its evaluations see the same prompts and noise as these, and `args` says so.
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from jagg_lab.callbacks.interrupt import SafeStop
from jagg_lab.callbacks.progress import SampleProgress
from jagg_lab.evaluation import eval_prompts, paired_gain, sample_images, score_images
from jagg_lab.evaluation.samples import check_categories
from jagg_lab.sharding import FSDPStrategy
from jagg_lab.worlds.shapes import CATEGORIES

__all__ = ["HeldoutEval", "policy_fingerprint", "stored_evaluation"]

STORED = Path(__file__).resolve().parent.parent / "assets" / "heldout"  # stored evaluations of shipped policies

log = logging.getLogger(__name__)

METRICS = ("dense_score", "strict_accuracy")


class EvaluationCut(Exception):
    """A signal arrived during an end-of-run evaluation: it stopped after the batch in progress."""


class HeldoutEval(Callback):
    """n_samples: held-out samples per evaluation (0 = no held-out evaluation at all).
    every: also evaluate every N optimizer steps (0 = only at the start and the end).
    seed, num_steps, guidance, shift, batch_size: as `python -m jagg_lab.evaluate` (ODE sampling).
    metric: what best.ckpt and the early stop follow: dense_score or strict_accuracy.
    stop_margin: stop once the metric is this far below its best (null = never).
    restore_best: end the run with the best held-out policy instead of the last.
    final_n_samples: held-out samples of the end-of-run verdict (0 or null = none beyond the periodic ones).
    final_seed: the verdict's prompts and noise (a set apart from `seed`'s).
    categories: evaluate (and give the verdict) on these shapes categories only, in turn (null: all
    six); the held-out task of a run that trains on data.categories.
    run_dir: where heldout.csv and checkpoints/best.ckpt go."""

    def __init__(self, n_samples: int = 32, every: int = 50, seed: int = 1, num_steps: int = 20, guidance: float = 3.0,
                 shift: float = 1.0, batch_size: int = 64, metric: str = "dense_score", stop_margin: float | None = None,
                 restore_best: bool = False, final_n_samples: int | None = None, final_seed: int = 2,
                 run_dir: str | Path | None = None, categories: list[str] | None = None):
        checks = {"n_samples": n_samples >= 0, "every": every >= 0, "seed": seed >= 0, "num_steps": num_steps >= 1, "guidance": guidance >= 1,
                  "shift": shift > 0, "batch_size": batch_size >= 1, "metric": metric in METRICS,
                  "stop_margin": stop_margin is None or stop_margin > 0,
                  "final_n_samples": final_n_samples is None or final_n_samples >= 0, "final_seed": final_seed >= 0}
        bad = [key for key, ok in checks.items() if not ok]
        if bad:
            values = dict(n_samples=n_samples, every=every, seed=seed, num_steps=num_steps, guidance=guidance, shift=shift,
                          batch_size=batch_size, metric=metric, stop_margin=stop_margin,
                          final_n_samples=final_n_samples, final_seed=final_seed)
            raise ValueError(", ".join(f"heldout.{key} = {values[key]!r} is invalid" for key in bad)
                             + " (n_samples, every, seed >= 0; num_steps, batch_size >= 1; guidance >= 1; shift > 0; "
                             f"metric one of {METRICS}; stop_margin > 0 or null; final_seed >= 0)")
        self.n_samples, self.every, self.seed, self.metric, self.stop_margin = n_samples, every, seed, metric, stop_margin
        self.num_steps, self.guidance, self.shift, self.batch_size = num_steps, guidance, shift, batch_size
        self.final_n_samples, self.final_seed, self.restore_best = final_n_samples, final_seed, restore_best
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.categories = None if categories is None else list(check_categories(categories, "heldout.categories"))
        self.base: dict | None = None  # the base policy's evaluation
        self.best: tuple[float, int] | None = None  # (score, step); step 0 = the base
        self.latest: dict | None = None  # the last evaluation, with its step and gains
        self.final_base: dict | None = None  # the base's evaluation on the verdict's set
        self.verdict: dict | None = None  # the final policy's, with its step and gains
        self.restored: tuple[float, int] | None = None  # (score, step) of the best policy the run went back to
        self.best_file: Path | None = None  # the best.ckpt holding `best` (a resumed run's may be its first run's)
        self.unfinished: list[str] = []  # end-of-run work a signal cut short
        self._stop: SafeStop | None = None  # set during the end-of-run evaluations: what cuts them short

    @property
    def enabled(self) -> bool:
        return self.n_samples > 0

    def args(self, policy, final: bool = False) -> dict:
        """The evaluation's (or the verdict's) settings, as `python -m jagg_lab.evaluate` records them."""
        n, seed = (self.final_n_samples, self.final_seed) if final else (self.n_samples, self.seed)
        return {"source": "policy", "n_samples": n, "seed": seed, "split": "heldout",
                "resolution": policy.sample_shape[-1], "num_steps": self.num_steps, "guidance": self.guidance,
                "shift": self.shift, "noise_level": 0.0, "batch_size": self.batch_size,
                **({"categories": self.categories} if self.categories is not None else {})}

    def evaluate(self, policy, final: bool = False) -> dict:
        """Scores of `policy` on the held-out prompts (the verdict's set if `final`); the global
        random state is left untouched, so evaluating does not change training (exact resume
        holds whenever it runs)."""
        args = self.args(policy, final)
        prompts = eval_prompts(args["n_samples"], args["seed"], categories=self.categories)
        training = policy.training
        policy.eval()
        label = "held-out verdict" if final else "held-out evaluation"
        stop = self._stop
        progress = SampleProgress(label, len(prompts), should_stop=None if stop is None else (lambda: stop.stopping),
                                  stop_error=EvaluationCut)
        try:
            with torch.random.fork_rng(devices=[]):
                images = sample_images(policy, prompts, seed=args["seed"], num_steps=self.num_steps, guidance=self.guidance,
                                       shift=self.shift, batch_size=self.batch_size, on_batch=progress)
        finally:
            policy.train(training)
        return {"args": args, **score_images(images, prompts)}

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
        self._prepare_verdict(trainer, pl_module.policy)
        if self.best is None:
            self.best = (self.base[self.metric], trainer.global_step)
            if self.restore_best:  # the start's policy, so that there is always a best to go back to
                self._save_best(trainer)

    def _prepare_verdict(self, trainer: L.Trainer, policy) -> None:
        """The base's scores on the verdict set (rank 0, which alone grades): kept from the run's
        start, found stored for these very weights, or scored now at step 0."""
        if not self.final_n_samples or not trainer.is_global_zero:
            return
        if self.final_base is not None and self.final_base["args"] != self.args(policy, True):
            self.final_base = None  # the resumed run's verdict was on another set: no base for this one
            log.warning("held-out verdict settings differ from the resumed run's: no final verdict against the base")
        elif self.final_base is None and trainer.global_step > 0:
            log.warning("no held-out verdict: the run did not score the base on the verdict set at its start "
                        "(set heldout.final_n_samples from the first run on)")
        elif self.final_base is None:
            self.final_base = stored_evaluation(policy, self.args(policy, True))
            if self.final_base is None:
                log.info("held-out verdict set (n=%d, seed %d): scoring the base", self.final_n_samples, self.final_seed)
                self.final_base = self.evaluate(policy, final=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if self.enabled and self.every and trainer.global_step % self.every == 0:
            self._check(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        done = self.latest is not None and self.latest["step"] == trainer.global_step
        stop = next((c for c in trainer.callbacks if isinstance(c, SafeStop)), None)
        if not self.enabled or (stop is not None and stop.stopping and not stop.after_training):
            return  # a run interrupted in training ends at once; one stopped in its last step says what it left
        self._stop = stop
        try:
            self._end(trainer, pl_module, done)
        finally:
            self._stop = None

    def _end(self, trainer: L.Trainer, pl_module: L.LightningModule, done: bool) -> None:
        """The end-of-run evaluation, the way back to the best policy and the verdict, until a signal."""
        verdict = ["held-out verdict"] if self.final_base is not None else []
        if not done and not self._check(trainer, pl_module):
            self.unfinished = ["end-of-run held-out evaluation",
                               *(["going back to the best held-out policy"] if self.restore_best else []), *verdict]
            log.warning("held-out: interrupted, not finished: %s", ", ".join(self.unfinished))
            return
        if self.restore_best and self.best[1] != trainer.global_step:
            self._restore(trainer, pl_module)
        if verdict and trainer.is_global_zero:
            try:
                self._verdict(trainer, pl_module)
            except EvaluationCut as cut:
                self.unfinished = verdict
                log.warning("%s: no verdict (heldout_final.json is not written)", cut)

    @property
    def best_path(self) -> Path:
        return self.run_dir / "checkpoints" / "best.ckpt"

    def _save_best(self, trainer: L.Trainer) -> None:
        self.best_file = self.best_path  # before saving: the checkpoint records where its best is
        # The whole state, as last.ckpt; said rather than left to Lightning, which logs that it chose.
        trainer.save_checkpoint(self.best_path, weights_only=False)

    def _restore(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Every rank loads best.ckpt's weights into the module (before it exports its policy)."""
        if self.best_file is None or not self.best_file.is_file():
            log.warning("heldout.restore_best: no checkpoint of the best held-out policy (step %d) is at hand (%s); "
                        "the run ends with its last policy", self.best[1], self.best_file or "none written")
            return
        trainer.strategy.barrier()
        pl_module.load_state_dict(trainer.strategy.load_checkpoint(self.best_file)["state_dict"])
        self.restored = self.best
        log.info("held-out: went back to the best policy, step %d (%s %.3f): policy.safetensors and the verdict are "
                 "of it; checkpoints/last.ckpt still resumes step %d", self.best[1], self.metric, self.best[0],
                 trainer.global_step)

    def _verdict(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The run's policy (the best, if restored) against the base on the verdict's set:
        heldout_final.json, loggers, console."""
        result = self.evaluate(pl_module.policy, final=True)
        gain = paired_gain(result, self.final_base)
        step = self.restored[1] if self.restored is not None else trainer.global_step  # whose weights were graded
        self.verdict = {**result, "step": step, "gain": gain}
        final = self.run_dir / "heldout_final.json"
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        try:  # whole or absent: a full disk leaves no half file under the final name
            tmp.write_text(json.dumps({"step": step, "run_steps": trainer.global_step, "final": result,
                                       "base": self.final_base, **overall(gain)}) + "\n")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        for logger in trainer.loggers:
            if not isinstance(logger, CSVLogger):
                logger.log_metrics({f"heldout_final/{k}": v for k, v in gain.items() if isinstance(v, float)},
                                   step=trainer.global_step)
        log.info("held-out verdict (n=%d, seed %d) of the policy of step %d vs base: dense %+.3f ± %.3f, "
                 "strict %+.3f ± %.3f", self.final_n_samples, self.final_seed, step, gain["dense_gain"], gain["dense_gain_se"],
                 gain["strict_gain"], gain["strict_gain_se"])

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        """Evaluate (rank 0), then, on every rank: best.ckpt, early stop. False if a signal cut
        the evaluation short (only at the end of the run)."""
        result = None
        if trainer.is_global_zero:
            try:
                result = self.evaluate(pl_module.policy)
            except EvaluationCut as cut:
                log.warning("%s", cut)
        if result is not None:
            self._record(trainer, result, trainer.global_step)
        score = trainer.strategy.broadcast(result[self.metric] if result is not None else None, src=0)
        if score is None:
            return False
        if score > self.best[0]:
            self.best = (score, trainer.global_step)
            self._save_best(trainer)
            log.info("held-out %s %.3f: new best, wrote checkpoints/best.ckpt", self.metric, score)
        elif self.stop_margin is not None and score < self.best[0] - self.stop_margin:
            log.warning("held-out %s %.3f fell more than %g below its best %.3f (step %d): stopping early",
                        self.metric, score, self.stop_margin, *self.best)
            trainer.should_stop = True
        return True

    def _record(self, trainer: L.Trainer, result: dict, step: int) -> None:
        """Log one evaluation (rank 0): heldout.csv, the non-CSV loggers, the console."""
        gain = paired_gain(result, self.base) if self.base is not None else {}
        row = {"step": step, "strict_accuracy": result["strict_accuracy"], "dense_score": result["dense_score"],
               **overall(gain)}
        self.latest = {**result, **row, "gain": gain}
        categories = {f"strict_{c}": v["strict_accuracy"] for c, v in result.get("per_category", {}).items()}
        path = self.run_dir / "heldout.csv"
        new = not path.exists() or not path.read_text().strip()
        # a resumed run keeps the file's own columns (a file from before per-category columns keeps none)
        fields = (["step", "strict_accuracy", "dense_score", "strict_gain", "strict_gain_se", "dense_gain", "dense_gain_se",
                   *(f"strict_{c}" for c in CATEGORIES)] if new else path.read_text().splitlines()[0].split(","))
        with path.open("w" if new else "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({**row, **categories})
        for logger in trainer.loggers:
            if not isinstance(logger, CSVLogger):  # metrics.csv keeps one row per optimizer step
                logger.log_metrics({f"heldout/{k}": v for k, v in row.items() if k != "step"}, step=step)
        text = f"held-out (n={self.n_samples}) at step {step}: strict {row['strict_accuracy']:.3f}, dense {row['dense_score']:.3f}"
        if gain:
            text += f"; vs base: dense {gain['dense_gain']:+.3f} ± {gain['dense_gain_se']:.3f}, strict {gain['strict_gain']:+.3f} ± {gain['strict_gain_se']:.3f}"
        log.info(text)

    # ---- checkpoints: the base and the best survive a resume ---------------------------
    def state_dict(self) -> dict:
        return {"base": self.base, "best": list(self.best) if self.best is not None else None, "final_base": self.final_base,
                "best_file": str(self.best_file) if self.best_file is not None else None}

    def load_state_dict(self, state_dict: dict) -> None:
        self.base = state_dict["base"]
        self.best = tuple(state_dict["best"]) if state_dict["best"] is not None else None
        self.final_base = state_dict.get("final_base")
        self.best_file = Path(state_dict["best_file"]) if state_dict.get("best_file") else None


def overall(gain: dict) -> dict:
    """The overall gains of a `paired_gain` result and their standard errors (no per-category part)."""
    return {k: v for k, v in gain.items() if k.endswith(("_gain", "_gain_se"))}


def policy_fingerprint(policy: torch.nn.Module) -> str:
    """sha256 of a policy's state (names, dtypes, shapes and values, in name order)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(policy.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def stored_name(policy: torch.nn.Module, args: dict) -> str:
    """<fingerprint>_n<n_samples>_seed<seed>[_<categories>].json: a category task's own file."""
    categories = "".join(f"_{c}" for c in args.get("categories") or ())
    return f"{policy_fingerprint(policy)}_n{args['n_samples']}_seed{args['seed']}{categories}.json"


def stored_evaluation(policy: torch.nn.Module, args: dict, directory: Path = STORED) -> dict | None:
    """A stored held-out evaluation of exactly these weights with exactly these settings, or None.
    Files: DIRECTORY/`stored_name(policy, args)`, as `HeldoutEval.evaluate` returns."""
    path = directory / stored_name(policy, args)
    if not path.is_file():
        return None
    stored = json.loads(path.read_text())
    if stored.get("args") != args:
        return None
    log.info("held-out verdict set: the base's stored scores (%s)", path.name)
    return stored

