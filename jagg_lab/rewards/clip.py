"""CLIP-based rewards: CLIPScore and a PickScore-style preference score, from LOCAL weights.

Both embed images and prompts with a CLIP model and score their cosine similarity:

  * `ClipScore`:       reward = scale * cos(image, prompt)           (scale 100: the usual
    "CLIP score" convention, e.g. torchmetrics' CLIPScore without its clamp at 0; scale 1: raw cosine)
  * `PickScoreStyle`:  reward = scale * exp(logit_scale) * cos(...)  (PickScore's score: the
    model's learned temperature times the cosine, on a CLIP-H/14 fine-tuned on Pick-a-Pic;
    Flow-GRPO divides it by 26, i.e. scale = 1/26; GRPO's advantages are invariant to the scale)

Two backends load the model, both from local files only (nothing is downloaded):

  * `open_clip` (default): `model_name` is an open_clip architecture (`ViT-H-14`, `ViT-L-14`,
    or one registered with `open_clip.add_model_config`) and `pretrained` a state-dict file
    (`open_clip_pytorch_model.bin` / `.safetensors` of e.g. laion/CLIP-ViT-H-14-laion2B-s32B-b79K).
  * `transformers`: `pretrained` is a transformers `CLIPModel` directory (this is the format
    in which yuvalkirstain/PickScore_v1 is published) and `processor` a directory with its
    tokenizer and `preprocessor_config.json` (PickScore uses laion/CLIP-ViT-H-14-laion2B-s32B-b79K's).

Images are preprocessed in torch on the whole batch, following the model's own preprocessing
config (resize the shortest side with its interpolation, centre crop, normalise): no PIL round trip.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from jagg_lab.checkpointing import refuse_pickled_weights
from jagg_lab.rewards.base import Reward

__all__ = ["ClipBackbone", "ClipScore", "PickScoreStyle", "load_clip", "preprocess_images"]

BACKENDS = ("open_clip", "transformers")


def preprocess_images(
    images: torch.Tensor,
    size: int | tuple[int, int],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    interpolation: str = "bicubic",
    resize_mode: str = "shortest",
) -> torch.Tensor:
    """(B, 3, H, W) in [0, 1] -> (B, 3, h, w) normalised CLIP input, like open_clip's eval
    transform: resize (shortest side to `size`, or `squash` to exactly `size`), centre crop,
    clamp to [0, 1] (bicubic overshoots; PIL's uint8 path clamps too), normalise."""
    out_h, out_w = (size, size) if isinstance(size, int) else tuple(size)
    x = images.float()
    h, w = x.shape[-2:]
    mode = {"bicubic": "bicubic", "bilinear": "bilinear", "nearest": "nearest"}.get(interpolation)
    if mode is None:
        raise ValueError(f"unsupported CLIP interpolation {interpolation!r}")
    if resize_mode == "squash":
        target = (out_h, out_w)
    elif resize_mode == "shortest":
        # torchvision's Resize(int): the short side to the size, the long side truncated
        short = max(out_h, out_w)
        target = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
    else:
        raise ValueError(f"unsupported CLIP resize_mode {resize_mode!r} (shortest or squash)")
    if target != (h, w):
        antialias = mode in ("bicubic", "bilinear")
        x = F.interpolate(x, size=target, mode=mode, antialias=antialias, **({} if mode == "nearest" else {"align_corners": False}))
    top, left = int(round((x.shape[-2] - out_h) / 2)), int(round((x.shape[-1] - out_w) / 2))  # as CenterCrop
    x = x[..., top : top + out_h, left : left + out_w].clamp(0, 1)
    mean_t = torch.tensor(mean, device=x.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=x.device).view(1, -1, 1, 1)
    return (x - mean_t) / std_t


class ClipBackbone(nn.Module):
    """A frozen CLIP model behind one interface: `image_features(images in [0, 1]) -> (B, D)`,
    `text_features(prompts) -> (B, D)` (both L2-normalised) and `logit_scale` (exp'd, a float)."""

    def __init__(self, model: nn.Module, tokenize, preprocess: dict, backend: str):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.tokenize = tokenize
        self.preprocess = preprocess
        self.backend = backend

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.exp())

    @torch.no_grad()
    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        pixels = preprocess_images(images.to(self.device), **self.preprocess)
        dtype = next(self.model.parameters()).dtype
        if self.backend == "open_clip":
            feats = self.model.encode_image(pixels.to(dtype))
        else:
            feats = _pooled(self.model.get_image_features(pixel_values=pixels.to(dtype)))
        return F.normalize(feats.float(), dim=-1)

    @torch.no_grad()
    def text_features(self, prompts: list[str]) -> torch.Tensor:
        tokens = self.tokenize(prompts)
        if self.backend == "open_clip":
            feats = self.model.encode_text(tokens.to(self.device))
        else:
            feats = _pooled(self.model.get_text_features(**{k: v.to(self.device) for k, v in tokens.items()}))
        return F.normalize(feats.float(), dim=-1)


