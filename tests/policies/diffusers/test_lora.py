"""LoRA: only the adapters train, switching them off gives the base model (the KL reference),
and checkpoints hold only the adapters."""
from __future__ import annotations

import copy

import lightning as L
import pytest
import torch

from jagg_lab.data import PromptDataModule
from jagg_lab.module import AdaptersOff
from jagg_lab.policies.diffusers import DiffusersPolicy
from jagg_lab.strategies import FullStrategy, JaggStrategy
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient
from tests.policies.diffusers.tiny import KINDS, RESOLUTION, activate_lora, inputs, rel_err, tiny_policy


@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_lora_trains_only_adapters(kind):
    policy = tiny_policy(kind)
    activate_lora(policy)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == torch.float32 for p in policy.parameters() if p.requires_grad)
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    module = make_module(guidance=4.5, num_steps=4, policy=policy)
    rollout, advantages = rollout_and_advantages(module)
    module.strategy = JaggStrategy(window=2)
    module.micro_batch_backward(rollout, advantages, torch.arange(8), 1.0, on_policy=True)
    for n, p in policy.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), n
        else:
            assert p.grad is None, n
    torch.optim.AdamW(module.trainable_parameters(), lr=1e-2).step()
    params = dict(policy.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in base.items())
    assert any(not torch.equal(params[n], v) for n, v in lora.items())


@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_adapters_disabled_is_the_base_model_and_the_kl_reference(kind):
    policy = tiny_policy(kind)
    pristine = copy.deepcopy(policy.transformer)  # LoRA B = 0: the base model's function
    x, s, cond = inputs(policy)
    with torch.no_grad():
        before = policy(x, s, cond)
    module = make_module(guidance=4.5, beta=0.05, num_steps=4, policy=policy)
    assert isinstance(module.objective.ref_policy, AdaptersOff)  # no second copy of the model
    rollout, advantages = rollout_and_advantages(module)
    assert rollout.ref_means is not None
    # on-policy at init: the reference is the policy itself, so KL is zero
    strategy_gradient(module, FullStrategy(), rollout, advantages)
    assert module.step_metrics["kl"].compute().abs() < 1e-10
    for m in module.step_metrics.values():
        m.reset()
    opt = torch.optim.AdamW(module.trainable_parameters(), lr=5e-2)
    for _ in range(2):
        module.strategy = FullStrategy()
        module.micro_batch_backward(rollout, advantages, torch.arange(8), 1.0, on_policy=True)
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        after = policy(x, s, cond)
        with policy.adapters_disabled():
            with policy.adapters_disabled():  # nests
                off_inner = policy(x, s, cond)
            off = policy(x, s, cond)
        again = policy(x, s, cond)
    assert rel_err(after, before) > 1e-4  # the LoRA learned something
    torch.testing.assert_close(off, before, rtol=0, atol=1e-6)
    torch.testing.assert_close(off_inner, before, rtol=0, atol=1e-6)
    torch.testing.assert_close(again, after)  # adapters are back on after the block
    # the reference really is the untouched base model
    reference = DiffusersPolicy(kind, pristine, None, policy._frozen.prompt_cache.encoder, resolution=RESOLUTION,
                                lora_target_modules=None, vae_scale_factor=2)
    with torch.no_grad():
        torch.testing.assert_close(reference(x, s, cond), before, rtol=0, atol=1e-6)
    # a fresh rollout now has a reference that differs from the policy: KL > 0, finite
    rollout, advantages = rollout_and_advantages(module, seed=1)
    strategy_gradient(module, FullStrategy(), rollout, advantages)
    kl = module.step_metrics["kl"].compute()
    assert torch.isfinite(kl) and kl > 0


def test_sd3_lightning_step_and_lora_only_checkpoint_resume(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\ntwo squares\n")
    policy = tiny_policy("sd3")
    module = make_module(guidance=4.5, num_steps=3, policy=policy, micro_batch_size=4)
    data = PromptDataModule(source="file", prompt_file=str(prompts), prompts_per_step=1, group_size=4)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    assert module.rollouts_done == 1 and module.skipped_steps == 0
    ckpt_path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt_path)
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)["state_dict"]
    lora_keys = {f"policy.{n}" for n, p in policy.named_parameters() if p.requires_grad}
    assert set(state) == lora_keys  # no frozen base weights, no pos_embed buffer
    # resume: a policy rebuilt from the same base loads the adapters strictly
    fresh = make_module(guidance=4.5, num_steps=3, policy=tiny_policy("sd3"), micro_batch_size=4)
    fresh.load_state_dict(state, strict=True)
    for (n, a), b in zip(fresh.policy.named_parameters(), policy.parameters()):
        assert torch.equal(a, b), n
    # checkpoint_frozen=True writes everything
    full = tiny_policy("sd3", checkpoint_frozen=True)
    assert set(full.state_dict()) == set(full.transformer.state_dict(prefix="transformer."))
