"""DDPO's JPEG rewards: encoded size in kB, negated for compressibility."""
import pytest
import torch

from jagg_lab.rewards import JpegCompressibility, jpeg_size_kb


def flat_gradient_noise(size: int = 64) -> torch.Tensor:
    """(3, 3, size, size) in [0, 1]: a flat grey image, a smooth ramp and uniform noise."""
    flat = torch.full((3, size, size), 0.5)
    ramp = torch.linspace(0, 1, size).expand(3, size, size)
    noise = torch.rand((3, size, size), generator=torch.Generator().manual_seed(0))
    return torch.stack([flat, ramp, noise])


def test_compressibility_ranks_flat_above_smooth_above_noise():
    out = JpegCompressibility().components(flat_gradient_noise(), ["x"] * 3, [{}] * 3)
    assert out["reward"].shape == (3,) and out["reward"].dtype == torch.float32
    assert out["reward"][0] > out["reward"][1] > out["reward"][2]
    torch.testing.assert_close(out["reward"], -out["jpeg_kb"])
    assert (out["jpeg_kb"] > 0).all()


def test_lower_quality_encodes_noise_smaller():
    noise = flat_gradient_noise()[2:]
    assert jpeg_size_kb(noise, quality=30) < jpeg_size_kb(noise, quality=95)
    assert JpegCompressibility(quality=30)(noise, ["x"], [{}]) > JpegCompressibility(quality=95)(noise, ["x"], [{}])


def test_values_outside_the_unit_range_are_clamped_and_gradients_ignored():
    images = (flat_gradient_noise() * 3 - 1).requires_grad_()
    torch.testing.assert_close(jpeg_size_kb(images), jpeg_size_kb(images.detach().clamp(0, 1)))


@pytest.mark.parametrize("quality", [0, 101])
def test_quality_outside_1_to_100_is_refused(quality):
    with pytest.raises(ValueError, match="reward.quality"):
        JpegCompressibility(quality=quality)
