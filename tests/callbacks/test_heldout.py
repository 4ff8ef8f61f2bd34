"""Stored held-out evaluations of shipped policies: found only for the very same weights and
settings, and still what a fresh evaluation of those weights gives."""
import json

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from jagg_lab.callbacks.heldout import STORED, HeldoutEval, policy_fingerprint, stored_evaluation, stored_name
from tests.test_train_cli import REPO


@pytest.fixture(scope="module")
def shipped():
    return instantiate(OmegaConf.load(REPO / "conf" / "policy" / "dit_s.yaml"))


def test_the_shipped_base_has_a_stored_verdict_set_and_fresh_scores_match_it(shipped):
    files = sorted(STORED.glob("*.json"))
    assert files, "no stored evaluation ships with the package"
    fingerprint = policy_fingerprint(shipped)
    for path in files:
        assert path.name.startswith(fingerprint)  # every stored evaluation is of the shipped base
        stored = json.loads(path.read_text())
        args = stored["args"]
        heldout = HeldoutEval(n_samples=64, seed=args["seed"], num_steps=args["num_steps"], guidance=args["guidance"],
                              shift=args["shift"], batch_size=args["batch_size"], categories=args.get("categories"))
        fresh = heldout.evaluate(shipped)  # the stored set's first batch: same prompts, same noise
        assert fresh["per_sample"]["strict"] == stored["per_sample"]["strict"][:64]
        assert fresh["per_sample"]["dense"] == pytest.approx(stored["per_sample"]["dense"][:64], abs=1e-6)
        assert stored_evaluation(shipped, args) == stored


def test_a_stored_evaluation_is_not_used_for_other_weights_or_settings(shipped, tmp_path):
    heldout = HeldoutEval(final_n_samples=2048, final_seed=2)
    args = heldout.args(shipped, final=True)
    assert stored_evaluation(shipped, args) is not None
    assert stored_evaluation(shipped, {**args, "guidance": 4.0}) is None
    assert stored_evaluation(shipped, {**args, "n_samples": 1024}) is None
    with torch.no_grad():
        param = next(shipped.parameters())
        param[(0,) * param.dim()] += 1e-3
    try:
        assert stored_evaluation(shipped, args) is None
    finally:
        with torch.no_grad():
            param[(0,) * param.dim()] -= 1e-3


def test_zero_samples_mean_off_for_the_periodic_evaluation_and_the_verdict_alike():
    heldout = HeldoutEval(n_samples=0, final_n_samples=0)
    assert not heldout.enabled
    heldout._prepare_verdict(trainer=None, policy=None)  # no verdict set: returns before anything is scored
    assert heldout.final_base is None
    with pytest.raises(ValueError, match=r"heldout.final_n_samples = -1 is invalid"):
        HeldoutEval(final_n_samples=-1)


def test_a_category_task_reads_its_own_stored_verdict_never_the_six_category_one(shipped):
    """heldout.categories: the prompts are those categories' in turn; the base's stored verdict of
    all six categories is not its evaluation (a category task's has its own file)."""
    heldout = HeldoutEval(final_n_samples=2048, final_seed=2, categories=["counting"])
    args = heldout.args(shipped, final=True)
    assert args["categories"] == ["counting"] and stored_name(shipped, args).endswith("_n2048_seed2_counting.json")
    assert stored_evaluation(shipped, args)["args"]["categories"] == ["counting"]
    assert stored_evaluation(shipped, {**args, "categories": ["colors"]}) is None
    assert "categories" not in HeldoutEval(final_n_samples=2048, final_seed=2).args(shipped, final=True)  # unchanged
    with pytest.raises(ValueError, match="heldout.categories"):
        HeldoutEval(categories=["counting", "shading"])
