"""The :class:`Sinogram`: measured (or simulated) data with their geometry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ctuq.data.geometry import Geometry
from ctuq.data.io._common import check_array, check_signal
from ctuq.errors import InputError


@dataclass(eq=False)
class Sinogram:
    """Line-integral data, their acquisition geometry and what is known about them.

    Parameters
    ----------
    data : array_like, shape (n_angles, n_detector) or (n_slices, n_angles, n_detector)
        Line integrals (dimensionless, already ``-log`` of the transmission),
        cast to C-contiguous float32 (integer data: ``meta['source_dtype']``
        records their type). A 3-D array is a stack of slices, all
        with the same geometry, reconstructed one by one.
    geometry : Geometry
        Its ``range_shape`` must equal ``data.shape[-2:]``.
    meta : dict, optional
        Free-form, JSON-able information. Keys used by ctuq: ``source`` (the
        file read), ``format``, ``units``, ``noise_std`` (absolute standard
        deviation of the additive Gaussian noise, in data units),
        ``noise_level`` (relative, e.g. 0.05), ``seed``, ``phantom``,
        ``flat_dark_corrected`` (bool).
    ground_truth : array_like, optional
        The true image, shape ``geometry.image_shape`` (or ``(n_slices, *image_shape)``
        for a stack), float32; known for simulated data.
    variance : array_like, optional
        The variance of every line integral, the shape of ``data``, float32
        (positive, finite): the delta-method variance of line integrals a
        reader derived from photon counts with flat frames
        (:func:`ctuq.data.counts.counts_to_line_integrals`); the count noise
        model of a reconstruction reads it (``noise_model``). Kept in memory
        only: no writer stores it. Default None.

    Raises
    ------
    InputError
        Non-numeric, empty or non-finite data, wrong number of dimensions, or
        shapes that do not match the geometry.

    Examples
    --------
    >>> g = Geometry.parallel(8, n_angles=4, n_detector=12)
    >>> s = Sinogram(np.zeros((4, 12)), g)
    >>> s.n_slices, s.is_stack, s.data.dtype
    (1, False, dtype('float32'))
    """

    data: np.ndarray
    geometry: Geometry
    meta: dict[str, Any] = field(default_factory=dict)
    ground_truth: np.ndarray | None = None
    variance: np.ndarray | None = None

    def __post_init__(self):
        src = self.meta.get("source") if isinstance(self.meta, dict) else None
        if not isinstance(self.geometry, Geometry):
            raise InputError(f"must be a Geometry, got {type(self.geometry).__name__}",
                             file=src, field="geometry")
        if not isinstance(self.meta, dict):
            raise InputError(f"must be a dict, got {type(self.meta).__name__}", field="meta")
        self.meta = dict(self.meta)
        if self.meta.get("noise_std") is not None:
            v = self.meta["noise_std"]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(v) or v <= 0:
                raise InputError(f"must be a positive finite number (the noise std of the "
                                 f"data), got {v!r}", file=src, field="meta.noise_std")
            self.meta["noise_std"] = float(v)
        dtype = getattr(self.data, "dtype", None)
        if dtype is not None and np.dtype(dtype).kind in "iub":
            # integer line integrals: converted below, noted by the pipeline's data checks
            self.meta.setdefault("source_dtype", str(np.dtype(dtype)))
        data = check_array(self.data, file=src, field="data", ndims=(2, 3))
        n_angles, n_det = data.shape[-2:]
        if n_angles != self.geometry.n_angles:
            raise InputError(
                f"the data have {n_angles} projection rows but the geometry has "
                f"{self.geometry.n_angles} angles"
                + (" (is this a stack of projections [angles, rows, detector] rather than of "
                   "sinograms [slices, angles, detector]?)" if data.ndim == 3 else ""),
                file=src, field="angles")
        if n_det != self.geometry.n_detector:
            raise InputError(f"the data have {n_det} detector pixels but the geometry has "
                             f"{self.geometry.n_detector}", file=src, field="n_detector")
        self.data = data
        if self.ground_truth is not None:
            gt = check_array(self.ground_truth, file=src, field="ground_truth", ndims=(2, 3))
            want = tuple(self.geometry.image_shape)
            if data.ndim == 3:
                want = (data.shape[0],) + want
            if gt.shape != want:
                raise InputError(f"has shape {gt.shape}; {want} expected from the data and "
                                 "geometry", file=src, field="ground_truth")
            self.ground_truth = gt
        if self.variance is not None:
            var = check_array(self.variance, file=src, field="variance", ndims=(2, 3))
            if var.shape != data.shape:
                raise InputError(f"has shape {var.shape}; the data's {data.shape} expected",
                                 file=src, field="variance")
            if not np.all(var > 0):
                raise InputError("must be positive (the variance of every line integral)",
                                 file=src, field="variance")
            self.variance = var

    # -- shape helpers ------------------------------------------------------
    @property
    def is_stack(self) -> bool:
        """True when ``data`` is a 3-D stack of slices."""
        return self.data.ndim == 3

    @property
    def n_slices(self) -> int:
        """Number of slices (1 for a single 2-D sinogram)."""
        return self.data.shape[0] if self.is_stack else 1

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def noise_std(self) -> float | None:
        """Absolute noise standard deviation from ``meta``, if known."""
        v = self.meta.get("noise_std")
        return None if v is None else float(v)

    def check_signal(self) -> None:
        """Refuse data that cannot be reconstructed: constant (all zero
        included) or non-finite, per slice (:func:`ctuq.data.io._common.check_signal`).

        Raises
        ------
        InputError
            Naming the field ``sinogram`` and the file it came from, if any.
        """
        check_signal(self.data, file=self.meta.get("source"), field="sinogram")

    def slice(self, i: int) -> "Sinogram":
        """The 2-D sinogram of slice ``i`` (``meta`` gains ``slice_index``).

        A 2-D sinogram has one slice, index 0 (or -1).
        """
        n = self.n_slices
        if not isinstance(i, (int, np.integer)) or not -n <= i < n:
            raise InputError(f"slice index {i!r} out of range for {n} slice(s)", field="slice")
        i = int(i) % n
        if not self.is_stack:
            return self
        gt = None if self.ground_truth is None else self.ground_truth[i]
        var = None if self.variance is None else self.variance[i]
        return Sinogram(self.data[i], self.geometry, {**self.meta, "slice_index": i}, gt,
                        variance=var)

    def slices(self) -> Iterator["Sinogram"]:
        """Iterate over the 2-D sinograms of the slices."""
        for i in range(self.n_slices):
            yield self.slice(i)

    # -- other conventions ----------------------------------------------------
    @classmethod
    def from_skimage(cls, radon_image, theta=None, *, image_size: int | None = None,
                     circle: bool = True, pixel_size: float = 1.0, meta: dict | None = None,
                     ground_truth=None) -> "Sinogram":
        """A sinogram made by ``skimage.transform.radon(image, theta, circle=circle)``.

        Parameters
        ----------
        radon_image : array_like, shape (n_detector, n_angles)
            scikit-image's layout (a stack ``(n_slices, n_detector, n_angles)``
            is accepted too).
        theta : array_like, optional
            The angles given to ``radon``, in **degrees**. Default
            ``np.arange(180)`` (scikit-image's default).
        image_size : int, optional
            Side of the image given to ``radon``. Default: inferred from the
            number of detector bins and ``circle``.
        circle : bool
            As given to ``radon``. Default True (its default).
        pixel_size : float
            mm per pixel. Default 1 (scikit-image sums over pixels).
        meta, ground_truth
            As for :class:`Sinogram`; a ground truth is the image given to
            ``radon``, in its own orientation.

        Returns
        -------
        Sinogram
            ``[n_angles, n_detector]`` data in ctuq's convention; the geometry
            carries scikit-image's centre (``center_offset``, ``image_offset``;
            see :mod:`ctuq.data.conventions`), so the reconstruction comes out
            aligned with the image ``radon`` was given.
        """
        from ctuq.data.conventions import from_skimage_layout, skimage_geometry

        arr = np.asarray(radon_image)
        if arr.ndim not in (2, 3):
            raise InputError(f"has {arr.ndim} dimension(s); (n_detector, n_angles) expected",
                             field="radon_image")
        geometry = skimage_geometry(arr.shape[-2], theta, image_size=image_size,
                                    circle=circle, pixel_size=pixel_size)
        return cls(from_skimage_layout(arr), geometry,
                   {"convention": "skimage", **(meta or {})}, ground_truth)

    def to_skimage(self) -> tuple[np.ndarray, np.ndarray]:
        """``(radon_image, theta_deg)`` for ``skimage.transform.iradon``.

        Exact only for a geometry made by :meth:`from_skimage` (scikit-image
        has no centre-of-rotation parameter); the data are transposed to
        ``[..., n_detector, n_angles]``.
        """
        from ctuq.data.conventions import to_skimage_layout

        return to_skimage_layout(self.data), self.geometry.angles_deg.copy()

    # -- comparison ---------------------------------------------------------
    def __eq__(self, other) -> bool:
        if not isinstance(other, Sinogram):
            return NotImplemented
        if (self.ground_truth is None) != (other.ground_truth is None) \
                or (self.variance is None) != (other.variance is None):
            return False
        return (self.geometry == other.geometry
                and np.array_equal(self.data, other.data)
                and (self.ground_truth is None
                     or np.array_equal(self.ground_truth, other.ground_truth))
                and (self.variance is None or np.array_equal(self.variance, other.variance))
                and self.meta == other.meta)

    __hash__ = None  # mutable container

    def __repr__(self) -> str:
        return (f"Sinogram(shape={self.shape}, geometry={self.geometry!r}, "
                f"ground_truth={'yes' if self.ground_truth is not None else 'no'}, "
                f"source={self.meta.get('source')!r})")
