"""What every benchmark shares: a module assembled as training does, one rollout's
advantages, the timed gradient phase, the machine it ran on, and checks of the settings.

The gradient phase is `GRPOObjective.backward`, the call a training step makes after its
rollout, so a benchmark times exactly the training code with the strategy passed in.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate
from lightning.pytorch.plugins.precision import MixedPrecision
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from safetensors import safe_open
from torch import nn

from jagg_lab import CONF_DIR
from jagg_lab.grpo import GRPOConfig, expand_groups, rollout_advantages
from jagg_lab.module import GRPOModule
from jagg_lab.policies import SHIPPED_CHECKPOINT, DiTConfig, DiTPolicy, fill_zero_init_
from jagg_lab.renamed import check_renamed, renamed_overrides
from jagg_lab.rewards.base import Reward, check_scores
from jagg_lab.sampling import SDESampler
from jagg_lab.strategies import FullStrategy, GradientStrategy
from jagg_lab.strategies.core import combine_stats
from jagg_lab.types import Rollout
from jagg_lab.worlds.shapes import sample_prompt

__all__ = [
    "training_config", "training_setting", "training_rollout",
    "dit_policy", "project_path", "grpo_module", "grouped_prompts", "advantages", "sync", "gradient_phase", "machine",
    "BF16_FLAGS", "cpu_bf16_flags",
    "PRECISIONS", "precision_context", "check_precisions",
    "MEMORY_METHODS", "Memory", "is_out_of_memory", "free_memory", "limit_memory", "measure_memory",
    "check_device", "check_minimum", "check_resolution", "check_sampling", "command_line", "write_json",
]


# ---- the module and its rollout ---------------------------------------------------------
def training_config(experiment: str, seed: int, overrides: list[str]) -> DictConfig:
    """The training config of `python -m jagg_lab.train +experiment=E seed=S ...`, composed and
    checked as training checks it; a bad experiment or override raises ValueError naming it."""
    renamed = renamed_overrides(overrides)
    if renamed:
        raise ValueError(f"overrides: {'; '.join(renamed)}")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[f"+experiment={experiment}", f"seed={seed}", *overrides])
        check_renamed(cfg)
        sampler, grpo, data = instantiate(cfg.sampler), instantiate(cfg.grpo), instantiate(cfg.data)
        grpo.check_batch(data.samples_per_step)
        grpo.trained_steps(sampler.num_steps)
        instantiate(cfg.strategy)
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise ValueError(f"experiment/overrides: {getattr(err, '__cause__', None) or err}") from None
    return cfg


def training_setting(cfg: DictConfig, seed: int, device: str):
    """(module, data) of a training config: the policy, sampler, reward and GRPO settings a run
    of it trains with. The module's own strategy (full) is never used: benchmarks pass theirs."""
    data, sampler, grpo = instantiate(cfg.data), instantiate(cfg.sampler), instantiate(cfg.grpo)
    torch.manual_seed(seed)  # the policy's random weights, as a run of this seed draws them
    policy = instantiate(cfg.policy)
    module = GRPOModule(policy=policy, sampler=sampler, reward=instantiate(cfg.reward), strategy=FullStrategy(), grpo=grpo,
                        optimizer=lambda params: None, group_size=data.group_size, seed=seed, sample_every=0).to(device)
    return module, data


def training_rollout(module: GRPOModule, data, batch: dict, index: int, device: str) -> tuple[Rollout, torch.Tensor]:
    """Rollout `index` of a training run's prompt stream (`batch` its prompts), with the noise and
    advantages that run's step would draw for it; the policy's weights as they are."""
    prompts, metadata, group_ids = module.groups(batch)
    module.policy.eval()
    rollout = module.make_rollout(prompts, module.rollout_generator(index), index)
    scores = module.reward(module.policy.decode(rollout.final), prompts, metadata)
    rewards = check_scores(scores, len(prompts), module.reward.name).float().to(device)
    return rollout, module.advantages(rewards, group_ids, index)


def dit_policy(size: str, resolution: int, checkpoint: str | None, seed: int) -> tuple[nn.Module, str]:
    """The shapes DiT and where its weights came from. "shipped" falls back to random weights
    where the file is absent or made for another size / resolution; random weights get their
    zero-init layers filled (else the gradients of most strategies would coincide)."""
    if checkpoint == "shipped" and not _shipped_fits(size, resolution):
        checkpoint = None
    torch.manual_seed(seed)
    policy = DiTPolicy(size=size, resolution=resolution, checkpoint=checkpoint)
    if checkpoint is None:
        return fill_zero_init_(policy, seed), "random (zero-init layers filled)"
    return policy, project_path(SHIPPED_CHECKPOINT if checkpoint == "shipped" else checkpoint)


def project_path(path: str | Path) -> str:
    """A path as reports name it: relative to the project when inside it, never a machine's home."""
    path = Path(path).resolve()
    root = Path(__file__).resolve().parents[2]
    return str(path.relative_to(root)) if path.is_relative_to(root) else path.name


