"""Photon counts to line integrals, with each ray's variance (delta method).

A detector pixel behind the object counts ``I ~ Poisson(I0 · exp(−(A x)_i)) + dark``;
with flat fields ``F`` (no object) and dark fields ``D`` (no beam), the line
integral is

    y = −log((I − D̄) / (F̄ − D̄)),

``F̄`` and ``D̄`` being the means of the flat and dark frames. Its variance, to
first order in the counts' Poisson noise (``Var N = E N`` for counts in
photons; a detector gain ``g`` photons per count divides it by ``g``):

    Var y ≈ [ I / (I − D̄)²                                   (the projection)
            + F̄ / (n_F (F̄ − D̄)²)                             (the mean flat)
            + D̄ / n_D · (1/(I − D̄) − 1/(F̄ − D̄))² ] / g       (the mean dark)

which is ``≈ 1 / (I − D)`` when darks are small and flats many (the
weighted-least-squares weight ``w_i = I_i − D_i`` of penalised-likelihood
CT). The flat and dark terms are shared by every projection of one detector
pixel (the errors are correlated along the angle axis); only the per-ray
marginal variance is returned. The counts themselves estimate their means
(plug-in).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ctuq.errors import InputError


@dataclass
class LineIntegrals:
    """Line integrals from counts and their per-ray variance.

    Attributes
    ----------
    y : ndarray, float64, shape of the projections
        ``−log((I − D̄)/(F̄ − D̄))`` (dimensionless: multiply by nothing, the
        attenuation per mm times mm).
    variance : ndarray, float64, same shape
        Delta-method variance of ``y`` (see the module docstring).
    n_clipped : int
        Rays with ``I − D̄ < min_counts`` (clipped to ``min_counts``).
    n_dead : int
        Detector pixels with ``F̄ − D̄ < min_counts`` (clipped likewise; their
        rays carry no information).
    info : dict
        ``n_flats``, ``n_darks``, ``gain``, ``min_counts``.
    """

    y: np.ndarray
    variance: np.ndarray
    n_clipped: int = 0
    n_dead: int = 0
    info: dict = field(default_factory=dict)


def _frames(a, name: str, n_det: int) -> np.ndarray:
    """Frames as ``(n_frames, ..., n_detector)``: a single frame gets a leading axis."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0 or a.shape[-1] != n_det:
        raise InputError(f"expected frames ending in {n_det} detector pixels, got shape "
                         f"{a.shape}", field=name)
    if not np.all(np.isfinite(a)):
        raise InputError("contains NaN or infinite values", field=name)
    return a[None] if a.ndim == 1 else a


def counts_to_line_integrals(counts, flats, darks=None, *, gain: float = 1.0,
                             min_counts: float = 1.0) -> LineIntegrals:
    """Line integrals ``y = −log((I − D̄)/(F̄ − D̄))`` and their delta-method variance.

    Parameters
    ----------
    counts : array_like, shape (..., n_angles, n_detector)
        Raw projections ``I`` (counts).
    flats : array_like, shape (n_flats, n_detector), (n_detector,) or (n_flats, ..., n_detector)
        Flat fields; the frames (first axis) are averaged. A frame may carry
        the same leading axes as one projection row (e.g. slices); it must
        broadcast against ``counts[..., 0, :]``.
    darks : array_like, optional
        Dark fields, the same layout as ``flats``. Default: none (zero).
    gain : float, optional
        Photons per count (the variance of a count ``N`` is ``N / gain``).
        Default 1 (counts are photons).
    min_counts : float, optional
        Smallest dark-corrected count (in counts) kept; smaller (``I ≤ D``
        included) are clipped to it, counted and warned about. Default 1.

    Returns
    -------
    LineIntegrals

    Raises
    ------
    InputError
        If a shape does not fit, a value is not finite, or ``gain`` /
        ``min_counts`` is not positive.

    Examples
    --------
    >>> import numpy as np
    >>> out = counts_to_line_integrals(np.full((2, 3), 100.0), np.full((4, 3), 1000.0))
    >>> round(float(out.y[0, 0]), 6), round(float(out.variance[0, 0]), 6)
    (2.302585, 0.01025)
    """
    if not (np.isfinite(gain) and gain > 0):
        raise InputError(f"must be a positive number, got {gain!r}", field="gain")
    if not (np.isfinite(min_counts) and min_counts > 0):
        raise InputError(f"must be a positive number, got {min_counts!r}", field="min_counts")
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim < 2:
        raise InputError(f"expected (n_angles, n_detector) projections, got shape "
                         f"{counts.shape}", field="counts")
    if not np.all(np.isfinite(counts)):
        raise InputError("contains NaN or infinite values", field="counts")
    n_det = counts.shape[-1]
    flats = _frames(flats, "flats", n_det)
    n_flats = flats.shape[0]
    flat = flats.mean(axis=0)
    if darks is None:
        dark, n_darks = np.zeros(n_det), 0
    else:
        darks = _frames(darks, "darks", n_det)
        dark, n_darks = darks.mean(axis=0), darks.shape[0]
    # one flat/dark row per projection row: insert the angle axis
    flat, dark = flat[..., None, :], dark[..., None, :]
    try:
        np.broadcast_shapes(flat.shape, dark.shape, counts.shape)
    except ValueError:
        raise InputError(f"flats {flat.shape[:-2] + flat.shape[-1:]} and darks do not fit "
                         f"the projections {counts.shape}", field="flats") from None

    signal = counts - dark
    clipped = signal < min_counts
    open_beam = flat - dark
    dead = open_beam < min_counts
    n_clipped, n_dead = int(clipped.sum()), int(dead.sum())
    if n_clipped:
        warnings.warn(f"{n_clipped} of {signal.size} rays have counts − dark < {min_counts:g} "
                      f"(photon starvation); clipped to {min_counts:g}", RuntimeWarning,
                      stacklevel=2)
    if n_dead:
        warnings.warn(f"{n_dead} detector pixels have flat − dark < {min_counts:g} "
                      "(dead pixels); clipped, their rays carry no information",
                      RuntimeWarning, stacklevel=2)
    signal = np.maximum(signal, min_counts)
    open_beam = np.maximum(open_beam, min_counts)
    raw = np.maximum(counts, signal)   # Var I = E I: at least the dark-corrected count
    # −log of the ratio (not a difference of logs): bit for bit the readers' former formula
    y = -np.log(signal / open_beam)
    var = raw / signal**2 + np.maximum(flat, open_beam) / (n_flats * open_beam**2)
    if n_darks:
        var = var + dark / n_darks * (1.0 / signal - 1.0 / open_beam) ** 2
    var = np.broadcast_to(var / gain, y.shape).copy()
    return LineIntegrals(y=y, variance=var, n_clipped=n_clipped, n_dead=n_dead,
                         info={"n_flats": n_flats, "n_darks": n_darks, "gain": float(gain),
                               "min_counts": float(min_counts)})
