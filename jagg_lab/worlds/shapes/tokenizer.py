"""Word-level tokenizer over the shapes grammar's closed vocabulary.

Id 0 is padding; words take ids 1..len(VOCABULARY) in ``grammar.VOCABULARY`` order. The empty
prompt "" is the null prompt for classifier-free guidance and encodes to all padding.
"""

from __future__ import annotations

import torch

from jagg_lab.worlds.shapes.grammar import VOCABULARY, all_prompts

__all__ = ["PAD_TOKEN", "Tokenizer"]

PAD_TOKEN = "<pad>"


def _longest_prompt_length() -> int:
    return max(len(p.split()) for p in all_prompts("all"))


class Tokenizer:
    """Maps prompts to fixed-length LongTensors of word ids (right-padded with ``pad_id``)."""

    pad_id: int = 0

    def __init__(self, max_length: int | None = None) -> None:
        """``max_length`` defaults to the longest prompt of the grammar (8 words)."""
        longest = _longest_prompt_length()
        self.max_length = longest if max_length is None else int(max_length)
        if self.max_length < longest:
            raise ValueError(f"max_length={self.max_length} is shorter than the longest prompt ({longest} words)")
        self.vocab: tuple[str, ...] = (PAD_TOKEN, *VOCABULARY)
        self._ids = {word: i for i, word in enumerate(self.vocab) if i != self.pad_id}

    @property
    def vocab_size(self) -> int:
        """Number of ids including padding."""
        return len(self.vocab)

    def _word_ids(self, text: str) -> list[int]:
        words = text.lower().split()
        if len(words) > self.max_length:
            raise ValueError(f"prompt {text!r} has {len(words)} words, more than max_length={self.max_length}")
        ids = []
        for word in words:
            if word not in self._ids:
                raise ValueError(f"unknown word {word!r} in prompt {text!r}")
            ids.append(self._ids[word])
        return ids + [self.pad_id] * (self.max_length - len(ids))

    def encode(self, text: str) -> torch.Tensor:
        """Prompt -> LongTensor [max_length]. Lower-cases and splits on whitespace; raises
        ValueError naming the first unknown word, or if the prompt is too long."""
        return torch.tensor(self._word_ids(text), dtype=torch.long)

    def encode_batch(self, texts: list[str]) -> torch.Tensor:
        """Prompts -> LongTensor [B, max_length]."""
        rows = [self._word_ids(t) for t in texts]
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), self.max_length)

    def decode(self, ids: torch.Tensor) -> str:
        """LongTensor [max_length] -> prompt text (padding dropped)."""
        return " ".join(self.vocab[i] for i in ids.tolist() if i != self.pad_id)

    def attention_mask(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool mask of real (non-pad) tokens, same shape as ``ids``."""
        return ids != self.pad_id
