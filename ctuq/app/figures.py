"""Figures of a result: images, the uncertainty map, calibration and the EM trace."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np


def calibration_curve(truth, mean, std, levels=None) -> tuple[np.ndarray, np.ndarray]:
    """Nominal against observed coverage of central Gaussian intervals.

    A thin numpy view of :func:`ctuq.recon.predictive.reliability`.

    Parameters
    ----------
    truth, mean, std : array_like, same shape
    levels : array_like, optional
        Nominal coverages in (0, 1). Default 20 levels from 0.05 to 0.999.

    Returns
    -------
    nominal, observed : ndarray
    """
    from ctuq.recon.predictive import reliability

    levels = np.linspace(0.05, 0.999, 20) if levels is None else np.asarray(levels)
    curve = reliability(truth, mean, std, levels=tuple(levels))
    return np.asarray(curve["nominal"]), np.asarray(curve["observed"])


def result_figure(path, result, title: str | None = None) -> Path:
    """Write a PNG summary of a :class:`~ctuq.data.io.Result` (one slice).

    Panels: truth (if known), FBP, reconstruction, the std (total; with a
    model-error term also its posterior and model-error parts, on one colour
    scale), |error| (if the truth is known), calibration curve (if known) and the EM trace of the
    per-block prior variances.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pick = (lambda a: None if a is None else (a[0] if a.ndim == 3 else a))
    rec, std, fbp, truth = (pick(result.reconstruction), pick(result.std), pick(result.fbp),
                            pick(result.ground_truth))
    lo, hi = (float(truth.min()), float(truth.max())) if truth is not None else (
        float(np.percentile(rec, 1)), float(np.percentile(rec, 99)))
    panels = []
    if truth is not None:
        panels.append(("truth", truth, "gray", (lo, hi)))
    if fbp is not None:
        panels.append(("FBP", fbp, "gray", (lo, hi)))
    panels.append(("reconstruction", rec, "gray", (lo, hi)))
    top = float(np.percentile(std, 99.5))  # one colour scale for the std panels
    post, model = pick(result.posterior_std), pick(result.model_error_std)
    has_parts = post is not None and model is not None and float(np.max(model)) > 0
    panels.append(("std (total)" if has_parts else "posterior std", std, "viridis", (0, top)))
    if has_parts:
        panels.append(("posterior std", post, "viridis", (0, top)))
        panels.append(("model-error std", model, "viridis", (0, top)))
    if truth is not None:
        err = np.abs(rec - truth)
        panels.append(("|error|", err, "magma", (0, float(np.percentile(err, 99.5)))))
    extra = (truth is not None) + bool(result.em_trace)
    n = len(panels) + extra
    cols = n if n <= 4 else (n + 1) // 2  # two rows keep the panels legible in a README
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 3.3 * rows), squeeze=False)
    axes = axes.ravel()
    for ax in axes[n:]:
        ax.axis("off")
    for ax, (name, img, cmap, (vmin, vmax)) in zip(axes, panels):
        im = ax.imshow(img, cmap=cmap, vmin=vmin, vmax=vmax if vmax > vmin else None)
        ax.set_title(name)
        ax.axis("off")
        if name in ("std (total)", "posterior std", "model-error std", "|error|"):
            bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
            if result.units:
                bar.set_label(result.units)
    k = len(panels)
    if truth is not None:
        ax = axes[k]
        expected, observed = calibration_curve(truth, rec, std)
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="ideal")
        ax.plot(expected, observed, "o-", ms=3, label="ctuq")
        ax.set_xlabel("nominal coverage")
        ax.set_ylabel("observed coverage")
        ax.set_title("calibration")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_aspect("equal")
        k += 1
    if result.em_trace:
        ax = axes[k]
        steps = [t.get("step", i) for i, t in enumerate(result.em_trace)]
        variances = [t.get("a_b") or [] for t in result.em_trace]
        width = max((len(v) for v in variances), default=0)
        for b in range(width):
            ax.semilogy(steps, [v[b] if b < len(v) else math.nan for v in variances], lw=1)
        if "sigma2" in result.em_trace[0]:
            ax.semilogy(steps, [t["sigma2"] for t in result.em_trace], "k--", lw=1.5, label="σ²")
            ax.legend(fontsize=8)
        ax.set_xlabel("EM step")
        ax.set_title("prior variances a_b" if width > 1 else "prior variance g")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
