"""The weighted sum of rewards: the total, each reward's own score and its side values."""
import pytest
import torch

from jagg_lab.rewards import Reward
from jagg_lab.rewards.multi import MultiReward


class Brightness(Reward):
    """Mean pixel value per image, with the red channel's mean as a side value."""

    def components(self, images, prompts, metadata):
        return {"reward": images.mean(dim=(1, 2, 3)), "red": images[:, 0].mean(dim=(1, 2))}


class PromptLength(Reward):
    def components(self, images, prompts, metadata):
        return {"reward": torch.tensor([float(len(p)) for p in prompts])}


class WrongShape(Reward):
    def components(self, images, prompts, metadata):
        return {"reward": torch.zeros(images.shape[0] + 1)}


IMAGES = torch.rand((3, 3, 8, 8), generator=torch.Generator().manual_seed(0))
PROMPTS = ["a", "bb", "cccc"]


def test_the_total_is_the_weighted_sum_of_unweighted_components():
    multi = MultiReward({"bright": Brightness(), "length": PromptLength()}, {"bright": 2.0, "length": -0.5})
    out = multi.components(IMAGES, PROMPTS, [{}] * 3)
    bright = IMAGES.mean(dim=(1, 2, 3))
    torch.testing.assert_close(out["bright"], bright)
    torch.testing.assert_close(out["length"], torch.tensor([1.0, 2.0, 4.0]))
    torch.testing.assert_close(out["reward"], 2.0 * bright - 0.5 * torch.tensor([1.0, 2.0, 4.0]))
    torch.testing.assert_close(out["bright_red"], IMAGES[:, 0].mean(dim=(1, 2)))
    assert set(out) == {"reward", "bright", "bright_red", "length"}
    torch.testing.assert_close(multi(IMAGES, PROMPTS, [{}] * 3), out["reward"])


def test_a_zero_weight_logs_the_reward_but_leaves_the_total():
    multi = MultiReward({"bright": Brightness(), "length": PromptLength()}, {"bright": 1, "length": 0})
    out = multi.components(IMAGES, PROMPTS, [{}] * 3)
    torch.testing.assert_close(out["reward"], out["bright"])
    assert (out["length"] > 0).all()
    assert multi.name == "1*bright+0*length"


def test_weights_must_name_exactly_the_rewards():
    with pytest.raises(ValueError, match=r"missing weights for \['length'\].*without a reward \['lenght'\]"):
        MultiReward({"bright": Brightness(), "length": PromptLength()}, {"bright": 1.0, "lenght": 1.0})
    with pytest.raises(ValueError, match="empty"):
        MultiReward({}, {})


@pytest.mark.parametrize("name", ["reward", "a.b"])
def test_names_that_would_clash_with_the_components_are_refused(name):
    with pytest.raises(ValueError, match="invalid component names"):
        MultiReward({name: Brightness()}, {name: 1.0})


def test_a_reward_of_the_wrong_shape_is_reported_by_name():
    multi = MultiReward({"bright": Brightness(), "broken": WrongShape()}, {"bright": 1.0, "broken": 1.0})
    with pytest.raises(ValueError, match="broken.*expected \\(3,\\)"):
        multi.components(IMAGES, PROMPTS, [{}] * 3)
