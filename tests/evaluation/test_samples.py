"""Evaluation samples: reproducible in the seed, the ODE or GRPO's SDE, for any policy."""
import torch

from jagg_lab.evaluation import sample_images
from jagg_lab.policies import DiTPolicy
from tests.conftest import randomized_policy
from tests.evaluation.conftest import WrappedDiT

PROMPTS = ["a red circle", "two squares", "a blue triangle"]


def test_evaluate_samples_with_the_sde_when_given_a_noise_level():
    """noise_level > 0 samples GRPO's SDE: reproducible in seed, different from the ODE,
    and at noise_level 0 exactly the ODE."""
    policy = DiTPolicy(size="XS", resolution=16, checkpoint=None).eval()
    prompts = PROMPTS
    sample = lambda **kw: sample_images(policy, prompts, seed=3, num_steps=4, **kw)  # noqa: E731
    ode, sde = sample(), sample(noise_level=0.7)
    assert torch.equal(sde, sample(noise_level=0.7))
    assert torch.equal(ode, sample(noise_level=0.0))
    assert (sde - ode).abs().max() > 1e-3


def test_ode_samples_depend_on_the_weights_and_noise_only():
    """Another policy class with the same weights draws the same images; batching does not
    change the ODE's noise; another seed does."""
    policy = randomized_policy(size="XS", resolution=16, seed=2).eval()
    wrapped = WrappedDiT().eval()
    wrapped.inner.load_state_dict(policy.state_dict())
    images = sample_images(policy, PROMPTS, seed=5, num_steps=3)
    assert images.shape == (3, 3, 16, 16) and 0 <= images.min() and images.max() <= 1
    torch.testing.assert_close(sample_images(wrapped, PROMPTS, seed=5, num_steps=3, batch_size=2), images)
    assert not torch.equal(images, sample_images(policy, PROMPTS, seed=6, num_steps=3))
