"""Data-consistency diagnostics: does the model of the scan explain the data?

With the right forward model and noise model, the whitened residual
``r = Σ_y^{-1/2} (y − A x̂)`` of a reconstruction ``x̂`` has
``‖r‖² ≈ m − γ̂`` (``m`` rays, ``γ̂`` the effective number of parameters the
fit used; MacKay). Far above that, something in the model of the scan is
wrong: the centre of rotation, the angles or their unit, the pixel size,
beam hardening, the noise level. The χ² per projection angle localises it
(a centre error grows towards the angles where the object is widest
off-axis; a corrupt projection stands out alone).

:func:`data_consistency` returns a :class:`Misfit` verdict; :func:`check_angle_unit`
catches the commonest geometry error before any fit (angles in radians
labelled degrees, or the reverse).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ctuq.errors import InputError

#: χ²/dof above which a scan is a misfit (with :data:`MISREGISTRATION_PX`),
#: chosen on validation scans (benchmarks/results/misfit_validation.json,
#: docs/consistency.md): 32² off-grid simulations, 1–5 % noise not given,
#: 40 right scans and 8 each with a 2-px or 5-px centre error, radians read
#: as degrees, 10 % of the rows shuffled, pixel size ×1.5. The thresholds with
#: no false positive and ≥ 95 % detection of the first four span 12.0–17.5;
#: their geometric middle. Right scans gave χ²/m 0.7–10.1 (one angle up to
#: 48); no threshold detects the pixel-size error (1.1–10.2).
MISFIT_THRESHOLD = 14.5
#: Sub-pixel misregistration (detector pixels) the check tolerates: the
#: whitening variance of each ray is ``σ² + (δ · ∂(A x̂)/∂u)²``
#: (:func:`misregistration_variance`). A right scan is never exactly right:
#: the centre of rotation is known to a fraction of a pixel and the
#: reconstruction's pixels and projector are not the scan's, so the residual
#: at the object's edges grows with the edge's slope, not with the noise; at
#: low noise that alone gave right validation scans χ²/dof up to 160
#: (δ = 0: see :data:`MISFIT_THRESHOLD`). Chosen with it on the same scans.
MISREGISTRATION_PX = 0.25
#: A single angle's χ²/dof above ``ANGLE_THRESHOLD_FACTOR × threshold`` is a
#: misfit too (one corrupt projection barely moves the overall χ²).
ANGLE_THRESHOLD_FACTOR = 4.0


@dataclass
class Misfit:
    """The verdict of :func:`data_consistency`.

    Attributes
    ----------
    verdict : {'ok', 'misfit'}
    reason : str
        One line, e.g. ``"χ²/dof 25.3 at the given noise level (threshold 8);
        worst angles 10–20 of 40"``.
    chi2_dof : float
        ``‖r‖² / dof`` overall.
    dof : float
        ``m − γ̂`` (or ``m``).
    per_angle : ndarray, shape (n_angles,)
        ``‖r_a‖² / (n_detector · dof / m)`` for each angle row ``a``.
    worst_angles : list of int
        Row indices whose χ²/dof is at least half the largest one, largest
        first (at most 10).
    threshold : float
    """

    verdict: str
    reason: str
    chi2_dof: float
    dof: float
    per_angle: np.ndarray
    worst_angles: list = field(default_factory=list)
    threshold: float = MISFIT_THRESHOLD

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


def _array(a, name: str) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().double().numpy()
    try:
        a = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError("must be an array of numbers", field=name) from None
    if not np.all(np.isfinite(a)):
        raise InputError("contains NaN or infinite values", field=name)
    return a


def whitened_residual(y, forward, noise_variance) -> np.ndarray:
    """``r = (y − A x̂) / σ``, per ray.

    Parameters
    ----------
    y : array_like or Tensor, shape (..., n_angles, n_detector)
        The measured sinogram.
    forward : array_like or Tensor, same shape
        The forward projection ``A x̂`` of the reconstruction.
    noise_variance : float or array_like
        The per-ray noise variance ``σ²`` (a scalar, or an array that
        broadcasts to ``y``, e.g. from :mod:`ctuq.data.counts`); > 0.

    Returns
    -------
    ndarray, float64, the shape of ``y``
    """
    y, fwd = _array(y, "sinogram"), _array(forward, "forward")
    var = _array(noise_variance, "noise_variance")
    if y.shape != fwd.shape:
        raise InputError(f"forward projection shape {fwd.shape} differs from the sinogram's "
                         f"{y.shape}", field="forward")
    if np.any(var <= 0):
        raise InputError("must be > 0", field="noise_variance")
    try:
        var = np.broadcast_to(var, y.shape)
    except ValueError:
        raise InputError(f"shape {var.shape} does not fit the sinogram {y.shape}",
                         field="noise_variance") from None
    return (y - fwd) / np.sqrt(var)


def misregistration_variance(forward, pixels: float = MISREGISTRATION_PX) -> np.ndarray:
    """``(δ · ∂(A x̂)/∂u)²``: the variance a misregistration of ``δ`` detector
    pixels adds to each ray (the slope along the detector, central differences).

    Parameters
    ----------
    forward : array_like, shape (..., n_angles, n_detector)
        The forward projection ``A x̂`` (line integrals).
    pixels : float
        ``δ`` in detector pixels, >= 0. Default :data:`MISREGISTRATION_PX`.

    Returns
    -------
    ndarray, float64, the shape of ``forward``
    """
    f = _array(forward, "forward")
    if not (math.isfinite(pixels) and pixels >= 0):
        raise InputError(f"must be >= 0, got {pixels!r}", field="misregistration")
    if pixels == 0 or f.shape[-1] < 2:
        return np.zeros_like(f)
    return (float(pixels) * np.gradient(f, axis=-1)) ** 2


def _ranges(indices) -> str:
    """``[3, 4, 5, 9]`` → ``'3–5, 9'``."""
    idx = sorted(int(i) for i in indices)
    parts, start = [], None
    for k, i in enumerate(idx):
        if start is None:
            start = i
        if k + 1 == len(idx) or idx[k + 1] != i + 1:
            parts.append(f"{start}" if start == i else f"{start}–{i}")
            start = None
    return ", ".join(parts)


def data_consistency(y, forward, noise_variance, *, effective_parameters: float | None = None,
                     threshold: float = MISFIT_THRESHOLD,
                     angle_threshold: float | None = None) -> Misfit:
    """χ² of the whitened residual, overall and per angle, and a verdict.

    Parameters
    ----------
    y, forward, noise_variance
        As in :func:`whitened_residual`. Leading (slice) axes are pooled;
        the per-angle χ² sums over them.
    effective_parameters : float, optional
        ``γ̂``, the effective number of parameters of the fit (e.g. the
        evidence's ``γ``); ``dof = m − γ̂``. Default: ``dof = m``.
    threshold : float, optional
        χ²/dof above which the verdict is ``'misfit'``. Default
        :data:`MISFIT_THRESHOLD` (chosen on validation scans).
    angle_threshold : float, optional
        The same for a single angle. Default
        ``ANGLE_THRESHOLD_FACTOR × threshold``.

    Returns
    -------
    Misfit
    """
    r = whitened_residual(y, forward, noise_variance)
    if r.ndim < 2:
        raise InputError(f"expected (n_angles, n_detector), got shape {r.shape}",
                         field="sinogram")
    if not (math.isfinite(threshold) and threshold > 0):
        raise InputError(f"must be > 0, got {threshold!r}", field="threshold")
    angle_threshold = ANGLE_THRESHOLD_FACTOR * threshold if angle_threshold is None \
        else float(angle_threshold)
    m = r.size
    gamma = 0.0 if effective_parameters is None else float(effective_parameters)
    if not (0 <= gamma < m):
        raise InputError(f"must be in [0, {m}), got {effective_parameters!r}",
                         field="effective_parameters")
    dof = m - gamma
    r2 = r.reshape(-1, *r.shape[-2:]) ** 2
    chi2 = float(r2.sum() / dof)
    n_angles = r.shape[-2]
    per_angle = r2.sum(axis=(0, 2)) / (r2.shape[0] * r.shape[-1] * dof / m)
    order = np.argsort(per_angle)[::-1]
    worst = [int(i) for i in order[:10] if per_angle[i] >= 0.5 * per_angle[order[0]]]
    bad_overall = chi2 > threshold
    bad_angle = bool(per_angle.max() > angle_threshold)
    where = f"worst angles {_ranges(worst)} of {n_angles}" if worst else ""
    if bad_overall:
        reason = (f"χ²/dof {chi2:.3g} at the given noise level (threshold {threshold:g}); "
                  f"{where}: the model of the scan (centre, angles, pixel size, noise "
                  "level) does not explain the data")
    elif bad_angle:
        reason = (f"χ²/dof {chi2:.3g} overall, but up to {per_angle.max():.3g} at single "
                  f"angles (threshold {angle_threshold:g}); {where}")
    else:
        reason = f"χ²/dof {chi2:.3g} (threshold {threshold:g})"
    return Misfit("misfit" if bad_overall or bad_angle else "ok", reason, chi2, dof,
                  per_angle, worst, float(threshold))


_DEGREE_UNITS = {"deg", "degree", "degrees", "°"}
_RADIAN_UNITS = {"rad", "radian", "radians"}


def check_angle_unit(angles, unit: str) -> str | None:
    """A warning when the angles' values contradict their stated unit, else None.

    Two checks, for more than 3 angles:

    - unit degrees, yet every ``|angle| ≤ 2π + 0.01``: a scan over at most
      6.3° is unlikely; the values look like radians;
    - unit radians, yet some ``|angle| > 4π`` and the span is at least 90:
      more than two turns; the values look like degrees.

    Parameters
    ----------
    angles : array_like, shape (n_angles,)
        The angle values as stored.
    unit : str
        The stated unit (``'deg'``, ``'degree(s)'``, ``'°'``, ``'rad'``,
        ``'radian(s)'``; case-insensitive). Other units give None.

    Returns
    -------
    str or None
    """
    a = _array(angles, "angles").reshape(-1)
    u = str(unit).strip().lower()
    if a.size <= 3:
        return None
    top = float(np.abs(a).max())
    if u in _DEGREE_UNITS and top <= 2 * math.pi + 0.01:
        return (f"the {a.size} angles are labelled degrees but all lie within ±{top:.3g}: "
                "they look like radians (a scan over at most 6.3° is unlikely)")
    if u in _RADIAN_UNITS and top > 4 * math.pi and float(np.ptp(a)) >= 90:
        return (f"the {a.size} angles are labelled radians but reach {top:.4g} "
                "(more than two turns): they look like degrees")
    return None


def radians_given_as_degrees(angles, unit: str) -> str | None:
    """The degrees-labelled-radians half of :func:`check_angle_unit` (None otherwise)."""
    msg = check_angle_unit(angles, unit)
    return msg if msg is not None and "look like radians" in msg else None
