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
