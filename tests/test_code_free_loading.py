"""Weights a user names for other libraries load without running code: diffusers pipelines and
transformers CLIP models as safetensors only (a pickled weight file is refused naming it), open_clip
weights through torch's restricted unpickler (a file that would run code is refused)."""
import json

import pytest
import torch

from jagg_lab.checkpointing import refuse_pickled_weights
from jagg_lab.policies.diffusers import DiffusersPolicy
from jagg_lab.rewards.clip import ClipScore, PickScoreStyle
from jagg_lab.rundir import ConfigError
from tests.rewards.test_clip import TINY, open_clip_weights  # noqa: F401  (the fixture)
from tests.test_checkpointing import Payload


def test_a_pickled_component_of_a_diffusers_pipeline_is_refused_naming_it(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline",
                                                           "transformer": ["diffusers", "SD3Transformer2DModel"]}))
    (tmp_path / "transformer").mkdir()
    weights = tmp_path / "transformer" / "diffusion_pytorch_model.bin"
    weights.write_bytes(b"a pickle")
    with pytest.raises(ConfigError, match=f"policy.pretrained: {weights} is a pickled weight file.*safetensors only"):
        DiffusersPolicy.from_pretrained(kind="sd3", pretrained=str(tmp_path))
    # beside its safetensors twin (diffusers saves both in some versions) it is not read, and not refused
    (tmp_path / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    refuse_pickled_weights(tmp_path, "policy.pretrained")


def test_a_pickled_transformers_clip_model_is_refused_naming_it(tmp_path):
    from transformers import CLIPConfig, CLIPModel

    model = CLIPModel(CLIPConfig(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
                         max_position_embeddings=77),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4, image_size=32,
                           patch_size=8),
        projection_dim=16))
    # the pre-safetensors format: config.json and a pickled pytorch_model.bin
    model.config.save_pretrained(tmp_path / "model")
    pickled = [tmp_path / "model" / "pytorch_model.bin"]
    torch.save(model.state_dict(), pickled[0])
    (tmp_path / "processor").mkdir()
    with pytest.raises(ConfigError, match=f"reward.pretrained: {pickled[0]} is a pickled weight file"):
        PickScoreStyle(pretrained=str(tmp_path / "model"), processor=str(tmp_path / "processor"), backend="transformers")


def test_open_clip_weights_that_would_run_code_are_refused_and_do_not(open_clip_weights, tmp_path):  # noqa: F811
    marker = tmp_path / "ran"
    crafted = tmp_path / "crafted.pt"
    torch.save({"payload": Payload(marker)}, crafted)
    with pytest.raises(ValueError, match=f"reward.pretrained: cannot load {crafted}"):
        ClipScore(model_name=TINY, pretrained=str(crafted))
    assert not marker.exists()
    ClipScore(model_name=TINY, pretrained=str(open_clip_weights[0]))  # plain tensors load
