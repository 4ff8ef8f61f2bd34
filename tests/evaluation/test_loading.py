"""The policies of a training run directory: any policy class, its exported weights or a
training checkpoint, and the base it started from."""
import pytest
import torch
from safetensors.torch import save_file

from jagg_lab.evaluation import find_run, load_policy_weights, load_run_policy, run_policies
from jagg_lab.policies import DiTPolicy
from jagg_lab.sampling import SDESampler
from tests.conftest import randomized_policy
from tests.evaluation.conftest import WRAPPED_TARGET, WrappedDiT, write_run

DIT_XS = {"_target_": "jagg_lab.policies.DiTPolicy", "size": "XS", "resolution": 16, "checkpoint": None}


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_run_policies_gives_the_trained_policy_its_base_and_sampler(tmp_path):
    trained = randomized_policy(size="XS", resolution=16, seed=3)
    run = write_run(tmp_path / "run", trained, DIT_XS, seed=7)
    policy, base, sampler = run_policies(run)
    assert same_weights(policy, trained) and not policy.training and not base.training
    torch.manual_seed(7)  # a random-init base: the weights training drew after seeding with the run's seed
    assert same_weights(base, DiTPolicy(size="XS", resolution=16))
    assert isinstance(sampler, SDESampler) and (sampler.num_steps, sampler.guidance) == (4, 3.0)


def test_a_weights_file_inside_a_run_names_the_run(tmp_path):
    """A training checkpoint (.ckpt, the module's `policy.` entries) of a policy class without
    `load` loads through the generic state-dict path."""
    trained = WrappedDiT()
    run = write_run(tmp_path / "run", WrappedDiT(), {"_target_": WRAPPED_TARGET})
    ckpt = run / "checkpoints" / "step_000002.ckpt"
    ckpt.parent.mkdir()
    torch.save({"state_dict": {f"policy.{k}": v for k, v in trained.state_dict().items()}, "global_step": 2}, ckpt)
    assert find_run(run) == (run, run / "policy.safetensors")
    assert find_run(ckpt) == (run, ckpt)
    assert same_weights(load_run_policy(ckpt), trained)
    with pytest.raises(FileNotFoundError, match="no config.yaml"):
        find_run(tmp_path)


def test_weights_that_do_not_fit_the_policy_name_their_file(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(1)}, str(path))
    with pytest.raises(ValueError, match="other.safetensors"):
        load_policy_weights(WrappedDiT(), path)
