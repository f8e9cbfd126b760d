"""The benchmarks' scores of a reconstruction and its uncertainty: one set for every benchmark.

Every function takes the truth, the reconstruction (the predictive mean) and
the std (or variance) as arrays or tensors of shape ``(H, W)`` and computes
in float64. The metrics themselves are :mod:`ctuq.recon.predictive`'s (PSNR
and SSIM by scikit-image, Spearman by scipy, the reliability curve); this
module adds what a benchmark reports beside them: coverage within one pixel
of an edge of the truth and elsewhere, and the log-likelihood without a
variance floor even where a method's std is exactly zero.

- :func:`score`: the calibration benchmark's full set (±1/2/3σ coverage
  overall, on edges and off edges, per-pixel log-likelihood, Spearman(std,
  |error|), PSNR, SSIM, mean std, the reliability curve);
- :func:`image_metrics`: PSNR and SSIM of a reconstruction alone;
- :func:`quality`: log-likelihood, ±1/2σ coverage and mean std of a variance map;
- :func:`uq_summary`: :func:`ctuq.recon.predictive.summary` with patch
  log-likelihoods and the reliability curve;
- :func:`sample_scores`: PSNR, log-likelihood with a floor, coverage,
  Spearman, and the share of pixels whose sample std is exactly zero;
- :func:`summarise_images`: the mean and worst image of per-image scores.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["LEVELS", "score", "image_metrics", "quality", "uq_summary", "sample_scores",
           "summarise_images"]

#: Nominal coverages of the reliability curve: 0.05, 0.10, …, 0.95.
LEVELS = tuple(np.round(np.linspace(0.05, 0.95, 19), 2))

#: Stands in for a zero std in the z-scores (no floor is added: an image with
#: an exactly zero std gets a non-finite log-likelihood, JSON null).
_TINY = 1e-300


def score(truth, mean, std) -> dict:
    """Coverage (overall, edges, off edges), log-likelihood without floor, Spearman, reliability.

    Parameters
    ----------
    truth, mean, std : array or Tensor, shape (H, W)

    Returns
    -------
    dict
        ``psnr``, ``ssim``, ``rmse``, ``pixel_log_likelihood`` (mean of ``log N(truth;
        mean, std²)``, nats per pixel), ``spearman`` (std vs |error|),
        ``mean_std``, ``edge_fraction`` (pixels within one pixel of an edge
        of the truth, :func:`ctuq.recon.model_error.edge_mask`),
        ``coverage_k``, ``coverage_k_edges``, ``coverage_k_off_edges`` for
        k = 1, 2, 3 (None where the image has no such pixels) and
        ``reliability`` (observed coverage at :data:`LEVELS`).
    """
    from ctuq.recon import predictive
    from ctuq.recon.model_error import edge_mask

    t, m = np.asarray(truth, np.float64), np.asarray(mean, np.float64)
    s = np.asarray(std, np.float64)
    z = np.abs(t - m) / np.maximum(s, _TINY)
    edges = edge_mask(t).numpy()
    var = np.maximum(s, _TINY) ** 2
    ll = -0.5 * ((t - m) ** 2 / var + np.log(var) + math.log(2 * math.pi))
    out = {"psnr": predictive.psnr(t, m), "ssim": predictive.ssim(t, m),
           "rmse": float(np.sqrt(((t - m) ** 2).mean())),
           "pixel_log_likelihood": float(ll.mean()),
           "spearman": predictive.spearman_std_error(s, t - m), "mean_std": float(s.mean()),
           "edge_fraction": float(edges.mean())}
    for k in (1, 2, 3):
        out[f"coverage_{k}"] = float((z <= k).mean())
        out[f"coverage_{k}_edges"] = float((z[edges] <= k).mean()) if edges.any() else None
        out[f"coverage_{k}_off_edges"] = float((z[~edges] <= k).mean()) \
            if (~edges).any() else None
    out["reliability"] = predictive.reliability(t, m, s, LEVELS)["observed"]
    return out


def image_metrics(truth, recon) -> dict:
    """``psnr`` and ``ssim`` of a reconstruction (data range of the truth)."""
    from ctuq.recon import predictive

    return {"psnr": predictive.psnr(truth, recon), "ssim": predictive.ssim(truth, recon)}


def quality(truth, mean, var, floor: float = 0.0) -> dict:
    """``test_ll`` (per pixel, variance ``var + floor``), ±1σ/±2σ coverage and ``mean_std``.

    A negative ``var`` (round-off of an exact computation) counts as zero.
    """
    from ctuq.recon import predictive

    std = torch.as_tensor(var).clamp_min(0).sqrt()  # in var's own dtype
    cov = predictive.coverage(truth, mean, std)
    return {"test_ll": predictive.pixel_log_likelihood(truth, mean, std, floor),
            "coverage_1sigma": cov[1], "coverage_2sigma": cov[2],
            "mean_std": float(std.mean())}


def uq_summary(truth, mean, std, samples=None, patch_sizes=tuple(range(1, 11))) -> dict:
    """:func:`ctuq.recon.predictive.summary` plus the reliability curve.

    No variance floor; a method with an exactly zero std somewhere (MC
    dropout's saturated pixels) is scored as it is: variance 1e-300 there,
    -inf (JSON null) where its error is not zero, and the count of such
    pixels reported (``zero_std_pixels``). Methods without samples (diagonal)
    get their patch log-likelihood equal to the pixel one
    (``patch_diagonal``).
    """
    from ctuq.recon import predictive

    zero = int((torch.as_tensor(std) == 0).sum())
    s = predictive.summary(truth, mean, std, samples, patch_sizes=patch_sizes,
                           floor=_TINY if zero else 0.0)
    s["zero_std_pixels"] = zero
    if samples is None:
        s["patch_log_likelihood"] = {str(k): s["pixel_log_likelihood"] for k in patch_sizes}
        s["patch_diagonal"] = True
    s["reliability"] = predictive.reliability(truth, mean, std)["observed"]
    s.pop("coverage_nominal", None)
    return s


def sample_scores(truth, centre, std, floor: float = 1e-6) -> dict:
    """Scores of a sample-based std (IVON, MC dropout), whose std may be exactly zero.

    Returns
    -------
    dict
        ``psnr``, ``ll`` (per pixel, variance ``std² + floor``), ``coverage``
        (``'1'``, ``'2'``, ``'3'``), ``zero_std_fraction`` (pixels whose
        samples all agree, e.g. at the U-net's output clamp),
        ``coverage2_nonzero_std`` (±2σ coverage of the other pixels; NaN if
        none) and ``spearman``.
    """
    from ctuq.recon.predictive import coverage, pixel_log_likelihood, psnr, spearman_std_error

    t = torch.as_tensor(truth, dtype=torch.float64)
    c = torch.as_tensor(centre, dtype=torch.float64)
    s = torch.as_tensor(std, dtype=torch.float64)
    cov = coverage(t, c, s)
    live = s > 0
    return {"psnr": psnr(t, c), "ll": pixel_log_likelihood(t, c, s, floor=floor),
            "coverage": {str(k): v for k, v in cov.items()},
            "zero_std_fraction": float((~live).double().mean()),
            "coverage2_nonzero_std": float(((t - c).abs()[live] <= 2 * s[live]).double().mean())
            if bool(live.any()) else float("nan"),
            "spearman": spearman_std_error(s, t - c)}


def summarise_images(rows: list[dict], keys) -> dict:
    """``images``, and per key the mean (``<key>_mean``) and worst image (``<key>_worst``).

    Images where a score is None (an infinite log-likelihood, no edges) are
    left out of that score's mean and minimum.
    """
    out = {"images": len(rows)}
    for k in keys:
        v = [r[k] for r in rows if r.get(k) is not None]
        out[f"{k}_mean"] = float(np.mean(v))
        out[f"{k}_worst"] = float(np.min(v))
    return out
