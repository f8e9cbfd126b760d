"""Off-grid sinograms for tests: the phantom rendered at 4x and projected by ASTRA's
``strip`` projector (ctuq's operator is ``linear`` at 1x), so that tests do not commit
the inverse crime. Geometry in ctuq's convention (ASTRA's; ``docs/conventions.md``)."""

from __future__ import annotations

import math

import numpy as np


def offgrid_sinogram(image_hr: np.ndarray, size: int, angles, n_detector: int | None = None,
                     center_offset: float = 0.0, pixel_size: float = 1.0) -> np.ndarray:
    """Project a ``(f·size)²`` rendering of a ``size²`` image of pixel ``pixel_size``.

    The detector has ``n_detector`` pixels of spacing 1 (default
    ``ceil(sqrt(2)·size)``, as :meth:`ctuq.data.geometry.Geometry.parallel`), the
    rotation axis at pixel ``(n−1)/2 + center_offset``. Returns float64
    ``(n_angles, n_detector)`` line integrals.
    """
    import astra

    hr = np.asarray(image_hr, dtype=np.float32)
    half = size * pixel_size / 2
    if n_detector is None:
        n_detector = int(math.ceil(math.sqrt(2) * size * pixel_size + 2 * abs(center_offset)
                                   - 1e-9))
    vol = astra.create_vol_geom(hr.shape[0], hr.shape[1], -half, half, -half, half)
    proj = astra.create_proj_geom("parallel", 1.0, int(n_detector),
                                  np.asarray(angles, dtype=np.float64))
    if center_offset:
        proj = astra.geom_postalignment(proj, -float(center_offset))
    pid = astra.create_projector("strip", proj, vol)
    try:
        sid, sino = astra.create_sino(hr, pid)
        astra.data2d.delete(sid)
    finally:
        astra.projector.delete(pid)
    return np.asarray(sino, dtype=np.float64)


def angles_180(n: int) -> np.ndarray:
    """``n`` midpoint angles over ``[0, π)`` (ctuq's default)."""
    return (np.arange(n) + 0.5) * math.pi / n
