"""The bias / added-variance summary of an estimator against a reference, on synthetic draws."""
import torch

from jagg_lab.strategies.bias import ErrorSums, bias_summary


def draws(n, bias_scale, seed=0, dim=500):
    gen = torch.Generator().manual_seed(seed)
    signal = torch.randn(dim, generator=gen)
    offset = bias_scale * torch.randn(dim, generator=gen)
    sums = ErrorSums()
    for _ in range(n):
        f = signal + 10 * torch.randn(dim, generator=gen)  # one draw ~10x its mean, as in GRPO
        sums.add(f + offset + torch.randn(dim, generator=gen), f)
    return bias_summary(sums)


def test_unbiased_errors_average_out():
    out = draws(64, bias_scale=0.0)
    assert 0.5 < out["z"] < 1.5 and abs(out["halves_cosine"]) < 0.3
    assert out["per_rollout_cosine"] > 0.99  # a close estimate per draw...
    assert 0.05 < out["rel_error"] < 0.15  # ...whose error is a tenth of the reference's own noise


def test_a_systematic_error_grows_z_with_n_and_points_one_way():
    small, large = draws(16, bias_scale=0.5), draws(64, bias_scale=0.5)
    assert large["z"] > 10 and large["z"] > 2 * small["z"]
    assert large["halves_cosine"] > 0.8
    assert 0.3 < large["bias_over_mean_full"] < 0.7  # |offset| / |signal|, about 0.5


def test_tail_columns_tell_a_concentrated_error_from_a_spread_one():
    gen = torch.Generator().manual_seed(1)
    spread, concentrated = ErrorSums(), ErrorSums()
    for i in range(64):
        f = 10 * torch.randn(400, generator=gen)
        spread.add(f + torch.randn(400, generator=gen), f)
        # the same error energy on average, but in one rollout of 16 and on few coordinates
        burst = torch.zeros(400)
        if i % 16 == 0:
            burst[:20] = 4.0 * 4.47 * torch.randn(20, generator=gen)
        concentrated.add(f + burst, f)
    a, b = bias_summary(spread), bias_summary(concentrated)
    assert 2.5 < a["rollout_kurtosis"] < 3.5 and a["worst_over_mean"] < 1.5  # Gaussian: 3, every rollout alike
    assert 2.5 < a["coord_kurtosis"] < 3.5
    assert b["rollout_kurtosis"] > 10 and b["worst_over_mean"] > 10
    assert 30 < b["coord_kurtosis"] < 100  # about 3 x 400 / 20: Gaussian on 20 of 400 coordinates, where it errs


def test_an_error_on_few_parameters_has_a_large_kurtosis_over_them():
    gen = torch.Generator().manual_seed(2)
    few = ErrorSums()
    for _ in range(8):
        f = 10 * torch.randn(400, generator=gen)
        d = torch.zeros(400)
        d[:4] = torch.randn(4, generator=gen)
        few.add(f + d, f)
    assert bias_summary(few)["coord_kurtosis"] > 50  # 400 / 4 coordinates times a Gaussian's 3, roughly
