"""DiffusersPolicy.from_pretrained on a saved tiny pipeline directory, and its errors."""
from __future__ import annotations

import json

import pytest
import torch

from jagg_lab.policies.diffusers import SD3_LORA_TARGETS, DiffusersPolicy
from tests.policies.diffusers.tiny import KINDS, RESOLUTION, tiny_transformer, tiny_vae


@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_bad_pretrained_fails_naming_the_key(kind, tmp_path):
    with pytest.raises(ValueError, match="policy.pretrained"):
        DiffusersPolicy.from_pretrained(kind=kind, pretrained=None)
    with pytest.raises(FileNotFoundError, match="policy.pretrained.*no such"):
        DiffusersPolicy.from_pretrained(kind=kind, pretrained=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="policy.pretrained.*model_index.json"):
        DiffusersPolicy.from_pretrained(kind=kind, pretrained=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="policy.pretrained"):
        DiffusersPolicy.from_pretrained(kind=kind, pretrained="nobody/not-in-the-local-cache")
    with pytest.raises(ValueError, match="policy.kind"):
        DiffusersPolicy.from_pretrained(kind="sdxl", pretrained=str(tmp_path))


def _tiny_clip_tokenizer():
    from open_clip.tokenizer import bytes_to_unicode
    from transformers import CLIPTokenizer

    chars = list(bytes_to_unicode().values())
    vocab = {t: i for i, t in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77), len(vocab)


def test_sd3_loads_a_local_pipeline_directory_and_uses_its_encode_prompt(tmp_path):
    """The config path: DiffusersPolicy.from_pretrained(kind=sd3, pretrained=DIR) on a saved tiny
    SD3 pipeline (two tiny CLIP text encoders, no T5, as diffusers allows)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    tokenizer, vocab_size = _tiny_clip_tokenizer()
    torch.manual_seed(0)

    def text_encoder():
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=77, projection_dim=32, bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1,
            pad_token_id=vocab_size - 1,
        ))

    pipe = StableDiffusion3Pipeline(
        transformer=tiny_transformer("sd3"), scheduler=FlowMatchEulerDiscreteScheduler(), vae=tiny_vae(),
        text_encoder=text_encoder(), tokenizer=tokenizer, text_encoder_2=text_encoder(), tokenizer_2=tokenizer,
        text_encoder_3=None, tokenizer_3=None,
    )
    pipe.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "model_index.json").read_text())["text_encoder_3"] == [None, None]
    policy = DiffusersPolicy.from_pretrained(
        kind="sd3", pretrained=str(tmp_path), resolution=RESOLUTION, dtype="float32", lora_rank=4, lora_alpha=8,
        lora_target_modules=list(SD3_LORA_TARGETS), max_sequence_length=8,
    )
    cond = policy.encode_prompts(["a red circle", ""])
    embeds, _, pooled, _ = pipe.encode_prompt(prompt=["a red circle", ""], prompt_2=None, prompt_3=None, device="cpu",
                                              do_classifier_free_guidance=False, max_sequence_length=8)
    torch.testing.assert_close(cond["prompt_embeds"], embeds)
    torch.testing.assert_close(cond["pooled"], pooled)
    assert cond["prompt_embeds"].shape == (2, 77 + 8, 64)  # CLIP tokens, then (absent, zero) T5 tokens
    x = torch.randn(2, *policy.sample_shape)
    s = torch.tensor([0.9, 0.3])
    with torch.no_grad():
        expected = pipe.transformer(hidden_states=x, encoder_hidden_states=embeds, pooled_projections=pooled,
                                    timestep=s * 1000, return_dict=False)[0]
        torch.testing.assert_close(policy(x, s, cond), expected)  # LoRA B = 0: the pipeline's transformer
    assert policy.has_adapters and all("lora_" in n for n, p in policy.named_parameters() if p.requires_grad)