def _pooled(out) -> torch.Tensor:
    # transformers < 5 returns the projected features, >= 5 an output object holding them
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def load_clip(
    model_name: str | None,
    pretrained: str,
    *,
    backend: str = "open_clip",
    processor: str | None = None,
    device: str | None = None,
    precision: str = "fp32",
    key: str = "reward",
) -> ClipBackbone:
    """A frozen CLIP model from local files; errors name `<key>.pretrained` / `<key>.processor`."""
    if backend not in BACKENDS:
        raise ValueError(f"{key}.backend must be one of {list(BACKENDS)}, got {backend!r}")
    if precision not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"{key}.precision must be fp32, fp16 or bf16, got {precision!r}")
    if not pretrained:
        raise ValueError(f"{key}.pretrained is required: a local path to the CLIP weights")
    path = Path(pretrained).expanduser()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    if backend == "open_clip":
        if not path.is_file():
            raise FileNotFoundError(f"{key}.pretrained: no such weights file {path}")
        import open_clip

        if model_name not in open_clip.list_models():
            raise ValueError(f"{key}.model_name {model_name!r} is not an open_clip architecture (see open_clip.list_models())")
        try:
            # weights_only: torch's restricted unpickler, which builds tensors and containers, nothing else
            model = open_clip.create_model(model_name, pretrained=str(path), precision=precision, device=device,
                                           weights_only=True)
        except (RuntimeError, OSError, KeyError, ValueError, pickle.UnpicklingError) as err:
            raise ValueError(f"{key}.pretrained: cannot load {path} into open_clip {model_name!r}: {err}") from err
        cfg = dict(model.visual.preprocess_cfg)
        preprocess = {k: cfg[k] for k in ("size", "mean", "std", "interpolation", "resize_mode")}
        tokenizer = open_clip.get_tokenizer(model_name)
        return ClipBackbone(model, tokenizer, preprocess, backend)

    # transformers: a CLIPModel directory plus a tokenizer / image-processor directory
    if not path.is_dir():
        raise FileNotFoundError(f"{key}.pretrained: no such transformers CLIPModel directory {path}")
    proc_path = Path(processor).expanduser() if processor else path
    if not proc_path.is_dir():
        raise FileNotFoundError(f"{key}.processor: no such tokenizer/processor directory {proc_path}")
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

    refuse_pickled_weights(path, f"{key}.pretrained")
    try:
        model = CLIPModel.from_pretrained(str(path), local_files_only=True, use_safetensors=True).to(device=device, dtype=dtype)
    except (OSError, ValueError) as err:
        raise ValueError(f"{key}.pretrained: cannot load a transformers CLIPModel from {path}: {err}") from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(proc_path), local_files_only=True)
        image_processor = CLIPImageProcessor.from_pretrained(str(proc_path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(f"{key}.processor: cannot load a CLIP tokenizer and preprocessor_config.json from {proc_path}: {err}") from err
    crop = image_processor.crop_size
    size = (crop, crop) if isinstance(crop, int) else (int(crop["height"]), int(crop["width"]))  # dict or SizeDict
    resample = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(int(getattr(image_processor, "resample", 3)), "bicubic")
    preprocess = {"size": size, "mean": tuple(image_processor.image_mean), "std": tuple(image_processor.image_std),
                  "interpolation": resample, "resize_mode": "shortest"}
    max_length = min(int(getattr(tokenizer, "model_max_length", 77)), model.config.text_config.max_position_embeddings)

    def tokenize(prompts: list[str]) -> dict[str, torch.Tensor]:
        return tokenizer(prompts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")

    return ClipBackbone(model, tokenize, preprocess, backend)


class _ClipReward(Reward):
    """Shared by both scores: embeds each distinct prompt once per call, images in chunks."""

    def __init__(self, model_name, pretrained, backend, processor, device, precision, scale, batch_size):
        if batch_size < 1:
            raise ValueError(f"reward.batch_size must be >= 1, got {batch_size}")
        self.backbone = load_clip(model_name, pretrained, backend=backend, processor=processor, device=device, precision=precision)
        self.scale = float(scale)
        self.batch_size = batch_size

    def cosines(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """cos(image_i, prompt_i) for images (B, 3, H, W) in [0, 1] -> (B,) float32 on CPU."""
        if images.shape[0] != len(prompts):
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        unique = list(dict.fromkeys(prompts))
        text = self.backbone.text_features(unique)
        text = text[torch.tensor([unique.index(p) for p in prompts], device=text.device)]
        image = torch.cat([self.backbone.image_features(chunk) for chunk in images.detach().split(self.batch_size)])
        return (image * text).sum(-1).cpu()


class ClipScore(_ClipReward):
    """reward = scale * cos(CLIP image embedding, CLIP prompt embedding); logs `cosine` too.

    model_name: open_clip architecture (open_clip backend). pretrained: LOCAL weights (file for
    open_clip, CLIPModel directory for transformers). processor: tokenizer/preprocessor directory
    (transformers backend; default: `pretrained`). device: default cuda when available.
    precision: fp32 | fp16 | bf16. scale: 100 (CLIP-score convention) or 1 (raw cosine).
    batch_size: images per CLIP forward.
    """

    name = "clip_score"

    def __init__(
        self,
        model_name: str | None = "ViT-L-14",
        pretrained: str | None = None,
        backend: str = "open_clip",
        processor: str | None = None,
        device: str | None = None,
        precision: str = "fp32",
        scale: float = 100.0,
        batch_size: int = 64,
    ):
        super().__init__(model_name, pretrained, backend, processor, device, precision, scale, batch_size)

    def components(self, images, prompts, metadata):
        cos = self.cosines(images, prompts)
        return {"reward": self.scale * cos, "cosine": cos}


class PickScoreStyle(_ClipReward):
    """reward = scale * exp(logit_scale) * cos(image, prompt): PickScore's preference score
    (PickScore_v1 = CLIP-H/14 fine-tuned on Pick-a-Pic; typical values ~ 18-24). Logs `cosine`.
    Arguments as `ClipScore`; scale 1 gives PickScore's raw value (Flow-GRPO uses 1/26).
    """

    name = "pickscore"

    def __init__(
        self,
        model_name: str | None = "ViT-H-14",
        pretrained: str | None = None,
        backend: str = "open_clip",
        processor: str | None = None,
        device: str | None = None,
        precision: str = "fp32",
        scale: float = 1.0,
        batch_size: int = 64,
    ):
        super().__init__(model_name, pretrained, backend, processor, device, precision, scale, batch_size)

    def components(self, images, prompts, metadata):
        cos = self.cosines(images, prompts)
        return {"reward": self.scale * self.backbone.logit_scale * cos, "cosine": cos}
