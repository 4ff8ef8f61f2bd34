"""The pretraining learning-rate schedule: linear warmup, constant, linear decay to 0."""
import pytest

from jagg_lab.pretrain import PretrainModule, lr_factor


def test_warmup_stable_decay() -> None:
    f = [lr_factor(i, warmup_steps=10, decay_steps=20, max_steps=100) for i in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == 1.0  # warmup
    assert f[10:80] == [1.0] * 70  # stable
    assert f[90] == pytest.approx(0.5) and f[99] == pytest.approx(0.05)  # decay towards 0 at max_steps
    assert all(a >= b for a, b in zip(f[9:], f[10:]))


def test_no_decay_keeps_the_rate_constant() -> None:
    assert lr_factor(10**6, warmup_steps=10, decay_steps=0, max_steps=100) == 1.0


def test_negative_decay_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="decay_steps"):
        PretrainModule(policy=None, decay_steps=-1)
