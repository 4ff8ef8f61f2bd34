"""objective=awm and objective=nft train end to end (the embedded task and the sd3_random
transformer), log their work, and resume exactly (the soft copies of the weights included)."""
import pytest

from tests.test_configs import SHRINK
from tests.test_train_cli import TINY, read_rows, train

# The shipped base (an untrained DiT samples one image for every noise: equal rewards give NFT
# no gradient at the old policy, by design).
FORWARD = ["data.prompts_per_step=2", "data.group_size=4", "grpo.micro_batch_size=4", "sampler.num_steps=4",
           "heldout.n_samples=0"]


@pytest.mark.parametrize("objective, items, nograd", [("nft", 3, 6), ("awm", 3, 6)])
def test_a_forward_process_run_trains_and_counts_its_work(tmp_path, objective, items, nograd):
    """4 grid steps: NFT trains int(4 * 0.99) = 3 levels per sample, AWM 3 of 4 strata (one
    narrower than an index); each with one grad forward and two frozen ones (old policy or EMA,
    reference) per level, per micro-batch (two of them)."""
    run = tmp_path / "run"
    overrides = ["objective.timesteps_per_sample=3"] if objective == "awm" else []
    train(f"objective={objective}", *overrides, "trainer.max_steps=2", f"hydra.run.dir={run}", *FORWARD)
    rows = read_rows(run / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2]
    for row in rows:
        assert float(row["backward_items"]) == 2 * items and float(row["nograd_forwards"]) == 2 * nograd
        assert float(row["rollout_forwards"]) == 4  # the ODE rollout: one call per grid step
        assert float(row["grad_norm"]) > 0
    assert (run / "policy.safetensors").is_file()


def test_nft_resumes_exactly_with_its_old_policy(tmp_path):
    """The rollouts come from the old policy, a soft copy moved after each rollout: a run resumed
    from its step-1 checkpoint matches the uninterrupted run's second row."""
    common = ["objective=nft", "checkpoint_every=1", *FORWARD]
    train(*common, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'straight'}")
    train(*common, "trainer.max_steps=2", f"resume={tmp_path / 'straight' / 'checkpoints' / 'step_000001.ckpt'}",
          f"hydra.run.dir={tmp_path / 'resumed'}")
    straight, resumed = read_rows(tmp_path / "straight" / "metrics.csv"), read_rows(tmp_path / "resumed" / "metrics.csv")
    for key in ("reward_mean", "loss", "grad_norm"):
        assert float(resumed[-1][key]) == pytest.approx(float(straight[-1][key]), rel=1e-5), key


@pytest.mark.parametrize("objective", ["awm", "nft"])
def test_a_forward_process_run_trains_the_sd3_transformer(tmp_path, objective):
    """A CPU smoke run on sd3_random (LoRA: the soft copies hold the adapters only)."""
    run = tmp_path / "run"
    train(f"objective={objective}", "policy=sd3_random", "policy.dtype=float32", *SHRINK[("policy", "sd3_random")],
          "trainer.max_steps=1", f"hydra.run.dir={run}", "data.prompts_per_step=1", "data.group_size=2",
          "grpo.micro_batch_size=2", "sampler.num_steps=3", "reward=jpeg", "heldout.n_samples=0")
    row = read_rows(run / "metrics.csv")[0]
    assert float(row["backward_items"]) > 0 and float(row["grad_norm"]) > 0
