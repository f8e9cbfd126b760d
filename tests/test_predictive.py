"""Predictive statistics and metrics against direct formulas (scipy / scikit-image)."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from ctuq.errors import InputError
from ctuq.recon.predictive import (NOMINAL_COVERAGE, coverage, image_samples, patch_covariances,
                                   patch_indices, patch_log_likelihood, pixel_log_likelihood,
                                   pixel_std, pixel_variance, psnr, reliability,
                                   spearman_std_error, ssim, summary)

D64 = torch.float64


def _gaussian_field(n, shape=(12, 12), seed=0):
    """n zero-mean samples of a correlated Gaussian image, and its covariance."""
    gen = torch.Generator().manual_seed(seed)
    d = shape[0] * shape[1]
    A = torch.randn(d, d, generator=gen, dtype=D64) / math.sqrt(d)
    C = A @ A.t() + 0.1 * torch.eye(d, dtype=D64)
    L = torch.linalg.cholesky(C)
    s = (torch.randn(n, d, generator=gen, dtype=D64) @ L.t()).reshape(n, *shape)
    return s, C


def test_image_samples_are_jvps():
    class Lin:
        def jvp(self, z):
            return z.reshape(-1, 2, 3) * 2

    z = torch.randn(5, 6)
    assert torch.equal(image_samples(Lin(), z), z.reshape(5, 2, 3) * 2)
    assert torch.equal(image_samples(Lin(), z, chunk_size=2), z.reshape(5, 2, 3) * 2)


def test_pixel_std_is_root_mean_square():
    s = torch.tensor([[[1.0, -2.0]], [[-1.0, 2.0]], [[1.0, 0.0]]])
    assert torch.allclose(pixel_variance(s), torch.tensor([[1.0, 8.0 / 3.0]]))
    assert torch.allclose(pixel_std(s), torch.tensor([[1.0, math.sqrt(8 / 3)]]))
    with pytest.raises(InputError):
        pixel_std(s[:0])


def test_patch_indices_tile_the_image():
    groups = patch_indices((28, 28), 3)
    assert groups[0].shape == (81, 9)  # 9 × 9 full patches
    allidx = torch.cat([g.reshape(-1) for g in groups])
    assert torch.equal(allidx.sort().values, torch.arange(784))
    assert sorted(g.shape[1] for g in groups) == [1, 3, 3, 9]
    assert len(patch_indices((28, 28), 1)) == 1
    with pytest.raises(InputError):
        patch_indices((4, 4), 0)


def test_patch_covariances_and_shrinkage():
    s, _ = _gaussian_field(50, (6, 6))
    groups = patch_covariances(s, 3)
    ind, cov = groups[0]
    flat = s.reshape(50, -1)
    for j in range(ind.shape[0]):
        x = flat[:, ind[j]]
        assert torch.allclose(cov[j], x.t() @ x / 50)  # zero-mean products
    (_, shrunk), = patch_covariances(s, 3, shrink=True)
    off = ~torch.eye(9, dtype=torch.bool)
    assert torch.allclose(shrunk[:, off], 0.5 * cov[:, off])
    assert torch.allclose(shrunk.diagonal(dim1=1, dim2=2), cov.diagonal(dim1=1, dim2=2))


def test_psnr_and_ssim_match_skimage():
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    rng = np.random.default_rng(0)
    truth = rng.random((28, 28))
    recon = truth + 0.05 * rng.standard_normal((28, 28))
    assert psnr(truth, recon) == pytest.approx(
        peak_signal_noise_ratio(truth, recon, data_range=truth.max() - truth.min()))
    assert ssim(torch.tensor(truth), torch.tensor(recon)) == pytest.approx(
        structural_similarity(truth, recon, data_range=truth.max() - truth.min()))
    # a known MSE: PSNR = 10 log10(range² / mse)
    flat = np.zeros((4, 4))
    flat[0, 0] = 1.0
    assert psnr(flat, flat + 0.1) == pytest.approx(10 * math.log10(1 / 0.01))


def test_pixel_log_likelihood_matches_scipy():
    rng = np.random.default_rng(1)
    truth, mean = rng.random((8, 8)), rng.random((8, 8))
    std = 0.1 + rng.random((8, 8))
    ref = stats.norm.logpdf(truth, mean, std).mean()  # no hidden floor by default
    assert pixel_log_likelihood(truth, mean, std) == pytest.approx(ref)
    ref2 = stats.norm.logpdf(truth, mean, np.sqrt(std**2 + 0.01)).mean()
    assert pixel_log_likelihood(truth, mean, std, floor=0.01) == pytest.approx(ref2)
    with pytest.raises(InputError):
        pixel_log_likelihood(truth, mean, np.zeros((8, 8)), floor=0.0)


def test_patch_log_likelihood_k1_and_k2():
    s, C = _gaussian_field(400, (6, 6), seed=2)
    gen = torch.Generator().manual_seed(3)
    mean = torch.randn(6, 6, generator=gen, dtype=D64)
    truth = mean + torch.randn(6, 6, generator=gen, dtype=D64)
    # k = 1 is the pixel log-likelihood with the sample std
    assert patch_log_likelihood(truth, mean, s, 1) == pytest.approx(
        pixel_log_likelihood(truth, mean, pixel_std(s)))
    # k = 2: scipy's multivariate normal on each (shrunk) sample covariance
    (ind, cov), = patch_covariances(s, 2, shrink=True)
    diff = (truth - mean).reshape(-1)
    total = 0.0
    for j in range(ind.shape[0]):
        c = cov[j].numpy() + 1e-6 * np.eye(4)
        total += stats.multivariate_normal(np.zeros(4), c).logpdf(diff[ind[j]].numpy())
    assert patch_log_likelihood(truth, mean, s, 2) == pytest.approx(total / 36)


def test_calibrated_gaussian_errors_have_nominal_coverage():
    # truth = mean + std·N(0,1): each coverage is a binomial proportion over n pixels,
    # std sqrt(p(1−p)/n); allow 4 of them
    n_side = 100
    gen = torch.Generator().manual_seed(4)
    mean = torch.rand(n_side, n_side, generator=gen, dtype=D64)
    std = 0.05 + torch.rand(n_side, n_side, generator=gen, dtype=D64)
    truth = mean + std * torch.randn(n_side, n_side, generator=gen, dtype=D64)
    cov = coverage(truth, mean, std)
    n = n_side**2
    for k, p in NOMINAL_COVERAGE.items():
        assert abs(cov[k] - p) < 4 * math.sqrt(p * (1 - p) / n)
    rel = reliability(truth, mean, std)
    assert np.allclose(rel["observed"], rel["nominal"], atol=4 * 0.5 / math.sqrt(n))
    # an overconfident std (halved) under-covers
    assert coverage(truth, mean, std / 2)[1] < NOMINAL_COVERAGE[1] - 0.1


def test_spearman_of_std_with_error():
    err = torch.linspace(-1, 1, 50)
    assert spearman_std_error(err.abs() + 1, err) == pytest.approx(1.0)
    assert spearman_std_error(-err.abs(), err) == pytest.approx(-1.0)
    assert math.isnan(spearman_std_error(torch.ones_like(err), err))  # fixed variance: undefined


def test_summary_has_every_metric():
    s, _ = _gaussian_field(64, (12, 12), seed=5)
    truth = torch.rand(12, 12, dtype=D64)
    mean = truth + 0.1 * s[0]
    out = summary(truth, mean, samples=s, patch_sizes=(1, 2, 3))
    for key in ("psnr", "ssim", "rmse", "pixel_log_likelihood", "coverage",
                "coverage_nominal", "spearman_std_abs_error", "mean_std",
                "patch_log_likelihood", "num_samples"):
        assert key in out
    assert set(out["patch_log_likelihood"]) == {"1", "2", "3"}
    assert out["patch_log_likelihood"]["1"] == pytest.approx(out["pixel_log_likelihood"])
    assert set(summary(truth, mean)) == {"psnr", "ssim", "rmse"}
