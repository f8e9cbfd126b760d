"""Centre-of-rotation estimation for parallel-beam sinograms.

In parallel beam the projection at ``θ + π`` is the projection at ``θ``
mirrored about the rotation axis: ``p(θ + π, u) = p(θ, −u)``. With the axis at
detector pixel ``c = (n − 1)/2 + δ`` (ctuq's ``center_offset`` ``δ``, see
:class:`ctuq.data.geometry.Geometry` and ``docs/conventions.md``), the row at
``θ + π`` equals the row at ``θ`` flipped left–right and shifted by ``+2δ``
pixels. Two published estimators use this:

- ``'mirror'``: for scans holding pairs of projections ``π`` apart (360°
  scans), the cross-correlation of each row at ``θ + π`` with the flipped
  row at ``θ`` peaks at ``2δ``; the pairs are summed before the peak is
  taken, and the peak is refined by least squares between the pairs (the
  flipped rows Fourier-shifted on a 0.1-pixel grid, a parabola through the
  three best).
- ``'vo'``: Vo, Atwood & Drakopoulos 2014, "Reliable method for calculating
  the center of rotation in parallel-beam tomography", Opt. Express 22(16),
  19078. The 0–180° sinogram and its flipped copy, shifted by ``2δ``, form a
  360° sinogram; only at the right ``δ`` is it consistent, and the energy of
  its 2-D Fourier transform outside the double wedge ``|k_θ| ≤ R |ω|`` that an
  object of radius ``R`` occupies is then smallest. Angles covering 180° are
  needed (non-equispaced ones are interpolated onto an equispaced grid;
  the detector is zero-padded rather than filled as in the paper); the
  minimum is searched on a 0.25-pixel grid of the offset, then on a
  0.05-pixel grid with a parabola through the three best.

Both return a confidence in ``[0, 1]``: ``'mirror'`` the correlation
coefficient of the aligned pairs (1: identical), ``'vo'`` the relative depth
of the metric's minimum, ``1 − min / median`` over the search range; both
scaled down below ``MIN_ANGLES`` projections per half turn. An
angle set that covers less than 180° cannot determine the centre this way:
the result then has ``offset = nan`` and confidence 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ctuq.errors import InputError

#: Largest mismatch (radians) of a "θ and θ + π" pair for the mirror method.
PAIR_TOLERANCE = 1e-4
#: Below this many projections per half turn (pairs, for ``'mirror'``) the
#: confidence is scaled down by ``n / MIN_ANGLES``: few rows constrain the
#: centre loosely (4 angles: errors of 0.2 px and more on 64² phantoms).
MIN_ANGLES = 10


@dataclass
class CenterEstimate:
    """A centre-of-rotation estimate.

    Attributes
    ----------
    offset : float
        ``center_offset`` in detector pixels (axis at pixel ``(n−1)/2 + offset``);
        ``nan`` when the angles cannot determine it.
    confidence : float
        In ``[0, 1]``; see the module docstring. 0 when undetermined.
    method : str
        ``'mirror'``, ``'vo'`` or ``'none'``.
    info : dict
        ``n_pairs`` (mirror), ``metric`` and ``shifts`` (vo), ``reason`` (none).
    """

    offset: float
    confidence: float
    method: str
    info: dict = field(default_factory=dict)


def _parabola_peak(values: np.ndarray, i: int) -> float:
    """Sub-sample position of the extremum at index ``i`` from a parabola through 3 points."""
    if i <= 0 or i >= values.size - 1:
        return float(i)
    a, b, c = values[i - 1], values[i], values[i + 1]
    denom = a - 2 * b + c
    return float(i) if denom == 0 else float(i + 0.5 * (a - c) / denom)


def _shift_rows(rows: np.ndarray, shift: float) -> np.ndarray:
    """Shift rows by ``shift`` pixels towards higher indices (Fourier shift; pad first)."""
    n = rows.shape[-1]
    freq = np.fft.rfftfreq(n)
    return np.fft.irfft(np.fft.rfft(rows, axis=-1) * np.exp(-2j * np.pi * freq * shift),
                        n=n, axis=-1)


def _mirror_pairs(angles: np.ndarray) -> list[tuple[int, int]]:
    pairs = []
    for i, a in enumerate(angles):
        d = np.abs(np.angle(np.exp(1j * (angles - a - np.pi))))
        k = int(np.argmin(d))
        if d[k] < PAIR_TOLERANCE and k != i and (k, i) not in pairs:
            pairs.append((i, k))
    return pairs


def _mirror(sino: np.ndarray, pairs, max_shift: float) -> CenterEstimate:
    n = sino.shape[1]
    size = 3 * n  # zero padding: a linear (not circular) correlation
    # b(j) = a(j − s) peaks at lag s; keep |s| <= 2 max_shift
    full = np.zeros(size)
    for i, k in pairs:
        a = sino[i][::-1] - sino[i].mean()
        b = sino[k] - sino[k].mean()
        full += np.fft.irfft(np.fft.rfft(b, size) * np.conj(np.fft.rfft(a, size)), size)
    lags = np.fft.fftfreq(size, 1.0 / size)
    order = np.argsort(lags)
    lags, full = lags[order], full[order]
    ok = np.abs(lags) <= 2 * max_shift + 1
    lags, full = lags[ok], full[ok]
    s = lags[int(np.argmax(full))]
    # refine: least-squares mismatch of the Fourier-shifted flipped rows on a 0.1-px grid
    fine = s + np.arange(-1.0, 1.0001, 0.1)
    flipped = np.pad(sino[[i for i, _ in pairs]][:, ::-1], ((0, 0), (n, n)))
    target = np.pad(sino[[k for _, k in pairs]], ((0, 0), (n, n)))
    misfit = np.array([float(((_shift_rows(flipped, t) - target) ** 2).sum()) for t in fine])
    j = int(np.argmin(misfit))
    s = fine[0] + 0.1 * _parabola_peak(misfit, j)
    # confidence: correlation coefficient of the aligned pairs
    num = den_a = den_b = 0.0
    for i, k in pairs:
        a = _shift_rows(np.pad(sino[i][::-1], n), s)[n:-n]
        b = sino[k]
        a, b = a - a.mean(), b - b.mean()
        num += float(a @ b)
        den_a += float(a @ a)
        den_b += float(b @ b)
    conf = max(0.0, num / math.sqrt(den_a * den_b)) if den_a > 0 and den_b > 0 else 0.0
    conf *= min(1.0, len(pairs) / MIN_ANGLES)
    return CenterEstimate(float(s / 2), conf, "mirror", {"n_pairs": len(pairs)})


def _half_turn(sino: np.ndarray, angles: np.ndarray) -> tuple[np.ndarray, float] | None:
    """Rows on an equispaced grid over one half turn ``[θ0, θ0 + π)``, or None if not covered."""
    order = np.argsort(angles)
    a, s = angles[order], sino[order]
    a0 = a[0]
    keep = a < a0 + np.pi - 1e-9
    a, s = a[keep], s[keep]
    if a.size < 2:
        return None
    gaps = np.diff(np.r_[a, a0 + np.pi])
    if gaps.max() > 3 * np.pi / a.size:   # a hole of more than 3 mean steps: not a half turn
        return None
    n = a.size
    step = np.pi / n
    grid = a0 + step * np.arange(n)
    if np.allclose(a, grid, atol=1e-6 * step, rtol=0):
        return s, step
    # linear interpolation in θ, across the wrap θ0 + π ≡ θ0 with the mirrored first row
    # (only its flip is exact at the unknown centre; the interpolation spans < 1 step)
    ext_a = np.r_[a, a0 + np.pi]
    out = np.empty((n, s.shape[1]))
    for j, t in enumerate(grid):
        k = int(np.searchsorted(ext_a, t, side="right")) - 1
        k = min(k, n - 1)
        t0, t1 = ext_a[k], ext_a[k + 1]
        w = (t - t0) / (t1 - t0)
        nxt = s[k + 1] if k + 1 < n else s[0][::-1]
        out[j] = (1 - w) * s[k] + w * nxt
    return out, step


def _vo_metric(half: np.ndarray, shift: float, mask: np.ndarray, pad: int) -> float:
    rows = np.pad(half, ((0, 0), (pad, pad)))
    flipped = _shift_rows(rows[:, ::-1], shift)
    full = np.vstack([rows, flipped])
    spec = np.abs(np.fft.fft2(full))
    return float((spec * mask).sum() / mask.sum())


def _vo(sino: np.ndarray, angles: np.ndarray, max_shift: float) -> CenterEstimate:
    got = _half_turn(sino, angles)
    if got is None:
        return CenterEstimate(math.nan, 0.0, "none",
                              {"reason": "the angles do not cover 180°"})
    half, _ = got
    n_ang, n_det = half.shape
    pad = int(math.ceil(2 * max_shift)) + 2
    width = n_det + 2 * pad
    # double wedge: angular harmonic k, detector frequency m / width (cycles per pixel);
    # an object within the detector (radius n_det/2 pixels) keeps |k| <= R·2π|m|/width
    k = np.abs(np.fft.fftfreq(2 * n_ang, 1.0 / (2 * n_ang)))[:, None]
    m = np.abs(np.fft.fftfreq(width, 1.0 / width))[None, :]
    radius = n_det / 2
    mask = (k > radius * 2 * np.pi * m / width) & (k >= 1) & (m >= 1)
    if not mask.any():
        return CenterEstimate(math.nan, 0.0, "none", {"reason": "too few angles"})
    shifts = np.arange(-2 * max_shift, 2 * max_shift + 0.25, 0.5)
    metric = np.array([_vo_metric(half, s, mask, pad) for s in shifts])
    i = int(np.argmin(metric))
    fine = shifts[i] + np.arange(-0.5, 0.5001, 0.1)
    fine_metric = np.array([_vo_metric(half, s, mask, pad) for s in fine])
    j = int(np.argmin(fine_metric))
    s = fine[0] + 0.1 * _parabola_peak(fine_metric, j)
    conf = float(max(0.0, 1.0 - metric[i] / np.median(metric))) * min(1.0, n_ang / MIN_ANGLES)
    return CenterEstimate(float(s / 2), conf, "vo",
                          {"shifts": shifts / 2, "metric": metric})


def estimate_center_offset(sinogram, angles, *, method: str = "auto",
                           max_offset: float | None = None) -> CenterEstimate:
    """Estimate the centre-of-rotation offset of a parallel-beam sinogram.

    Parameters
    ----------
    sinogram : array_like, shape (n_angles, n_detector)
        Line integrals, ctuq's layout (``[angle, detector]``).
    angles : array_like, shape (n_angles,)
        Projection angles in radians, any order.
    method : {'auto', 'mirror', 'vo'}, optional
        ``'auto'`` (default): ``'mirror'`` when at least 3 pairs of angles lie
        ``π`` apart (to ``PAIR_TOLERANCE``), else ``'vo'``.
    max_offset : float, optional
        Largest ``|offset|`` searched (pixels). Default ``n_detector / 4``.

    Returns
    -------
    CenterEstimate
        ``offset`` in detector pixels, in ctuq's convention (the axis at pixel
        ``(n_detector − 1)/2 + offset``; tomopy's ``center`` is
        ``n_detector/2 + offset``), and a ``confidence``. Angles that cover
        less than 180° give ``offset = nan``, confidence 0.

    Raises
    ------
    InputError
        On a sinogram that is not 2-D, angles that do not match it, or an
        unknown method.
    """
    sino = np.asarray(sinogram, dtype=np.float64)
    angles = np.asarray(angles, dtype=np.float64).reshape(-1)
    if sino.ndim != 2:
        raise InputError(f"expected (n_angles, n_detector), got shape {sino.shape}",
                         field="sinogram")
    if angles.size != sino.shape[0]:
        raise InputError(f"{angles.size} angles for {sino.shape[0]} sinogram rows",
                         field="angles")
    if not (np.all(np.isfinite(sino)) and np.all(np.isfinite(angles))):
        raise InputError("contains NaN or infinite values", field="sinogram")
    if method not in ("auto", "mirror", "vo"):
        raise InputError(f"must be 'auto', 'mirror' or 'vo', got {method!r}", field="method")
    max_offset = sino.shape[1] / 4 if max_offset is None else float(max_offset)
    if sino.shape[0] < 2:
        return CenterEstimate(math.nan, 0.0, "none", {"reason": "fewer than 2 angles"})
    pairs = _mirror_pairs(angles)
    if method == "mirror" or (method == "auto" and len(pairs) >= 3):
        if not pairs:
            return CenterEstimate(math.nan, 0.0, "none",
                                  {"reason": "no two angles lie 180° apart"})
        return _mirror(sino, pairs, max_offset)
    return _vo(sino, angles, max_offset)
