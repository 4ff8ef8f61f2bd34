"""Rewards beyond the shapes verifier: CLIP score and PickScore-style (tiny random CLIP models
saved to local files: nothing is downloaded), JPEG (in)compressibility and the weighted sum.

Every test name carries clip or jpeg, so `pytest -k "clip or jpeg"` selects them.
"""
from __future__ import annotations

import json
import math

import numpy as np
import open_clip
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image

from jagg_lab.rewards import JpegCompressibility, Reward
from jagg_lab.rewards.clip import ClipScore, PickScoreStyle, preprocess_images
from jagg_lab.rewards.multi import MultiReward
from jagg_lab.train import ConfigError, build

TINY = "jagg-tiny-clip"
TINY_CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
PROMPTS = ["a red circle", "two squares", "a red circle", "a blue triangle"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def open_clip_weights(tmp_path_factory):
    """A tiny open_clip architecture registered from a JSON config, its random weights in a file."""
    root = tmp_path_factory.mktemp("clip")
    (root / f"{TINY}.json").write_text(json.dumps(TINY_CONFIG))
    open_clip.add_model_config(root / f"{TINY}.json")
    torch.manual_seed(0)
    model = open_clip.create_model(TINY)
    with torch.no_grad():
        model.logit_scale.fill_(math.log(50.0))  # a known temperature for the PickScore check
    path = root / "tiny_clip.pt"
    torch.save(model.state_dict(), path)
    return path, model.eval()


def images(seed: int = 0, batch: int = 4, size: int = 48) -> torch.Tensor:
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def direct_cosines(model, imgs: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """The reference computation with open_clip's own PIL preprocessing."""
    _, _, preprocess = open_clip.create_model_and_transforms(TINY)
    pil = [Image.fromarray((im.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)) for im in imgs]
    with torch.no_grad():
        image = model.encode_image(torch.stack([preprocess(p) for p in pil]), normalize=True)
        text = model.encode_text(open_clip.get_tokenizer(TINY)(prompts), normalize=True)
    return (image * text).sum(-1)


def quantized(imgs: torch.Tensor) -> torch.Tensor:
    return (imgs * 255).round() / 255  # what a PIL round trip sees


def test_clip_score_from_local_open_clip_weights(open_clip_weights):
    path, model = open_clip_weights
    reward = ClipScore(model_name=TINY, pretrained=str(path))
    imgs = quantized(images())
    out = reward.components(imgs, PROMPTS, [{}] * 4)
    assert out["reward"].shape == (4,) and torch.isfinite(out["reward"]).all()
    torch.testing.assert_close(out["reward"], 100 * out["cosine"])
    assert out["cosine"].abs().max() <= 1 + 1e-6
    # identical image/prompt pairs score identically; the score depends on the prompt
    same = reward(torch.stack([imgs[0]] * 3), ["a red circle"] * 2 + ["two squares"], [{}] * 3)
    assert same[0] == same[1] and same[0] != same[2]
    # and it is open_clip's own cosine with its PIL preprocessing (bicubic resize 48 -> 32)
    torch.testing.assert_close(out["cosine"], direct_cosines(model, imgs, PROMPTS), atol=2e-3, rtol=0)


def test_clip_torch_preprocessing_matches_open_clip_transform():
    preprocess = open_clip.image_transform(32, is_train=False)  # open_clip's eval transform: PIL in
    imgs = quantized(images(size=40))[:, :, :, :36]  # non-square: shortest side, then centre crop
    cfg = {"size": 32, "mean": open_clip.OPENAI_DATASET_MEAN, "std": open_clip.OPENAI_DATASET_STD,
           "interpolation": "bicubic", "resize_mode": "shortest"}
    ours = preprocess_images(imgs, **cfg)
    pil = [Image.fromarray((im.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)) for im in imgs]
    theirs = torch.stack([preprocess(p) for p in pil])
    assert ours.shape == theirs.shape == (4, 3, 32, 32)
    assert (ours - theirs).abs().mean() < 0.02  # PIL rounds to uint8 after resizing; torch does not


def test_pickscore_open_clip_is_logit_scale_times_cosine(open_clip_weights):
    path, _ = open_clip_weights
    reward = PickScoreStyle(model_name=TINY, pretrained=str(path), backend="open_clip", scale=0.5)
    out = reward.components(images(1), PROMPTS, [{}] * 4)
    assert out["reward"].shape == (4,) and torch.isfinite(out["reward"]).all()
    torch.testing.assert_close(out["reward"], 0.5 * 50.0 * out["cosine"])


def test_pickscore_transformers_backend_clip_from_local_directories(tmp_path):
    """PickScore_v1's published format: a transformers CLIPModel, with a separate processor dir."""
    from open_clip.tokenizer import bytes_to_unicode
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    chars = list(bytes_to_unicode().values())
    vocab = {t: i for i, t in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
                         max_position_embeddings=77, bos_token_id=512, eos_token_id=513, pad_token_id=513),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4, image_size=32, patch_size=8),
        projection_dim=16,
    )).eval()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "processor")
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path / "processor")

    reward = PickScoreStyle(pretrained=str(tmp_path / "model"), processor=str(tmp_path / "processor"), backend="transformers")
    imgs = images(2, size=32)
    out = reward.components(imgs, PROMPTS, [{}] * 4)
    assert out["reward"].shape == (4,) and torch.isfinite(out["reward"]).all()
    with torch.no_grad():
        mean = torch.tensor(CLIPImageProcessor().image_mean).view(1, 3, 1, 1)
        std = torch.tensor(CLIPImageProcessor().image_std).view(1, 3, 1, 1)
        img = model.get_image_features(pixel_values=(imgs - mean) / std)
        txt = model.get_text_features(**tokenizer(PROMPTS, padding=True, return_tensors="pt"))
        img, txt = [t if isinstance(t, torch.Tensor) else t.pooler_output for t in (img, txt)]
        cos = torch.nn.functional.cosine_similarity(img, txt, dim=-1)
    torch.testing.assert_close(out["cosine"], cos, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["reward"], model.logit_scale.exp().item() * cos, atol=1e-4, rtol=0)


