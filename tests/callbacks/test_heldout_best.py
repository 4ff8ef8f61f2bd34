"""Held-out evaluation's best checkpoint, early stop and restore_best, on a tiny Lightning run
whose held-out scores are scripted: which step is best, when the run stops, and which weights
it ends with."""
import lightning as L
import torch
from torch.utils.data import DataLoader

from jagg_lab.callbacks.heldout import HeldoutEval


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.policy = torch.nn.Linear(3, 1)
        self.policy.sample_shape = (3, 8, 8)

    def training_step(self, batch, batch_idx):
        return (self.policy(batch) - 1).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(torch.randn(64, 3, generator=torch.Generator().manual_seed(0)), batch_size=4)


def run(tmp_path, scores, max_steps=10, ckpt_path=None, **heldout_kwargs):
    """Train until the early stop (or max_steps); the k-th evaluation scores scores[k]. Returns
    the callback, the trainer, the policy's weights at each evaluation and at the end."""
    seen = []

    def evaluate(self, policy, final=False):
        seen.append(policy.weight.detach().clone())
        score = scores[len(seen) - 1]
        return {"args": self.args(policy, final), "strict_accuracy": score, "dense_score": score,
                "per_sample": {"strict": [score, score], "dense": [score, score]}}

    (tmp_path / "checkpoints").mkdir(parents=True)  # as the run directory's
    heldout = HeldoutEval(n_samples=2, every=1, run_dir=tmp_path, **{"stop_margin": 0.1, **heldout_kwargs})
    heldout.evaluate = evaluate.__get__(heldout)
    module = Tiny()
    trainer = L.Trainer(max_steps=max_steps, callbacks=[heldout], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, ckpt_path=ckpt_path)
    return heldout, trainer, seen, module.policy.weight.detach()


def test_best_checkpoint_follows_the_metric_and_the_run_stops_below_the_margin(tmp_path, caplog):
    heldout, trainer, seen, final = run(tmp_path, [0.5, 0.6, 0.55, 0.45])
    assert "weights_only" not in caplog.text  # saying what best.ckpt holds: no "was not set, defaulting" line
    assert trainer.global_step == 3 and len(seen) == 4  # 0.45 < 0.6 - 0.1: stopped after the third step
    assert heldout.best == (0.6, 1)
    best = torch.load(tmp_path / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    assert best["global_step"] == 1 and torch.equal(best["state_dict"]["policy.weight"], seen[1])
    assert torch.equal(final, seen[3]) and not torch.equal(final, seen[1])  # without restore_best: the last policy
    assert heldout.restored is None


def test_restore_best_ends_with_the_best_policy(tmp_path):
    heldout, trainer, seen, final = run(tmp_path, [0.5, 0.6, 0.55, 0.45], restore_best=True)
    assert trainer.global_step == 3 and heldout.restored == (0.6, 1)
    assert torch.equal(final, seen[1])


def test_restore_best_goes_back_to_the_base_when_nothing_beat_it(tmp_path):
    heldout, trainer, seen, final = run(tmp_path, [0.5, 0.45, 0.35], restore_best=True)
    assert trainer.global_step == 2 and heldout.restored == (0.5, 0)
    assert torch.equal(final, seen[0]) and not torch.equal(final, seen[2])


def test_restore_best_keeps_the_last_policy_when_it_is_the_best(tmp_path):
    heldout, trainer, seen, final = run(tmp_path, [0.5, 0.6, 0.7], max_steps=2, restore_best=True)
    assert heldout.restored is None and heldout.best == (0.7, 2) and torch.equal(final, seen[2])


def test_a_resumed_run_whose_first_run_scored_no_verdict_base_says_so(tmp_path, caplog):
    first, trainer, _, _ = run(tmp_path / "first", [0.5, 0.6, 0.7], max_steps=2)
    trainer.save_checkpoint(tmp_path / "first.ckpt")
    resumed, trainer, _, _ = run(tmp_path / "resumed", [0.8, 0.9], max_steps=3, ckpt_path=tmp_path / "first.ckpt",
                                 final_n_samples=3)
    assert trainer.global_step == 3 and resumed.base == first.base  # still paired with the first run's base
    assert "no held-out verdict" in caplog.text and resumed.verdict is None
    assert not (tmp_path / "resumed" / "heldout_final.json").exists()


def test_restore_best_after_a_resume_into_a_new_directory_finds_the_first_runs_best(tmp_path):
    first, trainer, seen, _ = run(tmp_path / "first", [0.5, 0.6, 0.55], max_steps=2)
    trainer.save_checkpoint(tmp_path / "interrupted.ckpt")  # as its last.ckpt: the best (step 1) is in first/
    resumed, trainer, _, final = run(tmp_path / "resumed", [0.4], max_steps=3, ckpt_path=tmp_path / "interrupted.ckpt",
                                     restore_best=True)
    assert resumed.restored == (0.6, 1) and torch.equal(final, seen[1])