def _shipped_fits(size: str, resolution: int) -> bool:
    if not SHIPPED_CHECKPOINT.is_file():
        return False
    with safe_open(str(SHIPPED_CHECKPOINT), framework="pt") as f:
        meta = f.metadata() or {}
    return meta.get("size") == size and json.loads(meta.get("config", "{}")).get("resolution") == resolution


def grpo_module(policy: nn.Module, reward: Reward, *, num_steps: int, shift: float, guidance: float,
                train_fraction: float, group_size: int, seed: int, device: str) -> GRPOModule:
    """A module assembled as training does. Its own strategy (full) is never used here: the
    benchmarks pass each strategy to `gradient_phase`."""
    return GRPOModule(
        policy=policy.to(device),
        sampler=SDESampler(num_steps=num_steps, shift=shift, guidance=guidance),
        reward=reward,
        strategy=FullStrategy(),
        grpo=GRPOConfig(train_fraction=train_fraction),
        optimizer=lambda params: torch.optim.AdamW(params),
        group_size=group_size,
        seed=seed,
        sample_every=0,
    ).to(device)


def grouped_prompts(prompts: int, group_size: int, seed: int) -> list[str]:
    """`prompts` training prompts, each repeated `group_size` times (one GRPO group each)."""
    rng = np.random.default_rng(seed)
    return expand_groups([sample_prompt(rng, "train") for _ in range(prompts)], group_size)[0]


def advantages(module: GRPOModule, rollout: Rollout, prompts: list[str], seed: int) -> torch.Tensor:
    """Reward -> group advantages, as a training step computes them, (B,)."""
    images = module.policy.decode(rollout.final)
    rewards = check_scores(module.reward(images, prompts, [{}] * len(prompts)), len(prompts), module.reward.name)
    device = rollout.final.device
    group_ids = expand_groups(prompts[::module.group_size], module.group_size, device=device)[2]
    adv = rollout_advantages(rewards.to(device), group_ids, module.grpo)
    if torch.all(adv == 0):  # a constant reward gives no signal to compare gradients on
        adv = torch.randn(len(prompts), generator=torch.Generator().manual_seed(seed)).to(device)
    return adv


# ---- precision: what a training step runs under ----------------------------------------------
# trainer.precision values a training step can run in: float32, or the transformer under bfloat16
# autocast with the SDE math, log-probs, rewards and optimizer state in float32
PRECISIONS = ("32-true", "bf16-mixed")


def precision_context(precision: str, device: str) -> contextlib.AbstractContextManager:
    """What `Trainer(precision=...)` runs training_step under: Lightning's own mixed-precision
    plugin's autocast for bf16-mixed, nothing for 32-true."""
    if precision in ("32-true", "32"):
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return MixedPrecision("bf16-mixed", "cuda" if device.startswith("cuda") else "cpu").forward_context()
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def check_precisions(key: str, precisions: list[str]) -> None:
    if not precisions or len(set(precisions)) != len(precisions) or any(p not in PRECISIONS for p in precisions):
        raise ValueError(f"{key}: a non-empty list without repeats of {list(PRECISIONS)}, got {precisions}")


# ---- the timed gradient phase --------------------------------------------------------------
def sync(device: str) -> None:
    """Wait for queued GPU work, so a wall-clock time covers it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gradient_phase(module: GRPOModule, strategy: GradientStrategy, rollout: Rollout, advantages: torch.Tensor,
                   device: str, micro_batches: int = 1, steps: list | None = None, index: int = 0,
                   forward: Callable | None = None) -> tuple[float, dict]:
    """What a training step runs after its rollout (number `index`: its drawn blocks), on-policy,
    from zeroed gradients (left in .grad): the whole batch in `micro_batches` micro-batches (1: one).
    forward: what the strategy calls as the policy (default the policy; e.g. a torch.compile of it).
    Returns (seconds, the strategy's stats combined over micro-batches: counts summed, the rest
    averaged); `steps`, if given, receives the loss statistics (StepStats) of every trained step
    of every micro-batch."""
    module.policy.train()
    module.policy.zero_grad(set_to_none=True)
    total = rollout.final.shape[0]
    params = module.trainable_parameters()
    parts = []
    sync(device)
    start = time.perf_counter()
    policy = module.policy if forward is None else forward  # (a compiled module refuses bool())
    for idx in torch.arange(total, device=rollout.final.device).chunk(micro_batches):
        parts.append(module.objective.loss.backward(strategy, policy, rollout, advantages, idx, scale=len(idx) / total,
                                                    on_policy=True, params=params,
                                                    draw=module.objective.block_generator(idx, index)))
    sync(device)
    seconds = time.perf_counter() - start
    if steps is not None:
        steps += [step for _, per_step in parts for step in per_step]
    return seconds, combine_stats([stats for stats, _ in parts])


# ---- memory: what a phase needs, and what happens when it does not fit ----------------------
MEMORY_METHODS = {
    "cuda": "torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus memory_allocated right before "
            "the gradient phase (peak_allocated_mib: max_memory_allocated itself, weights included)",
    "cpu": "torch.profiler (profile_memory=True) allocation/free events of the CPU allocator: peak of the running sum "
           "of tensor bytes allocated minus freed during the gradient phase (tensors live before it excluded); "
           "peak_allocated_mib is not measured on CPU",
}


@dataclass
class Memory:
    """status: "ok", or "oom" when the phase ran out of memory (CUDA) or its measured peak
    exceeded the benchmark's memory limit (CPU, whose allocator has no limit to hit)."""

    status: str
    peak_mib: float | None = None  # the phase's own peak, above what was live before it
    peak_allocated_mib: float | None = None  # CUDA: the device's peak allocation, weights included


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def free_memory(module: GRPOModule, device: str) -> None:
    module.policy.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def limit_memory(device: str, limit_gib: float | None) -> None:
    """On CUDA, cap this process's allocations at limit_gib (a real out-of-memory past it)."""
    if limit_gib is not None and device.startswith("cuda"):
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_gib * 2**30 / total), device)