def test_clip_missing_weights_fail_at_construction_naming_the_path(open_clip_weights, tmp_path):
    missing = tmp_path / "nope" / "open_clip_pytorch_model.bin"
    with pytest.raises(FileNotFoundError, match=f"reward.pretrained.*{missing}"):
        ClipScore(model_name=TINY, pretrained=str(missing))
    with pytest.raises(FileNotFoundError, match=f"reward.pretrained.*{tmp_path / 'nodir'}"):
        PickScoreStyle(pretrained=str(tmp_path / "nodir"), backend="transformers")
    with pytest.raises(FileNotFoundError, match="reward.processor"):
        PickScoreStyle(pretrained=str(tmp_path), processor=str(tmp_path / "noproc"), backend="transformers")
    with pytest.raises(ValueError, match="reward.model_name"):
        ClipScore(model_name="no-such-arch", pretrained=str(open_clip_weights[0]))
    with pytest.raises(ValueError, match="reward.backend"):
        ClipScore(model_name=TINY, pretrained=str(open_clip_weights[0]), backend="onnx")


def test_clip_missing_weights_stop_the_training_cli_before_any_work(hydra_cfg, tmp_path):
    missing = tmp_path / "missing.bin"
    cfg = hydra_cfg(["reward=clip", f"reward.pretrained={missing}", "policy=dit_xs"])
    with pytest.raises((ConfigError, FileNotFoundError), match=str(missing)):
        build(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_clip_and_pickscore_configs_instantiate_with_local_weights(hydra_cfg, open_clip_weights):
    path, _ = open_clip_weights
    for option, cls in (("clip", ClipScore), ("pickscore", PickScoreStyle)):
        cfg = hydra_cfg([f"reward={option}", f"reward.model_name={TINY}", f"reward.pretrained={path}", "reward.backend=open_clip",
                         "reward.device=cpu"])
        reward = instantiate(cfg.reward)
        assert isinstance(reward, cls)
        assert torch.isfinite(reward(images(3, batch=2), PROMPTS[:2], [{}, {}])).all()


# ---- JPEG and the weighted sum -----------------------------------------------------------------
def test_jpeg_incompressibility_flips_the_sign_of_compressibility(hydra_cfg):
    incompressible = instantiate(hydra_cfg(["reward=jpeg_incompressibility"]).reward)
    compressible = instantiate(hydra_cfg(["reward=jpeg"]).reward)
    assert isinstance(incompressible, JpegCompressibility) and incompressible.name == "jpeg_incompressibility"
    noisy, flat = images(4, batch=1, size=64), torch.full((1, 3, 64, 64), 0.5)
    batch = torch.cat([noisy, flat])
    up, down = incompressible.components(batch, ["x"] * 2, [{}] * 2), compressible.components(batch, ["x"] * 2, [{}] * 2)
    torch.testing.assert_close(up["reward"], -down["reward"])
    torch.testing.assert_close(up["reward"], up["jpeg_kb"])
    assert up["reward"][0] > up["reward"][1] > 0  # noise is what JPEG cannot compress


class Constant(Reward):
    name = "constant"

    def __init__(self, value: float):
        self.value = value

    def components(self, images, prompts, metadata):
        return {"reward": torch.full((images.shape[0],), self.value), "side": torch.zeros(images.shape[0])}


def test_multi_reward_weights_jpeg_and_reports_each_component(hydra_cfg):
    jpeg = JpegCompressibility(incompressible=True)
    multi = MultiReward({"jpeg": jpeg, "const": Constant(2.0)}, {"jpeg": 0.1, "const": -3.0})
    imgs = images(5, batch=3)
    out = multi.components(imgs, ["x"] * 3, [{}] * 3)
    size = jpeg(imgs, ["x"] * 3, [{}] * 3)
    torch.testing.assert_close(out["jpeg"], size)
    torch.testing.assert_close(out["const"], torch.full((3,), 2.0))
    torch.testing.assert_close(out["reward"], 0.1 * size - 6.0)
    assert set(out) == {"reward", "jpeg", "jpeg_jpeg_kb", "const", "const_side"}
    with pytest.raises(ValueError, match="reward.weights"):
        MultiReward({"jpeg": jpeg}, {"jpg": 1.0})
    # the shipped config: shapes verifier 1.0 + JPEG compressibility 0.1, composed from the other options
    reward = instantiate(hydra_cfg(["reward=multi"]).reward)
    prompts = ["a red circle", "two squares"]
    out = reward.components(images(6, batch=2, size=32), prompts, [{}, {}])
    torch.testing.assert_close(out["reward"], out["shapes"] + 0.1 * out["jpeg"])
    assert (out["jpeg"] < 0).all() and {"shapes_dense", "shapes_strict"} <= set(out)
