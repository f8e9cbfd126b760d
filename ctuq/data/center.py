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
  minimum is searched on a 0.25-pixel grid of the offset (on a detector of
  ``2 × COARSE_WIDTH`` pixels or more: first on rows binned by
  ``n // COARSE_WIDTH``, then at full resolution near that minimum), then on
  a 0.05-pixel grid with a parabola through the three best.

Both return a confidence in ``[0, 1]``: ``'mirror'`` the correlation
coefficient of the aligned pairs (1: identical), ``'vo'`` the relative depth
of the metric's minimum, ``1 − min / median`` over the search range; both
scaled down below ``MIN_ANGLES`` projections per half turn. An
angle set that covers less than 180° cannot determine the centre this way:
the result then has ``offset = nan`` and confidence 0.

:func:`center_offset_std` gives an estimate's standard deviation under the
data's noise (a parametric bootstrap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ctuq.errors import InputError

#: Largest mismatch (radians) of a "θ and θ + π" pair for the mirror method.
PAIR_TOLERANCE = 1e-4
#: ``'vo'`` searches the whole range on the rows binned by ``n_detector // COARSE_WIDTH``
#: (from twice this width on), and the full resolution only near that minimum: at
#: 512 detector pixels 6–8× faster, the same estimate (docs/real_scans.md).
COARSE_WIDTH = 128
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
        ``n_pairs`` (mirror), ``metric``, ``shifts`` and ``pad`` (the detector's
        zero padding, vo), ``reason`` (none).
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


def _fine_minimum(metric, around: float, half_width: float) -> float:
    """The minimum of ``metric(shift)`` on a 0.1-shift grid ``around ± half_width``,
    refined by a parabola through the three best."""
    fine = around + np.arange(-half_width, half_width + 1e-4, 0.1)
    values = np.array([metric(t) for t in fine])
    return float(fine[0] + 0.1 * _parabola_peak(values, int(np.argmin(values))))


def _mirror_refine(sino: np.ndarray, pairs, around: float, half_width: float) -> float:
    """The shift (2 × offset) of least squared mismatch between each pair's rows,
    the flipped row Fourier-shifted, near ``around``."""
    n = sino.shape[1]
    flipped = np.pad(sino[[i for i, _ in pairs]][:, ::-1], ((0, 0), (n, n)))
    target = np.pad(sino[[k for _, k in pairs]], ((0, 0), (n, n)))
    return _fine_minimum(lambda t: float(((_shift_rows(flipped, t) - target) ** 2).sum()),
                         around, half_width)


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
    s = _mirror_refine(sino, pairs, lags[int(np.argmax(full))], 1.0)
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


def _vo_mask(shape: tuple[int, int], pad: int) -> np.ndarray:
    """Vo's metric's region: outside the double wedge of the stitched 360° sinogram."""
    n_ang, n_det = shape
    width = n_det + 2 * pad
    # double wedge: angular harmonic k, detector frequency m / width (cycles per pixel);
    # an object within the detector (radius n_det/2 pixels) keeps |k| <= R·2π|m|/width
    k = np.abs(np.fft.fftfreq(2 * n_ang, 1.0 / (2 * n_ang)))[:, None]
    m = np.abs(np.fft.fftfreq(width, 1.0 / width))[None, :]
    radius = n_det / 2
    return (k > radius * 2 * np.pi * m / width) & (k >= 1) & (m >= 1)


def _vo(sino: np.ndarray, angles: np.ndarray, max_shift: float) -> CenterEstimate:
    got = _half_turn(sino, angles)
    if got is None:
        return CenterEstimate(math.nan, 0.0, "none",
                              {"reason": "the angles do not cover 180°"})
    half, _ = got
    n_ang = half.shape[0]
    pad = int(math.ceil(2 * max_shift)) + 2
    mask = _vo_mask(half.shape, pad)
    if not mask.any():
        return CenterEstimate(math.nan, 0.0, "none", {"reason": "too few angles"})
    shifts = np.arange(-2 * max_shift, 2 * max_shift + 0.25, 0.5)
    b = max(1, half.shape[1] // COARSE_WIDTH)
    if b == 1:
        metric = np.array([_vo_metric(half, s, mask, pad) for s in shifts])
        typical = np.median(metric)
    else:  # the whole range on a binned copy, then the full grid near its minimum
        shifts, metric, typical = _vo_binned_search(half, shifts, b, mask, pad)
    i = int(np.argmin(metric))
    s = _fine_minimum(lambda t: _vo_metric(half, t, mask, pad), shifts[i], 0.5)
    conf = float(max(0.0, 1.0 - metric[i] / typical)) * min(1.0, n_ang / MIN_ANGLES)
    return CenterEstimate(float(s / 2), conf, "vo",
                          {"shifts": shifts / 2, "metric": metric, "pad": pad})


def _vo_binned_search(half: np.ndarray, shifts: np.ndarray, b: int, mask, pad: int):
    """Vo's metric on the shift grid ``shifts`` where it matters, for a detector of
    ``b × COARSE_WIDTH`` pixels or more: ``(shifts evaluated, metric, median)``.

    The whole range is searched on the rows binned by ``b`` (``b²`` fewer pixels per
    transform, ``b`` fewer shifts); the full-resolution metric is then evaluated on
    the grid within ``2b`` of that minimum, and on about 64 shifts spread over the
    range (every ``2b``-th at least), whose median the confidence compares the
    minimum with.
    """
    n_ang, n_det = half.shape
    nb = n_det // b
    lo = (n_det - nb * b) // 2  # the binned rows' centre within half a pixel of the rows'
    binned = half[:, lo:lo + nb * b].reshape(n_ang, nb, b).mean(axis=-1)
    pad_b = pad // b + 2
    mask_b = _vo_mask(binned.shape, pad_b)
    coarse = shifts[::b] / b
    around = b * coarse[int(np.argmin([_vo_metric(binned, t, mask_b, pad_b) for t in coarse]))]
    spread = np.arange(shifts.size) % max(2 * b, shifts.size // 64) == 0  # ~64 shifts
    keep = (np.abs(shifts - around) <= 2 * b) | spread
    metric = np.array([_vo_metric(half, t, mask, pad) for t in shifts[keep]])
    return shifts[keep], metric, float(np.median(metric[spread[keep]]))


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


def center_offset_std(sinogram, angles, estimate: CenterEstimate, noise_variance, *,
                      n_draws: int = 16, seed: int = 0) -> float:
    """The standard deviation of a centre estimate under the data's noise.

    A parametric bootstrap: ``n_draws`` copies of the sinogram, each with
    Gaussian noise of the data's own variance added, are estimated again by
    the same method, searched only near ``estimate`` (on the 0.05-px grid
    within ±0.3 px, within ±1 px for a draw that lands on that window's
    edge), and the spread of those estimates is returned. Noise of the
    data's variance added to the data moves the estimate as much as the
    data's own noise moved it from the truth, to first order. It does not see
    the estimator's own bias: on realistic scans (counts at I0 1e3–1e5, hidden
    offsets) the errors over this std have an rms of 0.89 on the tuning and
    validation scans, 1.3 on the test scans, where about 0.01 px at high
    counts is systematic (docs/real_scans.md).

    Parameters
    ----------
    sinogram : array_like, shape (n_angles, n_detector)
        Line integrals, as given to :func:`estimate_center_offset`.
    angles : array_like, shape (n_angles,)
        Radians.
    estimate : CenterEstimate
        :func:`estimate_center_offset`'s result on ``sinogram`` and ``angles``.
    noise_variance : float or array_like
        The noise variance of the line integrals: one number, or per ray
        (broadcastable to the sinogram); non-finite entries take the median.
    n_draws : int, optional
        Bootstrap copies. Default 16 (the std to about ±18 %).
    seed : int, optional
        Seed of the added noise. Default 0.

    Returns
    -------
    float
        In detector pixels; ``nan`` where the estimate is undetermined or no
        entry of ``noise_variance`` is finite and non-negative.
    """
    if estimate.method not in ("mirror", "vo") or not math.isfinite(estimate.offset):
        return math.nan
    sino = np.asarray(sinogram, dtype=np.float64)
    angles = np.asarray(angles, dtype=np.float64).reshape(-1)
    var = np.broadcast_to(np.asarray(noise_variance, dtype=np.float64), sino.shape)
    ok = np.isfinite(var) & (var >= 0)
    if not ok.any():  # nothing to draw the noise from
        return math.nan
    std = np.sqrt(np.where(ok, var, np.median(var[ok])))
    rng = np.random.default_rng(seed)
    centre = 2.0 * estimate.offset
    if estimate.method == "mirror":
        pairs = _mirror_pairs(angles)

        def refit(y, half_width):
            return _mirror_refine(y, pairs, centre, half_width)
    else:
        pad = estimate.info["pad"]  # the estimate's own padding: the same metric
        mask = _vo_mask(_half_turn(sino, angles)[0].shape, pad)

        def refit(y, half_width):
            half = _half_turn(y, angles)[0]
            return _fine_minimum(lambda t: _vo_metric(half, t, mask, pad), centre, half_width)
    draws = []
    for _ in range(n_draws):
        y = sino + std * rng.standard_normal(sino.shape)
        s = refit(y, 0.6)
        if abs(s - centre) > 0.55:  # on the window's edge: search wider
            s = refit(y, 2.0)
        draws.append(s / 2)
    return float(np.std(draws))
