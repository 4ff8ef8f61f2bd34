"""Flow-matching pretraining of the base policy on the shapes world.

    python -m jagg_lab.pretrain [key=value ...]        (config: conf/pretrain.yaml)

Rectified flow with logit-normal noise levels (SD3), caption dropout for classifier-free
guidance, EMA weights, periodic held-out verifier accuracy, resumable through Lightning
checkpoints, and at the end the EMA weights exported as a safetensors policy checkpoint.
"""
from __future__ import annotations

import copy
from functools import partial
import logging
import sys
from pathlib import Path

import hydra
import lightning as L
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader

from jagg_lab import CONF_DIR
from jagg_lab.evaluation import eval_prompts, sample_images, score_images
from jagg_lab.rundir import ConfigError, check_fresh_run_dir, run_logger
from jagg_lab.worlds.shapes import ShapesDataset

log = logging.getLogger(__name__)


def _collate(items: list[dict]) -> dict:
    return {"image": torch.stack([i["image"] for i in items]), "prompt": [i["prompt"] for i in items]}


class PretrainModule(L.LightningModule):
    """policy: a DiTPolicy. lr, warmup_steps, weight_decay: AdamW with linear warmup.
    decay_steps: the learning rate falls linearly to 0 over the run's last decay_steps steps
    (warmup-stable-decay; 0 keeps it constant). The end is trainer.max_steps, so a resumed run
    with a larger max_steps cools down a model that trained at constant rate.
    caption_dropout: share of prompts replaced by the null prompt. ema_decay: EMA of weights.
    eval_every / eval_samples / eval_steps / eval_guidance: held-out ODE accuracy of the EMA."""

    def __init__(self, policy, lr=3e-4, warmup_steps=500, weight_decay=0.0, decay_steps=0, caption_dropout=0.1,
                 ema_decay=0.999, eval_every=1000, eval_samples=96, eval_steps=20, eval_guidance=3.0, seed=0):
        super().__init__()
        if decay_steps < 0:
            raise ValueError(f"module.decay_steps must be >= 0, got {decay_steps}")
        policy.text_encoder.requires_grad_(True)  # trained jointly here, frozen in RL
        self.policy = policy
        self.ema = AveragedModel(policy, multi_avg_fn=get_ema_multi_avg_fn(ema_decay), use_buffers=True)
        self.lr, self.warmup_steps, self.weight_decay, self.decay_steps = lr, warmup_steps, weight_decay, decay_steps
        self.caption_dropout = caption_dropout
        self.eval_every, self.eval_samples, self.eval_steps, self.eval_guidance = eval_every, eval_samples, eval_steps, eval_guidance
        self.generator = torch.Generator().manual_seed(seed)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        x0 = batch["image"]  # (B, 3, H, W) in [-1, 1]
        prompts = [p if torch.rand((), generator=self.generator) >= self.caption_dropout else "" for p in batch["prompt"]]
        s = torch.sigmoid(torch.randn(x0.shape[0], generator=self.generator)).to(x0)  # logit-normal
        eps = torch.randn(x0.shape, generator=self.generator).to(x0)
        x_s = (1 - s[:, None, None, None]) * x0 + s[:, None, None, None] * eps
        v = self.policy(x_s, s, self.policy.encode_prompts(prompts))
        loss = F.mse_loss(v, eps - x0)
        self.log("loss", loss, prog_bar=True, on_step=True, logger=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.ema.update_parameters(self.policy)
        step = self.global_step
        if self.eval_every and step % self.eval_every == 0:
            self.log_dict(self.heldout_accuracy(), on_step=True, logger=True)

    def heldout_accuracy(self) -> dict[str, float]:
        policy = self.ema.module.eval()
        prompts = eval_prompts(self.eval_samples, seed=1)
        images = sample_images(policy, prompts, seed=1, num_steps=self.eval_steps, guidance=self.eval_guidance)
        result = score_images(images, prompts)
        log.info("step %d: held-out strict %.3f dense %.3f", self.global_step, result["strict_accuracy"], result["dense_score"])
        out = {"eval_strict": result["strict_accuracy"], "eval_dense": result["dense_score"]}
        out.update({f"eval_strict_{c}": r["strict_accuracy"] for c, r in result["per_category"].items()})
        return out

    def configure_optimizers(self):
        opt = torch.optim.AdamW([p for p in self.policy.parameters() if p.requires_grad], lr=self.lr, weight_decay=self.weight_decay)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, partial(lr_factor, warmup_steps=self.warmup_steps,
                                                                  decay_steps=self.decay_steps, max_steps=self.trainer.max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def lr_factor(step: int, warmup_steps: int, decay_steps: int, max_steps: int) -> float:
    """Warmup-stable-decay: linear warmup, constant, then linear to 0 over the last decay_steps."""
    warm = min(1.0, (step + 1) / max(1, warmup_steps))
    if decay_steps <= 0:
        return warm
    return min(warm, max(0.0, (max_steps - step) / decay_steps))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="pretrain")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:  # a resumed run goes on in a new directory: the old one keeps its metrics and checkpoints
        check_fresh_run_dir(run_dir)
    except ConfigError as err:
        sys.exit(f"jagg_lab.pretrain: {err}")
    L.seed_everything(cfg.seed, verbose=False)
    policy = instantiate(cfg.policy)
    module = instantiate(cfg.module, policy=policy, seed=cfg.seed)
    data = DataLoader(ShapesDataset(resolution=policy.config.resolution, seed=cfg.seed, split="train"),
                      batch_size=cfg.batch_size, collate_fn=_collate, num_workers=0)
    trainer = L.Trainer(
        accelerator="auto", devices=1, max_steps=cfg.max_steps, max_time=cfg.max_time, max_epochs=-1,
        logger=run_logger(run_dir, flush_logs_every_n_steps=50),
        callbacks=[ModelCheckpoint(dirpath=run_dir / "checkpoints", save_last=True, every_n_train_steps=cfg.checkpoint_every)],
        log_every_n_steps=50, enable_model_summary=False, num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=data, ckpt_path=cfg.resume)
    export = copy.deepcopy(module.ema.module)
    out = Path(cfg.export) if cfg.export else run_dir / "policy.safetensors"
    export.save(out)
    log.info("exported EMA policy to %s", out)


if __name__ == "__main__":
    main()
