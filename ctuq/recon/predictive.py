"""Predictive statistics of the linearised posterior and the metrics to report (docs/method.md §8.1).

Image-space samples are ``J z`` for zero-mean parameter samples ``z``; the
predictive mean shown to users is the DIP output ``x̂`` (reference choice),
so every statistic here takes the samples as **zero-mean** deviations: the
per-pixel variance is their mean square, patch covariances are mean outer
products (no sample mean is subtracted).

Metrics (all on ``[H, W]`` arrays or tensors, returned as Python floats):

- :func:`psnr`, :func:`ssim` (scikit-image; data range of the ground truth),
- :func:`pixel_log_likelihood`: mean over pixels of
  ``log N(x_true; x̂, std² + floor)``,
- :func:`patch_log_likelihood`: Gaussian log-likelihood of non-overlapping
  k×k patches under the sample covariance (off-diagonals shrunk,
  ``0.5 (C + diag C)``, for k > 1, reference choice; ``floor`` added to the
  diagonal), summed over patches and divided by the number of pixels; edge
  patches that do not fit are kept, smaller,
- :func:`coverage`: fraction of pixels with ``|x_true − x̂| ≤ n σ`` for
  n = 1, 2, 3 (nominal 68.27 / 95.45 / 99.73 %), :func:`reliability`,
- :func:`spearman_std_error`: Spearman rank correlation of std with |error|,
- :func:`summary`: all of them in one dict.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from ctuq.errors import InputError

__all__ = [
    "image_samples",
    "pixel_variance",
    "pixel_std",
    "patch_indices",
    "patch_covariances",
    "psnr",
    "ssim",
    "pixel_log_likelihood",
    "patch_log_likelihood",
    "coverage",
    "reliability",
    "spearman_std_error",
    "summary",
    "NOMINAL_COVERAGE",
]

#: Nominal Gaussian coverage of ±nσ intervals.
NOMINAL_COVERAGE = {n: math.erf(n / math.sqrt(2)) for n in (1, 2, 3)}


def _np(a) -> np.ndarray:
    if torch.is_tensor(a):
        return a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def _t(a, dtype=torch.float64) -> Tensor:
    if torch.is_tensor(a):
        return a.detach().to(dtype)
    return torch.as_tensor(np.asarray(a), dtype=dtype)


# ------------------------------------------------------------------------------
# samples


def image_samples(lin, z: Tensor, chunk_size: int | None = None) -> Tensor:
    """Image-space samples ``J z``: ``[k, d_θ]`` → ``[k, H, W]``.

    Parameters
    ----------
    lin : Linearization
    z : Tensor, shape (k, d_θ)
    chunk_size : int, optional
        Samples per batched JVP (memory bound). Default all at once.
    """
    with torch.no_grad():
        if chunk_size is None:
            return lin.jvp(z)
        return torch.cat([lin.jvp(z[i:i + chunk_size]) for i in range(0, z.shape[0], chunk_size)])


def pixel_variance(samples: Tensor) -> Tensor:
    """Per-pixel variance of zero-mean samples, ``mean_k s²``: ``[k, H, W]`` → ``[H, W]``."""
    if samples.shape[0] == 0:
        raise InputError("no samples", field="samples")
    return samples.square().mean(0)


def pixel_std(samples: Tensor) -> Tensor:
    """Per-pixel std of zero-mean samples: ``[k, H, W]`` → ``[H, W]``."""
    return pixel_variance(samples).sqrt()


def patch_indices(shape: Sequence[int], k: int) -> list[Tensor]:
    """Flat pixel indices of the non-overlapping k×k patches, grouped by patch shape.

    Parameters
    ----------
    shape : (H, W)
    k : int
        Patch side (≥ 1).

    Returns
    -------
    list of Tensor
        Each ``[n_patches_g, p_g]`` (int64, C-order pixel indices); the
        first group holds the full k×k patches, later groups the edge
        patches cut by the image border.
    """
    H, W = int(shape[0]), int(shape[1])
    k = int(k)
    if k < 1:
        raise InputError(f"must be >= 1, got {k}", field="patch_size")
    idx = torch.arange(H * W).reshape(H, W)
    groups: dict[tuple[int, int], list[Tensor]] = {}
    for r in range(0, H, k):
        for c in range(0, W, k):
            patch = idx[r:r + k, c:c + k]
            groups.setdefault(tuple(patch.shape), []).append(patch.reshape(-1))
    order = sorted(groups, key=lambda s: -s[0] * s[1])
    return [torch.stack(groups[s]) for s in order]


def patch_covariances(samples: Tensor, k: int, *, shrink: bool = False,
                      full_only: bool = False) -> list[tuple[Tensor, Tensor]]:
    """Sample covariances of the non-overlapping k×k patches of zero-mean samples.

    Parameters
    ----------
    samples : Tensor, shape (n, H, W)
    k : int
    shrink : bool, optional
        Replace ``C`` by ``0.5 (C + diag C)`` (off-diagonals halved). Default False.
    full_only : bool, optional
        Only the full k×k patches. Default False.

    Returns
    -------
    list of (indices, cov)
        Per patch-shape group: ``indices [m, p]`` and ``cov [m, p, p]`` (float64).
    """
    n = samples.shape[0]
    flat = samples.detach().reshape(n, -1).to(torch.float64)
    out = []
    for g, ind in enumerate(patch_indices(samples.shape[-2:], k)):
        if full_only and g > 0:
            break
        s = flat[:, ind.to(flat.device)]  # [n, m, p]
        cov = torch.einsum("nmp,nmq->mpq", s, s) / n
        if shrink and ind.shape[1] > 1:
            cov = 0.5 * (cov + torch.diag_embed(torch.diagonal(cov, dim1=-2, dim2=-1)))
        out.append((ind, cov))
    return out


# ------------------------------------------------------------------------------
# metrics


def psnr(truth, recon, data_range: float | None = None) -> float:
    """PSNR in dB (scikit-image), data range of the ground truth by default."""
    from skimage.metrics import peak_signal_noise_ratio

    t, r = _np(truth), _np(recon)
    dr = float(t.max() - t.min()) if data_range is None else float(data_range)
    return float(peak_signal_noise_ratio(t, r, data_range=dr))


def ssim(truth, recon, data_range: float | None = None) -> float:
    """SSIM (scikit-image defaults: 7×7 window), data range of the ground truth by default."""
    from skimage.metrics import structural_similarity

    t, r = _np(truth), _np(recon)
    dr = float(t.max() - t.min()) if data_range is None else float(data_range)
    return float(structural_similarity(t, r, data_range=dr))


def pixel_log_likelihood(truth, mean, std, floor: float = 0.0) -> float:
    """Mean per-pixel ``log N(x_true; x̂, std² + floor)`` (nats per pixel).

    Parameters
    ----------
    truth, mean, std : array or Tensor, shape (H, W)
    floor : float, optional
        Variance added to every pixel (an aleatoric floor ``s²``; the
        reference code adds 1e-6, which lifts an overconfident map's score:
        on one 28² case 2.21 instead of 1.35 nats/pixel). Default 0: the
        std is scored as it is.
    """
    t, m, s = _t(truth), _t(mean), _t(std)
    var = s.square() + float(floor)
    if bool((var <= 0).any()):
        raise InputError("zero predictive variance: use floor > 0", field="floor")
    ll = -0.5 * ((t - m).square() / var + var.log() + math.log(2 * math.pi))
    return float(ll.mean())


def patch_log_likelihood(truth, mean, samples: Tensor, k: int, *, shrink: bool = True,
                         floor: float = 1e-6) -> float:
    """Patch log-likelihood of the truth per pixel, covariances from zero-mean samples.

    Parameters
    ----------
    truth, mean : array or Tensor, shape (H, W)
    samples : Tensor, shape (n, H, W)
        Zero-mean image samples ``J z``.
    k : int
        Patch side; k = 1 is :func:`pixel_log_likelihood` with the sample variance.
    shrink : bool, optional
        Halve the off-diagonal covariances for k > 1 (reference). Default True.
    floor : float, optional
        Added to the covariance diagonal (reference 1e-6). Default 1e-6.

    Returns
    -------
    float
        ``Σ_patches log N(patch) / number of pixels``.
    """
    t, m = _t(truth).reshape(-1), _t(mean).reshape(-1)
    total, n_pix = 0.0, 0
    for ind, cov in patch_covariances(samples, k, shrink=shrink):
        p = ind.shape[1]
        cov = cov + float(floor) * torch.eye(p, dtype=cov.dtype, device=cov.device)
        diff = (t[ind] - m[ind]).to(cov.device)  # [m, p]
        L, info = torch.linalg.cholesky_ex(cov)
        if bool((info != 0).any()):
            raise InputError(f"singular patch covariance for k={k}: use more samples or a "
                             f"larger floor", field="samples")
        sol = torch.cholesky_solve(diff.unsqueeze(-1), L).squeeze(-1)
        maha = (diff * sol).sum(-1)
        logdet = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        total += float((-0.5 * (maha + logdet + p * math.log(2 * math.pi))).sum())
        n_pix += ind.numel()
    return total / n_pix


def coverage(truth, mean, std, n_sigma: Iterable[float] = (1, 2, 3)) -> dict:
    """Fraction of pixels inside ``x̂ ± n σ``, for each ``n``.

    The nominal values are :data:`NOMINAL_COVERAGE`.
    """
    t, m, s = _t(truth), _t(mean), _t(std)
    err = (t - m).abs()
    return {float(n) if not float(n).is_integer() else int(n):
            float((err <= n * s).double().mean()) for n in n_sigma}


def reliability(truth, mean, std, levels: Sequence[float] = tuple(np.linspace(0.05, 0.95, 19))
                ) -> dict:
    """Observed vs nominal coverage of central Gaussian intervals (a reliability curve).

    Returns
    -------
    dict
        ``{'nominal': [...], 'observed': [...]}``.
    """
    from scipy.stats import norm

    t, m, s = _t(truth), _t(mean), _t(std)
    z = ((t - m).abs() / s.clamp_min(1e-300)).reshape(-1)
    nominal = [float(q) for q in levels]
    observed = [float((z <= norm.ppf(0.5 + q / 2)).double().mean()) for q in nominal]
    return {"nominal": nominal, "observed": observed}


def spearman_std_error(std, err) -> float:
    """Spearman rank correlation between the std map and |error| (scipy).

    NaN when either map is constant (a fixed-variance method): undefined.
    """
    from scipy.stats import spearmanr

    s, e = _np(std).reshape(-1), np.abs(_np(err)).reshape(-1)
    if np.ptp(s) == 0 or np.ptp(e) == 0:
        return float("nan")
    return float(spearmanr(s, e).statistic)


def summary(truth, mean, std=None, samples: Tensor | None = None, *,
            patch_sizes: Iterable[int] = range(1, 11), floor: float = 0.0,
            patch_floor: float = 1e-6) -> dict:
    """Every metric at once.

    Parameters
    ----------
    truth, mean : (H, W)
    std : (H, W), optional
        Default: from ``samples``.
    samples : Tensor, shape (n, H, W), optional
        Zero-mean image samples (for the patch log-likelihoods).
    patch_sizes : iterable of int
        Default 1…10.
    floor : float
        Variance floor of the pixel log-likelihood. Default 0.
    patch_floor : float
        Variance floor of the patch covariances (k > 1 sample covariances
        are singular without one). Default 1e-6.

    Returns
    -------
    dict
        ``psnr``, ``ssim`` and, with an uncertainty, ``pixel_log_likelihood``,
        ``coverage`` (observed fractions keyed ``'1'``, ``'2'``, ``'3'``),
        ``coverage_nominal``, ``spearman_std_abs_error``, ``mean_std``,
        ``rmse`` and (with samples) ``patch_log_likelihood`` keyed by k.
    """
    out = {"psnr": psnr(truth, mean), "ssim": ssim(truth, mean),
           "rmse": float((_t(truth) - _t(mean)).square().mean().sqrt())}
    if std is None and samples is not None:
        std = pixel_std(samples)
    if std is not None:
        out["pixel_log_likelihood"] = pixel_log_likelihood(truth, mean, std, floor)
        out["coverage"] = {str(k): v for k, v in coverage(truth, mean, std).items()}
        out["coverage_nominal"] = {str(k): v for k, v in NOMINAL_COVERAGE.items()}
        out["spearman_std_abs_error"] = spearman_std_error(std, _t(truth) - _t(mean))
        out["mean_std"] = float(_t(std).mean())
    if samples is not None:
        out["patch_log_likelihood"] = {str(k): patch_log_likelihood(truth, mean, samples, k,
                                                                    floor=patch_floor)
                                       for k in patch_sizes}
        out["num_samples"] = int(samples.shape[0])
    return out
