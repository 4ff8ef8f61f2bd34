"""The prompt stream GRPO trains on: whole batches of P prompts, a pure function of (seed, index)."""
from itertools import islice

import pytest

from jagg_lab.data import PromptDataModule, read_prompt_file
from jagg_lab.worlds.shapes import all_prompts, parse


def batches(data: PromptDataModule, n: int) -> list[dict]:
    return list(islice(iter(data.train_dataloader()), n))


def test_each_batch_holds_prompts_per_step_prompts_with_their_category():
    data = PromptDataModule(prompts_per_step=5, group_size=3, seed=0)
    assert data.samples_per_step == 15  # every prompt becomes a whole group of group_size samples
    out = batches(data, 4)
    assert [b["index"] for b in out] == [0, 1, 2, 3]
    for batch in out:
        assert len(batch["prompts"]) == len(batch["metadata"]) == 5
        assert [m["category"] for m in batch["metadata"]] == [parse(p).category for p in batch["prompts"]]


def test_the_stream_is_deterministic_per_seed():
    prompts = lambda seed: [b["prompts"] for b in batches(PromptDataModule(prompts_per_step=4, seed=seed), 3)]  # noqa: E731
    assert prompts(7) == prompts(7)
    assert prompts(7) != prompts(8)


def test_start_index_resumes_the_stream_where_it_stopped():
    straight = batches(PromptDataModule(prompts_per_step=4, seed=1), 6)
    resumed = PromptDataModule(prompts_per_step=4, seed=1)
    resumed.start_index = 4
    assert batches(resumed, 2) == straight[4:]


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_prompts_come_from_the_chosen_split(split):
    pool = set(all_prompts(split))
    drawn = [p for b in batches(PromptDataModule(split=split, prompts_per_step=8), 5) for p in b["prompts"]]
    assert set(drawn) <= pool


def test_file_prompts_skip_comments_and_blank_lines(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("# a comment\na cat\n\n  a dog  \n   # indented comment\n")
    assert read_prompt_file(path) == ["a cat", "a dog"]
    data = PromptDataModule(source="file", prompt_file=str(path), prompts_per_step=6, seed=0)
    out = batches(data, 3)
    assert {p for b in out for p in b["prompts"]} <= {"a cat", "a dog"}
    assert all(m == {} for b in out for m in b["metadata"])


def test_unreadable_prompt_files_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_prompt_file(tmp_path / "missing.txt")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_prompt_file(binary)


@pytest.mark.parametrize("kwargs,key", [
    (dict(source="web"), "data.source"),
    (dict(source="file"), "data.prompt_file"),
    (dict(split="test"), "data.split"),
    (dict(group_size=1), "data.group_size"),
    (dict(prompts_per_step=0), "data.prompts_per_step"),
])
def test_bad_values_are_refused_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        PromptDataModule(**kwargs)


def test_categories_restrict_the_prompt_mix_and_share_it_equally():
    data = PromptDataModule(prompts_per_step=8, seed=0, categories=["colors", "counting"])
    seen = [m["category"] for b in batches(data, 40) for m in b["metadata"]]
    assert set(seen) == {"colors", "counting"} and abs(seen.count("colors") - seen.count("counting")) < 0.2 * len(seen)
    assert [b["prompts"] for b in batches(PromptDataModule(prompts_per_step=4, seed=3), 3)] == \
        [b["prompts"] for b in batches(PromptDataModule(prompts_per_step=4, seed=3, categories=None), 3)]


@pytest.mark.parametrize("categories", [["position", "shading"], []])
def test_unknown_or_no_categories_are_refused(categories):
    with pytest.raises(ValueError, match="data.categories"):
        PromptDataModule(categories=categories)
