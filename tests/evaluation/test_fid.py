"""FID/KID with the shapes feature network: ground truth is close to ground truth and far from
broken images; the shipped asset loads with the documented feature dimension."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jagg_lab.evaluation.fid import fid_kid, reference_images, reference_prompts
from jagg_lab.worlds.shapes.features import DEFAULT_PATH, FEATURE_DIM, ShapeFeatures, load_feature_net

N = 300


@pytest.fixture(scope="module")
def net() -> ShapeFeatures:
    return load_feature_net()


@pytest.fixture(scope="module")
def gt() -> tuple[torch.Tensor, torch.Tensor]:
    return reference_images(N, seed=1), reference_images(N, seed=2)


@pytest.fixture(scope="module")
def scores(net, gt) -> dict[str, dict[str, float]]:
    ref, other = gt
    gray = torch.full_like(other, 128 / 255)
    noise = torch.rand(other.shape, generator=torch.Generator().manual_seed(0))
    # A channel permutation maps the palette onto itself (red -> blue, yellow -> magenta, ...)
    # and unconstrained colours are uniform, so on the full mix only the colour-named held-out
    # prompts (unbalanced: "a yellow square", "a yellow triangle", ...) move: a small shift.
    swapped = other[:, [1, 2, 0]]
    candidates = {"gt": other, "swapped": swapped, "gray": gray, "noise": noise}
    return {name: fid_kid(images, ref, feature_net=net, kid_subset_size=100) for name, images in candidates.items()}


@pytest.fixture(scope="module")
def colour_scores(net) -> dict[str, dict[str, float]]:
    """Colour-named prompts only: there a channel swap changes most of the distribution."""
    cats = ("colors", "color_attr")
    ref, other = reference_images(N, seed=3, categories=cats), reference_images(N, seed=4, categories=cats)
    return {name: fid_kid(images, ref, feature_net=net) for name, images in {"gt": other, "swapped": other[:, [1, 2, 0]]}.items()}


def test_reference_images_shape_range_and_balance():
    images = reference_images(12, seed=0, resolution=16)
    assert images.shape == (12, 3, 16, 16) and images.dtype == torch.float32
    assert 0.0 <= images.min() and images.max() <= 1.0
    assert torch.equal(images, reference_images(12, seed=0, resolution=16))
    assert not torch.equal(images, reference_images(12, seed=1, resolution=16))
    prompts = reference_prompts(12, seed=0)
    assert prompts[0] == "a circle" and prompts[6] == "a circle"  # single_object, round-robin, held out


def test_fid_ground_truth_much_closer_than_broken_images(scores):
    fid = {k: v["fid"] for k, v in scores.items()}
    assert fid["gt"] < 0.25 * fid["noise"], fid
    assert fid["gt"] < 0.25 * fid["gray"], fid
    assert fid["gt"] < fid["swapped"], fid


def test_colour_swap_is_far_on_colour_named_prompts(colour_scores):
    gt, swapped = colour_scores["gt"], colour_scores["swapped"]
    assert gt["fid"] < 0.5 * swapped["fid"], colour_scores
    assert gt["kid_mean"] + 3 * gt["kid_std"] < swapped["kid_mean"], colour_scores


def test_kid_ground_truth_much_closer_than_broken_images(scores):
    kid = {k: v["kid_mean"] for k, v in scores.items()}
    assert abs(kid["gt"]) < 0.1 * kid["noise"], kid
    assert abs(kid["gt"]) < 0.1 * kid["gray"], kid
    assert kid["gt"] < kid["swapped"], kid
    assert all(v["kid_std"] >= 0 for v in scores.values())


def test_fid_kid_deterministic_and_accepts_other_resolutions(net, gt):
    ref, other = gt
    a = fid_kid(other[:60], ref[:60], feature_net=net, kid_subset_size=30, seed=3)
    b = fid_kid(other[:60], ref[:60], feature_net=net, kid_subset_size=30, seed=3)
    assert a == b
    big = torch.nn.functional.interpolate(other[:60], scale_factor=2, mode="nearest")  # 64 px, same content
    c = fid_kid(big, ref[:60], feature_net=net, kid_subset_size=30, seed=3)
    assert c["fid"] == pytest.approx(a["fid"], rel=1e-4)
    with pytest.raises(ValueError, match="generated"):
        fid_kid(other[:1], ref, feature_net=net)


def test_missing_asset_names_path(tmp_path: Path):
    missing = tmp_path / "nope" / "features.safetensors"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_feature_net(missing)


def test_shipped_asset_loads_with_documented_dim(net):
    assert DEFAULT_PATH.is_file() and DEFAULT_PATH.stat().st_size < 1_000_000
    assert net.num_features == FEATURE_DIM == 64 and not net.training
    images = reference_images(8, seed=0)
    as_uint8 = (images * 255).round().to(torch.uint8)
    with torch.no_grad():
        out = net(images)
        assert out.shape == (8, FEATURE_DIM) and torch.isfinite(out).all()
        assert torch.allclose(net(as_uint8), out, atol=1e-4)  # torchmetrics' normalize=False path
        assert net(images[:, :, ::2, ::2]).shape == (8, FEATURE_DIM)  # 16 px input


def test_saved_net_round_trips(tmp_path: Path, net):
    from jagg_lab.worlds.shapes.features import save_feature_net

    path = save_feature_net(net, tmp_path / "f.safetensors")
    again = load_feature_net(path)
    images = reference_images(4, seed=5)
    with torch.no_grad():
        assert torch.equal(again(images), net(images))
