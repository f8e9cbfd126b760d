"""Realistic simulated scans, without the "inverse crime".

A realistic scan (:func:`simulate_realistic`, :func:`realistic_case`) avoids
simulating with the reconstruction's own operator on its own grid with exact
geometry and a known noise level (:func:`ctuq.data.simulate.simulate_sinogram`
does all four): the object is drawn on a grid ``upsample`` times finer,
projected with another projector (ASTRA ``strip``: every detector pixel
integrates the rays over its width), through a centre of rotation that the
returned geometry does not contain, and measured as photon counts with flat
and dark frames; the noise level is never returned with the data.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctuq.data.geometry import finite_number
from ctuq.errors import InputError


# -- realistic scans: finer grid, another projector, hidden centre, photon counts ------

#: Projectors :func:`project_fine` offers (see there).
FINE_PROJECTORS = ("strip", "line", "linear")


def fine_geometry(geometry, upsample: int, center_offset: float = 0.0, *,
                  detector_upsample: int = 1):
    """The geometry of the same scan seen from a grid ``upsample`` times finer.

    The image covers the same region with ``upsample``² times the pixels;
    angles and detector are the same, except that the rotation axis moves by
    ``center_offset`` (coarse detector pixels, added to the geometry's own)
    and, with ``detector_upsample`` > 1, every detector pixel is split into
    that many sub-pixels (their mean is the pixel's value).

    Parameters
    ----------
    geometry : Geometry
        The coarse geometry (the one a reconstruction uses).
    upsample : int
        Fine pixels per coarse pixel along each axis, >= 1.
    center_offset : float, optional
        Extra centre-of-rotation offset in coarse detector pixels. Default 0.
    detector_upsample : int, optional
        Detector sub-pixels per detector pixel. Default 1.

    Returns
    -------
    Geometry
    """
    u, k = _check_factor(upsample, "upsample"), _check_factor(detector_upsample,
                                                              "detector_upsample")
    n0, n1 = geometry.image_shape
    return dataclasses.replace(
        geometry, image_shape=(n0 * u, n1 * u), pixel_size=geometry.pixel_size / u,
        detector_spacing=geometry.detector_spacing / k, n_detector=geometry.n_detector * k,
        center_offset=(geometry.center_offset + float(center_offset)) * k,
        image_offset=(geometry.image_offset[0] * u, geometry.image_offset[1] * u))


def _check_factor(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"must be an integer >= 1, got {value!r}", field=name)
    return int(value)


def _astra_forward(image: np.ndarray, geometry, proj_type: str) -> np.ndarray:
    """ASTRA's CPU forward projection of ``image`` (ctuq axes) with ``proj_type``.

    Uses the same ASTRA volume and projection geometries as ctuq's operator
    (:func:`ctuq.data.operators.odl_space_and_geometry`), so only the
    projector differs. Returns float64 ``(n_angles, n_detector)`` in the
    geometry's angle order.
    """
    import astra
    from odl.applications.tomo.backends.astra_setup import (astra_projection_geometry,
                                                            astra_volume_geometry)

    from ctuq.data.operators import angle_order, odl_space_and_geometry, to_odl_image

    space, odl_geom = odl_space_and_geometry(geometry)
    vol_geom = astra_volume_geometry(space, "cpu")
    proj_geom = astra_projection_geometry(odl_geom, "cpu")
    proj_id = astra.create_projector(proj_type, proj_geom, vol_geom)
    try:
        sino_id, sino = astra.create_sino(
            np.ascontiguousarray(to_odl_image(image), dtype=np.float32), proj_id)
        astra.data2d.delete(sino_id)
    finally:
        astra.projector.delete(proj_id)
    order = angle_order(geometry)
    sino = np.asarray(sino, dtype=np.float64)
    return sino if order is None else sino[np.argsort(order)]


def project_fine(fine_image, geometry, *, projector: str = "strip",
                 center_offset: float = 0.0) -> tuple[np.ndarray, str]:
    """Line integrals of an image on a finer grid, seen by ``geometry``'s detector.

    Parameters
    ----------
    fine_image : array_like, shape (u·n0, u·n1)
        The object on a grid ``u`` times finer than ``geometry.image_shape``
        (``u`` >= 1 an integer), covering the same region; values per mm.
    geometry : Geometry
        The coarse scan geometry (its detector and angles are used).
    projector : {'strip', 'line', 'linear'}, optional
        ``'strip'`` (default): each detector pixel integrates its rays over
        its whole width: ASTRA's ``strip`` projector for parallel beam, ASTRA's
        ``line_fanflat`` through 8 sub-pixels per detector pixel, averaged,
        for fan beam. ``'line'``: one ray through each detector pixel's
        centre (``line`` / ``line_fanflat``). ``'linear'``: ASTRA's ``linear``
        (the kind ctuq reconstructs with, on the finer grid; parallel beam only).
    center_offset : float, optional
        Centre-of-rotation offset (detector pixels) added to the geometry's
        own. Default 0.

    Returns
    -------
    sinogram : ndarray of float64, shape (n_angles, n_detector)
        Line integrals (image value × mm).
    astra_projector : str
        The ASTRA projector used (with its detector sub-sampling, if any).
    """
    img = np.asarray(fine_image, dtype=np.float64)
    n0, n1 = geometry.image_shape
    if img.ndim != 2 or img.shape[0] % n0 or img.shape[1] % n1 \
            or img.shape[0] // n0 != img.shape[1] // n1:
        raise InputError(f"shape {img.shape} is not the same integer multiple of "
                         f"{geometry.image_shape} along both axes", field="fine_image")
    u = img.shape[0] // n0
    if projector not in FINE_PROJECTORS:
        raise InputError(f"must be one of {', '.join(FINE_PROJECTORS)}, got {projector!r}",
                         field="projector")
    fan = geometry.beam == "fan"
    if fan and projector == "linear":
        raise InputError("ASTRA has no 'linear' projector for fan beam; use 'strip' or "
                         "'line'", field="projector")
    sub = 8 if fan and projector == "strip" else 1
    kind = ("line_fanflat" if fan else projector)
    g = fine_geometry(geometry, u, center_offset, detector_upsample=sub)
    sino = _astra_forward(img, g, kind)
    if sub > 1:
        sino = sino.reshape(sino.shape[0], -1, sub).mean(axis=-1)
        kind = f"{kind} x{sub} detector sub-pixels"
    return sino, kind


def downsample(image, factor: int) -> np.ndarray:
    """Mean over ``factor`` × ``factor`` blocks: a fine image in the coarse pixel basis.

    Parameters
    ----------
    image : array_like, shape (factor·n0, factor·n1)
    factor : int

    Returns
    -------
    ndarray of float64, shape (n0, n1)
    """
    f = _check_factor(factor, "factor")
    img = np.asarray(image, dtype=np.float64)
    if img.ndim != 2 or img.shape[0] % f or img.shape[1] % f:
        raise InputError(f"shape {img.shape} is not a multiple of {f}", field="image")
    return img.reshape(img.shape[0] // f, f, img.shape[1] // f, f).mean(axis=(1, 3))


def incident_counts(I0: float, n_detector: int, beam_profile: float = 0.1) -> np.ndarray:
    """Expected open-beam counts per detector pixel: ``I0 (1 - beam_profile t²)``.

    ``t`` runs from -1 to 1 across the detector's pixel centres, so the beam
    is ``I0`` at the centre and ``(1 - beam_profile) I0`` at the edges (a
    smooth beam profile that flat-field correction removes).

    Returns
    -------
    ndarray of float64, shape (n_detector,)
    """
    n = int(n_detector)
    t = np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
    return float(I0) * (1.0 - float(beam_profile) * t**2)


def photon_counts(line_integrals, I0: float, *, n_flats: int = 20, n_darks: int = 10,
                  dark_counts: float = 10.0, read_noise: float = 2.0,
                  beam_profile: float = 0.1,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Detector frames of a scan: projections, flats and darks, in whole counts.

    Every frame value is ``round(Poisson(λ) + Poisson(dark_counts) + N(0,
    read_noise²))``, clipped at 0, with ``λ = I0_j exp(-p)`` for projections,
    ``λ = I0_j`` for flats and ``λ = 0`` for darks (``I0_j``:
    :func:`incident_counts`).

    Parameters
    ----------
    line_integrals : array_like, shape (..., n_detector)
        Noise-free line integrals ``p`` (dimensionless); leading axes are
        projections (any number, e.g. ``(n_repeats, n_angles)``).
    I0 : float
        Expected open-beam counts per detector pixel at the detector centre.
    n_flats, n_darks : int, optional
        Number of flat (open beam) and dark (no beam) frames. Defaults 20, 10.
    dark_counts : float, optional
        Mean dark current per pixel and frame (counts). Default 10.
    read_noise : float, optional
        Std of the Gaussian read-out noise (counts). Default 2.
    beam_profile : float, optional
        See :func:`incident_counts`. Default 0.1.
    rng : numpy.random.Generator
        The source of every draw.

    Returns
    -------
    projections : ndarray of float64, shape of ``line_integrals``
    flats : ndarray of float64, shape (n_flats, n_detector)
    darks : ndarray of float64, shape (n_darks, n_detector)
        Whole numbers of counts (float64 for exact arithmetic).
    """
    p = np.asarray(line_integrals, dtype=np.float64)
    flat_rate = incident_counts(I0, p.shape[-1], beam_profile)

    def frames(rate):
        out = rng.poisson(rate).astype(np.float64)
        if dark_counts > 0:
            out += rng.poisson(dark_counts, size=out.shape)
        if read_noise > 0:
            out += rng.normal(0.0, read_noise, size=out.shape)
        return np.clip(np.rint(out), 0, None)

    projections = frames(flat_rate * np.exp(-p))
    flats = frames(np.broadcast_to(flat_rate, (int(n_flats), flat_rate.size)))
    darks = frames(np.zeros((int(n_darks), flat_rate.size)))
    return projections, flats, darks


def line_integrals_from_counts(projections, flats, darks) -> np.ndarray:
    """Beer–Lambert: ``-log((I - D̄) / (F̄ - D̄))`` with the mean flat ``F̄`` and dark ``D̄``.

    :func:`ctuq.data.counts.counts_to_line_integrals` (the one
    implementation), without its clipping: a ray it would clip is NaN here.

    Parameters
    ----------
    projections : array_like, shape (..., n_detector)
    flats, darks : array_like, shape (n_frames, n_detector)

    Returns
    -------
    ndarray of float64, shape of ``projections``
        NaN where ``I - D̄ <= 0`` or ``F̄ - D̄ <= 0``.
    """
    return _counts_to_line_integrals(projections, flats, darks)[0]


def _counts_to_line_integrals(projections, flats, darks) -> tuple[np.ndarray, np.ndarray]:
    """Line integrals and their delta-method variance, NaN where ``I - D̄ <= 0``
    or ``F̄ - D̄ <= 0`` (:func:`ctuq.data.counts.counts_to_line_integrals`)."""
    import warnings

    from ctuq.data.counts import counts_to_line_integrals

    proj = np.asarray(projections, dtype=np.float64)
    flats, darks = np.asarray(flats, dtype=np.float64), np.asarray(darks, dtype=np.float64)
    d, f = darks.mean(axis=0), flats.mean(axis=0)
    bad = ((proj - d) <= 0) | ((f - d) <= 0)
    lone = proj.ndim == 1   # one projection row: the function wants (..., angles, detector)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the clipped rays are NaN below
        out = counts_to_line_integrals(proj[None] if lone else proj, flats, darks,
                                       min_counts=float(np.finfo(np.float64).tiny))
    y, var = (out.y[0], out.variance[0]) if lone else (out.y, out.variance)
    return np.where(bad, np.nan, y), np.where(bad, np.nan, var)


def line_integral_variance(line_integrals, I0: float, *, n_flats: int = 20, n_darks: int = 10,
                           dark_counts: float = 10.0, read_noise: float = 2.0,
                           beam_profile: float = 0.1) -> np.ndarray:
    """First-order (delta-method) variance of :func:`line_integrals_from_counts`.

    With ``λ = I0_j e^{-p}`` (expected ``I - D``), ``v_d = dark_counts +
    read_noise²`` and ``F = I0_j``::

        Var y ≈ (λ + v_d) / λ² + (F + v_d) / (n_flats F²) + v_d / n_darks · (1/λ - 1/F)²

    The first term, ≈ 1/counts, dominates: rays through dense matter are
    noisier. The flat term is common to every angle of a detector pixel.

    Returns
    -------
    ndarray of float64, shape of ``line_integrals``
    """
    p = np.asarray(line_integrals, dtype=np.float64)
    flat = incident_counts(I0, p.shape[-1], beam_profile)
    lam = flat * np.exp(-p)
    vd = float(dark_counts) + float(read_noise) ** 2
    return ((lam + vd) / lam**2 + (flat + vd) / (int(n_flats) * flat**2)
            + vd / int(n_darks) * (1 / lam - 1 / flat) ** 2)


@dataclass(eq=False)
class RealisticScan:
    """A simulated scan as a detector records it, with what the simulation hid.

    Attributes
    ----------
    projections : ndarray of float64, shape (n_angles, n_detector)
        Counts of the projection frames (whole numbers).
    flats, darks : ndarray of float64, shape (n_flats | n_darks, n_detector)
        Counts of the flat (open beam) and dark frames.
    geometry : Geometry
        The *nominal* geometry, the one a user would give: it does not
        contain the hidden centre-of-rotation offset.
    truth : ndarray of float32, shape geometry.image_shape
        The object averaged over each coarse pixel, in 1/mm (with
        ``pixel_size`` in mm; 1/pixel for the default pixel size 1): the
        units a reconstruction of the line integrals comes out in.
    clean : ndarray of float64, shape (n_angles, n_detector)
        Noise-free line integrals as measured (finer grid, strip projector,
        hidden centre offset).
    variance : ndarray of float64, shape (n_angles, n_detector)
        First-order variance of each line integral
        (:func:`line_integral_variance`): the noise a reconstruction is not told.
    hidden : dict
        JSON-able facts a reconstruction must not be given: ``center_offset``
        (detector pixels), ``I0``, ``noise_std_rms`` (root mean square of the
        per-ray std), the attenuation scale, the projector, the rendering...
    meta : dict
        What may go with the data (phantom, seed).
    """

    projections: np.ndarray
    flats: np.ndarray
    darks: np.ndarray
    geometry: Any
    truth: np.ndarray
    clean: np.ndarray
    variance: np.ndarray
    hidden: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def line_integrals(self) -> np.ndarray:
        """``-log((I - D̄)/(F̄ - D̄))``, float64, shape (n_angles, n_detector)."""
        return line_integrals_from_counts(self.projections, self.flats, self.darks)

    def sinogram(self):
        """The scan as ctuq reads it back from the file :meth:`write` makes.

        Line integrals from the counts with their delta-method variance
        (as the NXtomo reader derives them), the nominal geometry (no centre
        offset), ``meta`` without any noise level and with ``center_offset =
        'auto'`` (raw frames whose centre no source states: the reader's rule,
        :func:`ctuq.data.io.read_sinogram`), the truth as ground truth.

        Returns
        -------
        ctuq.data.io.Sinogram
        """
        from ctuq.data.io.options import AUTO
        from ctuq.data.io.sinogram import Sinogram

        meta = {**self.meta, "flat_dark_corrected": True, "n_flats": int(len(self.flats)),
                "n_darks": int(len(self.darks)), "center_offset": AUTO}
        y, variance = _counts_to_line_integrals(self.projections, self.flats, self.darks)
        return Sinogram(y.astype(np.float32), self.geometry, meta, self.truth,
                        variance=variance.astype(np.float32))

    def write(self, path, *, overwrite: bool = False) -> Path:
        """Write an NXtomo file: the frames (``image_key`` 0/1/2), the nominal
        geometry, the truth, and the hidden facts as the JSON attribute
        ``simulation`` of ``/entry/sample/ground_truth`` (ctuq's reader does
        not read it; a benchmark can).

        Returns
        -------
        pathlib.Path
        """
        from ctuq.data.io.nxtomo import write_sinogram

        sino = self.sinogram()
        for k in ("flat_dark_corrected", "n_flats", "n_darks"):
            sino.meta.pop(k)  # the reader sets them again from the frames
        return write_sinogram(path, sino, overwrite=overwrite,
                              frames={"projections": self.projections, "flats": self.flats,
                                      "darks": self.darks},
                              truth_attrs={"simulation": json.dumps(self.hidden,
                                                                     sort_keys=True)})


def _check_number(value, name: str, lo: float, hi: float, *, open_lo: bool = False) -> float:
    v = finite_number(value, name)
    if not ((v > lo if open_lo else v >= lo) and v <= hi):
        raise InputError(f"must be in {'(' if open_lo else '['}{lo:g}, {hi:g}], got {value!r}",
                         field=name)
    return v


def simulate_realistic(phantom, size: int, n_angles: int, *, I0: float = 1e4,
                       upsample: int = 4, center_offset="random", projector: str = "strip",
                       max_line_integral: float = 2.5, seed: int = 0, phantom_seed: int = 0,
                       n_flats: int = 20, n_darks: int = 10, dark_counts: float = 10.0,
                       read_noise: float = 2.0, beam_profile: float = 0.1,
                       pixel_size: float = 1.0, beam: str = "parallel") -> RealisticScan:
    """Simulate a scan without the inverse crime: finer grid, other projector,
    hidden centre of rotation, photon counts with flat and dark frames.

    1. The object is drawn on a grid ``upsample`` times finer than
       ``size``: families of :data:`ctuq.data.phantoms.ANALYTIC_PHANTOMS`
       (shepp, shepp-variant, ellipses, rectangles) are point samples of
       their exact shapes at the finer pixels; :data:`RASTER_PHANTOMS`
       (digits, natural) are their source raster interpolated to the finer
       grid (:func:`ctuq.data.phantoms.render_phantom`).
    2. It is projected with ASTRA's ``strip`` projector (each detector pixel
       integrates over its width) onto the detector of the coarse geometry,
       through a rotation axis ``center_offset`` detector pixels off the
       nominal one. ctuq reconstructs with ASTRA's ``linear`` projector on
       the coarse grid: the two sinograms differ by a discretisation error
       of a few per cent.
    3. The attenuation is scaled so that the largest line integral is
       ``max_line_integral`` (default 2.5, i.e. 8 % transmission), and the
       detector counts ``Poisson(I0_j e^{-p})`` plus dark current and read
       noise, with ``n_flats`` flat and ``n_darks`` dark frames
       (:func:`photon_counts`).

    No noise level is returned with the data: it is in ``hidden`` only.

    Parameters
    ----------
    phantom : str or callable
        A name of :data:`ctuq.data.phantoms.PHANTOMS` (drawn with
        ``phantom_seed``), or ``f(n) -> array (n, n)`` drawing the object on an
        ``n × n`` grid over the same region (called with ``n = upsample · size``).
    size : int
        Side of the reconstruction grid (pixels), >= 4.
    n_angles : int
        Projection angles, equispaced over 180° (360° for fan beam), ctuq's
        default placement (:meth:`Geometry.parallel`).
    I0 : float, optional
        Open-beam counts per detector pixel at the detector centre, in
        (0, 1e9]. Default 1e4.
    upsample : int, optional
        Fine pixels per coarse pixel along each axis. Default 4.
    center_offset : 'random', float or None, optional
        The hidden centre-of-rotation error (detector pixels, ctuq's
        convention: :class:`Geometry`'s ``center_offset``). ``'random'``
        (default): uniform in [-0.5, 0.5], drawn from ``seed``; None: 0.
    projector : {'strip', 'line', 'linear'}, optional
        See :func:`project_fine`. Default ``'strip'``.
    max_line_integral : float, optional
        Largest noise-free line integral through the nominal rotation axis,
        in (0, 10]. Default 2.5.
    seed : int, optional
        Seed of the centre offset and of every count. Default 0.
    phantom_seed : int, optional
        Seed of a named phantom. Default 0.
    n_flats, n_darks, dark_counts, read_noise, beam_profile
        See :func:`photon_counts`. Defaults 20, 10, 10 counts, 2 counts, 0.1.
    pixel_size : float, optional
        Coarse pixel side (mm). Default 1, so the truth is in 1/pixel.
    beam : {'parallel', 'fan'}, optional
        ctuq's default parallel or fan geometry for ``size`` and ``n_angles``.
        Default ``'parallel'``.

    Returns
    -------
    RealisticScan
        Counts, nominal geometry, truth (1/mm), noise-free data and the
        hidden facts. Projection counts with ``I - D̄ <= 0`` (possible only
        at very low ``I0``) are raised to one count above ``D̄`` and counted
        in ``hidden['n_clamped']``, so that the logarithm exists.

    Examples
    --------
    >>> scan = simulate_realistic("shepp", 16, 12, seed=1)
    >>> scan.projections.shape, scan.truth.shape, "noise_std" in scan.sinogram().meta
    ((12, 23), (16, 16), False)
    """
    from ctuq.data.geometry import Geometry
    from ctuq.data.phantoms import PHANTOMS, _check_size, render_phantom

    size = _check_size(size)
    u = _check_factor(upsample, "upsample")
    if u * size > 8192:
        raise InputError(f"upsample × size = {u * size} pixels a side; at most 8192",
                         field="upsample")
    I0 = _check_number(I0, "I0", 0, 1e9, open_lo=True)
    peak = _check_number(max_line_integral, "max_line_integral", 0, 10, open_lo=True)
    beam_profile = _check_number(beam_profile, "beam_profile", 0, 0.9)
    dark_counts = _check_number(dark_counts, "dark_counts", 0, 1e9)
    read_noise = _check_number(read_noise, "read_noise", 0, 1e6)
    n_flats, n_darks = _check_factor(n_flats, "n_flats"), _check_factor(n_darks, "n_darks")
    if beam not in ("parallel", "fan"):
        raise InputError(f"must be 'parallel' or 'fan', got {beam!r}", field="beam")
    geometry = (Geometry.parallel if beam == "parallel" else Geometry.fan)(
        size, n_angles, pixel_size=pixel_size)

    rng = np.random.default_rng(int(seed))
    if isinstance(center_offset, str):
        if center_offset != "random":
            raise InputError(f"must be 'random', a number or None, got {center_offset!r}",
                             field="center_offset")
        offset = float(rng.uniform(-0.5, 0.5))
    else:
        offset = 0.0 if center_offset is None else _check_number(
            center_offset, "center_offset", -0.25 * geometry.n_detector,
            0.25 * geometry.n_detector)

    if callable(phantom):
        fine, how = np.asarray(phantom(u * size), dtype=np.float64), "callable"
        name = getattr(phantom, "__name__", "callable")
    elif isinstance(phantom, str) and phantom in PHANTOMS:
        fine, how = render_phantom(phantom, u * size, phantom_seed)
        name = phantom
    else:
        raise InputError(f"must be one of {', '.join(PHANTOMS)} or a callable, got "
                         f"{phantom!r}", field="phantom")
    if fine.shape != (u * size, u * size) or not np.all(np.isfinite(fine)) \
            or fine.min() < 0:
        raise InputError(f"the fine image must be finite, >= 0 and ({u * size}, {u * size}); "
                         f"got shape {fine.shape}", field="phantom")
    unit, kind = project_fine(fine, geometry, projector=projector, center_offset=offset)
    # the scale comes from the object alone (its sinogram through the nominal axis),
    # so that repeats of a scan with other centre offsets share one truth
    top = float((unit if offset == 0 else project_fine(fine, geometry, projector=projector)[0])
                .max())
    if top <= 0:
        raise InputError("the object is empty: no ray is attenuated", field="phantom")
    mu = peak / top                                       # 1/mm per unit of the drawing
    clean = mu * unit
    truth = (mu * downsample(fine, u)).astype(np.float32)

    noise = dict(n_flats=n_flats, n_darks=n_darks, dark_counts=dark_counts,
                 read_noise=read_noise, beam_profile=beam_profile)
    proj, flats, darks = photon_counts(clean, I0, rng=rng, **noise)
    d_mean, f_mean = darks.mean(axis=0), flats.mean(axis=0)
    if np.any(f_mean - d_mean <= 0):
        raise InputError(f"I0 = {I0:g} is too low: the flat frames do not rise above the "
                         "dark frames", field="I0")
    low = proj - d_mean <= 0
    if low.any():
        proj = np.where(low, np.floor(d_mean) + 1, proj)
    variance = line_integral_variance(clean, I0, **noise)
    hidden = {
        "center_offset": offset, "I0": I0, "noise_std_rms": float(np.sqrt(variance.mean())),
        "max_line_integral": peak, "attenuation_scale": mu, "upsample": u,
        "projector": projector, "astra_projector": kind, "phantom_rendering": how,
        "n_clamped": int(low.sum()), "noise_seed": int(seed), "phantom_seed": int(phantom_seed),
        **noise}
    meta = {"phantom": name, "seed": int(seed)}
    return RealisticScan(proj, flats, darks, geometry, truth, clean, variance, hidden, meta)


def realistic_case(split: str, family: str, index: int, size: int, n_angles: int,
                   I0: float = 1e4, seed: int = 0, **options):
    """A realistic scan of one benchmark case (:class:`ctuq.data.splits.Case`).

    The object is the case's phantom drawn ``upsample`` times finer
    (:meth:`Case.fine_image`); every random draw of the scan (centre offset,
    counts) comes from ``case.noise_seed(seed)``, so the three splits never
    share a phantom or a noise seed.

    Parameters
    ----------
    split, family, index, size
        The :class:`~ctuq.data.splits.Case`.
    n_angles : int
        Projection angles.
    I0 : float, optional
        Open-beam counts per detector pixel. Default 1e4.
    seed : int, optional
        Which repeat of the case's noise, in [0, 100). Default 0.
    **options
        Other keywords of :func:`simulate_realistic` (``upsample``,
        ``center_offset``, ``max_line_integral``, ``projector``, ...).

    Returns
    -------
    sinogram : ctuq.data.io.Sinogram
        Line integrals derived from the counts, the nominal geometry (without
        the centre offset), no noise level in ``meta``; the truth as its
        ground truth (for metrics only).
    truth : ndarray of float32, shape (size, size)
        In the units of the reconstruction (1/pixel at the default pixel size).
    hidden : dict
        What the reconstruction is not told (:attr:`RealisticScan.hidden`),
        plus ``case`` (the case's name).
    """
    from ctuq.data.splits import Case

    case = Case(split, family, index, size)
    upsample = options.pop("upsample", 4)
    fine, how = case.fine_image(upsample)
    for k in ("phantom_seed", "seed"):
        if k in options:
            raise InputError("is fixed by the case", field=k)
    scan = simulate_realistic(lambda n: fine, size, n_angles, I0=I0, upsample=upsample,
                              seed=case.noise_seed(seed), phantom_seed=case.phantom_seed,
                              **options)
    scan.hidden.update(case=case.name, phantom_rendering=how)
    scan.meta.update(phantom=family, case=case.name)
    return scan.sinogram(), scan.truth, scan.hidden
