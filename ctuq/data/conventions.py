"""Adapters from other tools' sinogram conventions to ctuq's.

ctuq uses ASTRA's axis and angle convention (see :mod:`ctuq.data.geometry`
and ``docs/conventions.md``); tomopy and NXtomo/DXchange data follow it too,
so their sinograms need no adapter, only the centre of rotation
(:func:`center_offset_from_tomopy`). scikit-image's ``radon`` differs in three
ways, all handled by :func:`skimage_geometry` and :func:`from_skimage_layout`:

- its output is ``[detector, angle]`` (ctuq: ``[angle, detector]``);
- it rotates the image about pixel ``(n//2, n//2)``, half a pixel off the
  image centre for even ``n`` (ctuq: ``image_offset = (-0.5, -0.5)``);
- the rotation axis projects onto detector pixel ``n_det//2``, half a pixel
  off the detector centre for even ``n_det`` (ctuq: ``center_offset = 0.5``).

The angle direction and the detector direction are the same as ASTRA's
(measured against ASTRA's projector: docs/conventions.md).
"""

from __future__ import annotations

import math

import numpy as np

from ctuq.errors import InputError

#: Accepted values of ``convention=``: ``'astra'`` (also tomopy, NXtomo,
#: DXchange; the default) and ``'skimage'`` (scikit-image ``radon``/``iradon``).
CONVENTIONS = ("astra", "skimage")


def check_convention(value) -> str:
    """The convention name, lower-cased; anything unknown is an InputError."""
    if not isinstance(value, str) or value.strip().lower() not in CONVENTIONS:
        raise InputError(f"must be one of {', '.join(CONVENTIONS)}, got {value!r}",
                         field="convention")
    return value.strip().lower()


def skimage_image_size(n_detector: int, circle: bool = True) -> int:
    """The image side that scikit-image's ``radon`` turns into ``n_detector`` bins.

    ``circle=True``: the side equals ``n_detector``. ``circle=False``: the
    image is padded to its diagonal, ``n_detector = ceil(sqrt(2) * side)``.

    Raises
    ------
    InputError
        No image side gives ``n_detector`` bins (pass ``image_size``).
    """
    n = int(n_detector)
    if circle:
        return n
    side = int(math.floor(n / math.sqrt(2)))
    for s in (side - 1, side, side + 1):
        if s >= 2 and math.ceil(math.sqrt(2) * s) == n:
            return s
    raise InputError(f"no image side gives {n} detector bins with circle=False; pass "
                     "image_size", field="image_size")


def skimage_offsets(n_detector: int, image_size: int) -> dict:
    """``center_offset`` and ``image_offset`` of a scikit-image ``radon`` sinogram."""
    c = 0.5 if int(n_detector) % 2 == 0 else 0.0
    d = -0.5 if int(image_size) % 2 == 0 else 0.0
    return {"center_offset": c, "image_offset": (d, d)}


def from_skimage_layout(data: np.ndarray) -> np.ndarray:
    """``[..., detector, angle]`` (scikit-image) -> ``[..., angle, detector]`` (ctuq)."""
    arr = np.asarray(data)
    if arr.ndim < 2:
        raise InputError(f"a scikit-image sinogram is [detector, angle]; got shape {arr.shape}",
                         field="data")
    return np.ascontiguousarray(np.swapaxes(arr, -1, -2))


def to_skimage_layout(data: np.ndarray) -> np.ndarray:
    """Inverse of :func:`from_skimage_layout` (for ``skimage.transform.iradon``)."""
    return np.ascontiguousarray(np.swapaxes(np.asarray(data), -1, -2))


def skimage_geometry(n_detector: int, theta_deg=None, *, image_size: int | None = None,
                     circle: bool = True, pixel_size: float = 1.0):
    """The :class:`~ctuq.data.geometry.Geometry` of ``skimage.transform.radon(image, theta)``.

    Parameters
    ----------
    n_detector : int
        Rows of the radon image (its first axis).
    theta_deg : array_like, optional
        The ``theta`` given to ``radon`` (degrees). Default ``np.arange(180)``,
        as scikit-image.
    image_size : int, optional
        Side of the (square) image. Default: from ``n_detector`` and ``circle``
        (:func:`skimage_image_size`).
    circle : bool
        The ``circle`` argument given to ``radon``. Default True (its default).
    pixel_size : float
        Physical size of one pixel (mm). Default 1; scikit-image's values are
        sums over pixels, i.e. line integrals in pixel units.
    """
    from ctuq.data.geometry import Geometry

    theta = np.arange(180.0) if theta_deg is None else np.asarray(theta_deg, dtype=np.float64)
    size = skimage_image_size(n_detector, circle) if image_size is None else int(image_size)
    return Geometry(image_shape=(size, size), angles=np.deg2rad(theta.reshape(-1)),
                    n_detector=int(n_detector), pixel_size=pixel_size,
                    detector_spacing=pixel_size, **skimage_offsets(n_detector, size))


def center_offset_from_tomopy(center: float, n_detector: int) -> float:
    """ctuq's ``center_offset`` for tomopy's ``center`` (rotation axis position).

    tomopy places the axis at ``center`` in a detector coordinate whose
    centre is ``n_detector / 2`` (its default), so ``center_offset = center -
    n_detector / 2`` (tomopy's ASTRA wrapper shifts the detector by exactly
    this many pixels).
    """
    return float(center) - int(n_detector) / 2
