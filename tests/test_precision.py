"""bfloat16 mixed precision (trainer.precision=bf16-mixed): the DiT's projections under autocast,
its attention, output and text encoder in float32; an on-policy step never clips on rounding;
a Lightning run trains in bfloat16 and evaluates held-out in float32."""
import csv

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from jagg_lab.bench.common import precision_context
from jagg_lab.data import PromptDataModule
from jagg_lab.strategies import FullStrategy
from tests.conftest import PROMPTS, make_module, randomized_policy, rollout_and_advantages

BF16 = "bf16-mixed"


def _inputs(policy, rows=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, *policy.sample_shape, generator=generator)
    s = torch.rand(rows, generator=generator) * 0.8 + 0.1
    return x, s, policy.encode_prompts(["a red circle"] * rows)


def test_the_dit_computes_its_projections_in_bfloat16_and_returns_float32_close_to_float32():
    policy = randomized_policy("XS")
    x, s, cond = _inputs(policy)
    seen = {}
    block = policy.dit.blocks[0]
    block.qkv.register_forward_hook(lambda m, i, o: seen.__setitem__("qkv_out", o.dtype))
    block.proj.register_forward_hook(lambda m, i, o: seen.__setitem__("attention_out", i[0].dtype))
    with torch.no_grad():
        v32 = policy(x, s, cond)
        assert seen == {"qkv_out": torch.float32, "attention_out": torch.float32}
        with precision_context(BF16, "cpu"):
            v16 = policy(x, s, cond)
    # projections in bfloat16; attention (whose bfloat16 backward is slow on CPU) and the output in float32
    assert seen == {"qkv_out": torch.bfloat16, "attention_out": torch.float32}
    assert v16.dtype == torch.float32
    rel = ((v16 - v32).norm() / v32.norm()).item()
    assert 0 < rel < 0.05


def test_prompts_encode_in_float32_under_autocast():
    policy = randomized_policy("XS")
    plain = policy.encode_prompts(PROMPTS)
    with torch.no_grad(), precision_context(BF16, "cpu"):
        cast = policy.encode_prompts(PROMPTS)
    for key in plain:
        assert cast[key].dtype == torch.float32 and torch.equal(cast[key], plain[key].detach())


def test_an_on_policy_step_in_bfloat16_has_ratio_one_and_clips_nothing():
    module = make_module(guidance=3.0, num_steps=4)
    idx = torch.arange(len(PROMPTS) * module.group_size)
    with precision_context(BF16, "cpu"):
        rollout, advantages = rollout_and_advantages(module)
        module.policy.zero_grad(set_to_none=True)
        _, steps = module.objective.loss.backward(FullStrategy(), module.policy, rollout, advantages, idx[:4], on_policy=True)
    assert all(s.ratio_mean.item() == 1 and s.clip_frac.item() == 0 for s in steps)
    module.policy.zero_grad(set_to_none=True)


def test_in_float32_the_rollouts_log_probs_match_a_fresh_forward():
    """The float32 control of the test above: the rollout's log-probs are the loss's own to rounding."""
    module = make_module(guidance=3.0, num_steps=4)
    rollout, advantages = rollout_and_advantages(module)
    idx = torch.arange(rollout.states.shape[0])
    record = {}
    loss = module.objective.loss.step_loss_fn(rollout, idx, advantages, record=record)
    velocity = module.objective.loss.velocity_fn(module.policy, rollout, idx)
    with torch.no_grad():
        for j, k in enumerate(module.objective.trained_steps):
            loss(j, velocity(rollout.states[idx, k], torch.full((len(idx),), rollout.noise_levels[k].item())))
    assert all(abs(r.ratio_mean.item() - 1) < 1e-5 and r.clip_frac.item() == 0 for r in record.values())


def test_a_bf16_mixed_run_trains_in_bfloat16_and_evaluates_held_out_in_float32(tmp_path):
    from jagg_lab.callbacks.heldout import HeldoutEval

    module = make_module(guidance=3.0, num_steps=4, train_fraction=0.5)
    data = PromptDataModule(prompts_per_step=2, group_size=4, seed=0)
    seen, inside = [], []  # the dtype of every qkv call; which calls a training step made
    module.policy.dit.blocks[0].qkv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))

    class Steps(L.Callback):
        def on_train_batch_start(self, *args):
            inside.append([len(seen)])

        def on_train_batch_end(self, *args):
            inside[-1].append(len(seen))

    heldout = HeldoutEval(n_samples=2, every=1, num_steps=2, batch_size=2, run_dir=tmp_path)
    trainer = L.Trainer(accelerator="cpu", precision=BF16, max_steps=2, logger=CSVLogger(tmp_path, name="", version=""),
                        callbacks=[Steps(), heldout], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)
    with open(tmp_path / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("ratio_mean")]
    assert len(rows) == 2 and all(float(r["ratio_mean"]) == 1 and float(r["clip_frac"]) == 0 for r in rows)
    in_steps = {i for a, b in inside for i in range(a, b)}
    assert len(inside) == 2 and in_steps and len(in_steps) < len(seen)
    # rollouts and gradient phases in bfloat16; held-out evaluations (start, every step, end) in float32
    assert all(seen[i] == torch.bfloat16 for i in in_steps)
    assert all(seen[i] == torch.float32 for i in range(len(seen)) if i not in in_steps)