def measure_memory(fn: Callable[[], object], device: str, limit_gib: float | None = None) -> Memory:
    """Run fn() once, untimed, and measure its peak memory (see MEMORY_METHODS); an
    out-of-memory error, or on CPU a peak over limit_gib, gives status "oom"."""
    try:
        if device.startswith("cuda"):
            sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            fn()
            sync(device)
            peak = torch.cuda.max_memory_allocated(device)
            return Memory("ok", (peak - before) / 2**20, peak / 2**20)
        # The process's RSS would hide reuse of memory freed by earlier configurations (the
        # allocator keeps it); the profiler sees every tensor allocation and free instead.
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        return Memory("oom")
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()  # + on allocation, - on free
        peak = max(peak, live)
    over = limit_gib is not None and peak > limit_gib * 2**30
    return Memory("oom" if over else "ok", peak / 2**20)


def machine(device: str) -> dict:
    """What a reader needs to place a timing: the device, the CPU and the software."""
    cuda = device.startswith("cuda")
    return {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None, "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_bf16": cpu_bf16_flags(),
    }


# CPU flags of native bfloat16 arithmetic (Linux /proc/cpuinfo names): AMX tiles, AVX-512 BF16 dot products
BF16_FLAGS = ("amx_bf16", "avx512_bf16", "avx_vnni_bf16", "avx_ne_convert")


def cpu_bf16_flags() -> list[str]:
    """The CPU's native bfloat16 instruction sets (BF16_FLAGS it reports; [] where none or unknown):
    without one, bfloat16 matmuls are converted in software and cannot beat float32."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in BF16_FLAGS if f in flags]


def command_line(args: object, prog: str) -> str:
    """The command that reproduces a report: `prog` and the arguments that differ from the defaults."""
    given = []
    for f in fields(args):
        value, default = getattr(args, f.name), f.default if f.default is not MISSING else f.default_factory()
        if value != default:
            text = "[" + ",".join(map(str, value)) + "]" if isinstance(value, list) else str(value)
            given.append(f'"{f.name}={text}"' if isinstance(value, list) else f"{f.name}={text}")
    return " ".join([prog, *given])


def write_json(report: dict, out: str) -> None:
    """Write atomically: a reader never sees half a file, and an interrupted run leaves its last
    complete partial report."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)


# ---- checks of the settings, each naming the benchmark's own key ---------------------------
def check_device(device: str) -> None:
    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise ValueError(f"device must be 'cpu' or an available 'cuda[:N]', got {device!r}")


def check_minimum(args: object, minimums: dict[str, int]) -> None:
    """Each named field of `args` (an int, or a list of ints) is at least its minimum."""
    for key, low in minimums.items():
        value = getattr(args, key)
        if any(v < low for v in (value if isinstance(value, list) else [value])):
            raise ValueError(f"{key} must {'all ' if isinstance(value, list) else ''}be >= {low}, got {value}")


def check_resolution(key: str, resolution: int) -> None:
    try:
        DiTConfig(vocab_size=1, max_text_length=1, resolution=resolution)
    except ValueError as err:
        raise ValueError(f"{key}: {resolution} does not fit the DiT: {err}") from None


def check_sampling(num_steps: int, shift: float, guidance: float, train_fraction: float = 1.0) -> None:
    try:
        SDESampler(num_steps=num_steps, shift=shift, guidance=guidance)
        GRPOConfig(train_fraction=train_fraction)
    except ValueError as err:  # their messages name sampler.<key> / grpo.<key>
        raise ValueError(str(err).replace("sampler.", "").replace("grpo.", "")) from None
