"""2-D CT acquisition geometry: parallel beam and fan beam.

One small immutable dataclass describes everything a ray transform needs.
Angles are held in **radians**; files store **degrees** (see
:meth:`Geometry.to_dict`). Lengths (pixel size, detector spacing, source and
detector distances) share one unit, millimetres by convention.

Axis and angle convention (ASTRA's, which tomopy and NXtomo/DXchange data
follow; ``docs/conventions.md``): an image array ``[row, column]`` is shown
with row 0 at the top; ``x`` grows with the column, ``y`` grows *upwards*
(against the row index), and the image is centred on the rotation axis
(unless ``image_offset`` says otherwise). At angle ``θ`` a point ``(x, y)``
projects onto the detector coordinate ``u = x cos θ + y sin θ``; detector
pixel ``j`` of ``n`` sits at ``u = (j + 0.5 - n/2) · spacing`` (plus the
centre-of-rotation offset). For fan beam the source sits at
``R (sin θ, -cos θ)`` and the flat detector on the opposite side.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ctuq.errors import InputError

Beam = Literal["parallel", "fan"]

#: Largest accepted |angle| (radians): a thousand turns. Larger values are not
#: a real scan (an encoder in micro-degrees read as degrees, garbage) and make
#: the projector's trigonometry meaningless.
MAX_ABS_ANGLE = 2000 * math.pi


def finite_number(value, name: str) -> float:
    """``value`` as a finite float; an :class:`InputError` naming ``name`` otherwise."""
    if isinstance(value, bool):
        raise InputError(f"must be a number, got {value!r}", field=name)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InputError(f"must be a number, got {value!r}", field=name) from None
    if not math.isfinite(value):
        raise InputError(f"must be finite, got {value!r}", field=name)
    return value


def _check_positive(value, name: str) -> float:
    if isinstance(value, bool):
        raise InputError(f"must be a number, got {value!r}", field=name)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InputError(f"must be a number, got {value!r}", field=name) from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"must be a positive finite number, got {value!r}", field=name)
    return value


@dataclass(frozen=True, eq=False)
class Geometry:
    """A 2-D parallel-beam or fan-beam (flat detector) CT geometry.

    Build one with :meth:`parallel` or :meth:`fan` rather than directly.

    Parameters
    ----------
    image_shape : tuple of int
        ``(n0, n1)``, pixels of the reconstructed slice.
    angles : array_like of float
        Projection angles in radians, shape ``(n_angles,)``.
    n_detector : int
        Number of detector pixels.
    pixel_size : float, optional
        Side of one image pixel (mm). Default 1.
    detector_spacing : float, optional
        Distance between detector pixel centres, at the detector (mm).
        Default: ``pixel_size`` for parallel beam, ``pixel_size`` times the
        magnification for fan beam.
    beam : {'parallel', 'fan'}
        Beam shape. Default ``'parallel'``.
    source_origin, origin_detector : float, optional
        Fan beam only: distances from the source to the rotation axis and
        from the rotation axis to the detector (mm).
    center_offset : float, optional
        Centre of rotation on the detector, in detector pixels: the rotation
        axis projects onto pixel index ``(n_detector - 1) / 2 + center_offset``
        (0-based pixel centres). tomopy's ``center`` is
        ``n_detector / 2 + center_offset``. Default 0.
    image_offset : (float, float), optional
        Where the image centre lies relative to the rotation axis, in image
        pixels along the array axes ``(rows down, columns right)``.
        scikit-image's ``radon`` rotates an even-sized image about pixel
        ``(n//2, n//2)``, i.e. ``image_offset = (-0.5, -0.5)``. Default (0, 0).

    Raises
    ------
    InputError
        If a field is missing, non-finite or inconsistent, or if the
        detector cannot see the disc inscribed in the image.

    Examples
    --------
    >>> g = Geometry.parallel(64, n_angles=60)
    >>> g.range_shape
    (60, 91)
    >>> Geometry.from_dict(g.to_dict()) == g
    True
    """

    image_shape: tuple[int, int]
    angles: np.ndarray
    n_detector: int
    pixel_size: float = 1.0
    detector_spacing: float | None = None
    beam: Beam = "parallel"
    source_origin: float | None = None
    origin_detector: float | None = None
    center_offset: float = 0.0
    image_offset: tuple[float, float] = (0.0, 0.0)
    _fingerprint: str = field(default="", init=False, repr=False)

    def __post_init__(self):
        shape = self.image_shape
        if np.isscalar(shape):
            shape = (shape, shape)
        try:
            shape = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            raise InputError(f"must be two positive integers, got {self.image_shape!r}",
                             field="image_shape") from None
        if len(shape) != 2 or min(shape) < 2:
            raise InputError(f"must be two integers >= 2, got {self.image_shape!r}",
                             field="image_shape")
        object.__setattr__(self, "image_shape", shape)

        try:
            angles = np.array(self.angles, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise InputError("must be an array of numbers (radians)", field="angles") from None
        if angles.size == 0:
            raise InputError("no projection angles given", field="angles")
        if not np.all(np.isfinite(angles)):
            raise InputError("contains NaN or infinite values", field="angles")
        if np.unique(angles).size != angles.size:
            raise InputError("contains repeated angles", field="angles")
        if np.abs(angles).max() > MAX_ABS_ANGLE:
            raise InputError(f"|angle| up to {np.abs(angles).max():.3g} rad: more than "
                             f"{MAX_ABS_ANGLE / (2 * math.pi):.0f} turns; not a real scan "
                             "(wrong unit?)", field="angles")
        angles.setflags(write=False)
        object.__setattr__(self, "angles", angles)

        if self.beam not in ("parallel", "fan"):
            raise InputError(f"must be 'parallel' or 'fan', got {self.beam!r}", field="beam")
        try:
            n_det = int(self.n_detector)
        except (TypeError, ValueError):
            raise InputError(f"must be a positive integer, got {self.n_detector!r}",
                             field="n_detector") from None
        if n_det < 1 or n_det != self.n_detector:
            raise InputError(f"must be a positive integer, got {self.n_detector!r}",
                             field="n_detector")
        object.__setattr__(self, "n_detector", n_det)
        object.__setattr__(self, "pixel_size", _check_positive(self.pixel_size, "pixel_size"))

        if self.beam == "fan":
            if self.source_origin is None or self.origin_detector is None:
                raise InputError("fan beam needs source_origin and origin_detector",
                                 field="source_origin" if self.source_origin is None
                                 else "origin_detector")
            src = _check_positive(self.source_origin, "source_origin")
            try:
                det = float(self.origin_detector)
            except (TypeError, ValueError):
                raise InputError("must be a number", field="origin_detector") from None
            if not math.isfinite(det) or det < 0:
                raise InputError(f"must be finite and >= 0, got {self.origin_detector!r}",
                                 field="origin_detector")
            if src <= self.image_radius:
                raise InputError(
                    f"source at {src:g} mm lies inside the image (radius "
                    f"{self.image_radius:g} mm)", field="source_origin")
            object.__setattr__(self, "source_origin", src)
            object.__setattr__(self, "origin_detector", det)
        else:
            for name in ("source_origin", "origin_detector"):
                if getattr(self, name) is not None:
                    raise InputError("only meaningful for fan beam", field=name)

        spacing = self.detector_spacing
        if spacing is None:
            spacing = self.pixel_size * self.magnification
        object.__setattr__(self, "detector_spacing",
                           _check_positive(spacing, "detector_spacing"))
        object.__setattr__(self, "center_offset", finite_number(self.center_offset,
                                                                "center_offset"))
        offset = self.image_offset
        if offset is None or np.isscalar(offset) or len(offset) != 2:
            raise InputError(f"must be two numbers (rows, columns), got {offset!r}",
                             field="image_offset")
        offset = tuple(finite_number(v, "image_offset") for v in offset)
        object.__setattr__(self, "image_offset", offset)

        # The detector must at least see the disc inscribed in the image (to
        # within 1.5 detector pixels on each side: scikit-image's circle=True
        # sinograms of even images fall 1.2 pixels short), otherwise every
        # reconstruction is an interior problem.
        radius = 0.5 * min(shape) * self.pixel_size + math.hypot(*offset) * self.pixel_size
        needed = self._detector_width_for_radius(radius)
        usable = (self.detector_width - 2 * abs(self.center_offset) * self.detector_spacing
                  + 3 * self.detector_spacing)
        if usable < needed * (1 - 1e-9):
            shifted = " once shifted by center_offset" if self.center_offset else ""
            raise InputError(
                f"detector too small: {n_det} x {self.detector_spacing:g} mm = "
                f"{self.detector_width:g} mm cannot cover the image's inscribed disc"
                f"{shifted} ({needed:g} mm needed)", field="n_detector")
        object.__setattr__(self, "_fingerprint", self._compute_fingerprint())

    # -- constructors -----------------------------------------------------
    @classmethod
    def parallel(cls, image_size, n_angles: int | None = None, *, angles=None,
                 n_detector: int | None = None, pixel_size: float = 1.0,
                 detector_spacing: float | None = None,
                 angle_range: float = math.pi, center_offset: float = 0.0) -> "Geometry":
        """Parallel-beam geometry with equispaced angles over ``angle_range``.

        Parameters
        ----------
        image_size : int or (int, int)
            Image side (pixels), or its shape.
        n_angles : int, optional
            Number of angles, placed at the midpoints of ``n_angles`` equal
            cells of ``[0, angle_range)`` (ODL's convention). Ignored when
            ``angles`` is given.
        angles : array_like, optional
            Explicit angles in radians.
        n_detector : int, optional
            Default: enough pixels to cover the image diagonal,
            ``ceil(sqrt(2) * max(image_shape) * pixel_size / detector_spacing)``.
        pixel_size, detector_spacing : float, optional
            See :class:`Geometry`.
        angle_range : float, optional
            Default pi (radians).
        center_offset : float, optional
            See :class:`Geometry`.
        """
        shape = _as_shape(image_size)
        angles = _make_angles(n_angles, angles, angle_range)
        spacing = pixel_size if detector_spacing is None else detector_spacing
        if n_detector is None:
            n_detector = int(math.ceil(math.sqrt(2) * max(shape) * _check_positive(
                pixel_size, "pixel_size") / _check_positive(spacing, "detector_spacing")
                + 2 * abs(finite_number(center_offset, "center_offset")) - 1e-9))
        return cls(shape, angles, n_detector, pixel_size, spacing, "parallel",
                   center_offset=center_offset)

    @classmethod
    def fan(cls, image_size, n_angles: int | None = None, *, angles=None,
            source_origin: float | None = None, origin_detector: float | None = None,
            n_detector: int | None = None, pixel_size: float = 1.0,
            detector_spacing: float | None = None,
            angle_range: float = 2 * math.pi, center_offset: float = 0.0) -> "Geometry":
        """Fan-beam geometry with a flat detector.

        Parameters
        ----------
        image_size : int or (int, int)
            Image side (pixels), or its shape.
        n_angles, angles, angle_range
            As in :meth:`parallel`; the default range is a full turn.
        source_origin : float, optional
            Default: twice the image diagonal.
        origin_detector : float, optional
            Default: equal to ``source_origin`` (magnification 2).
        n_detector : int, optional
            Default: enough pixels to see the image's circumscribed disc.
        """
        shape = _as_shape(image_size)
        angles = _make_angles(n_angles, angles, angle_range)
        radius = 0.5 * math.hypot(*shape) * _check_positive(pixel_size, "pixel_size")
        src = 4 * radius if source_origin is None else source_origin
        det = src if origin_detector is None else origin_detector
        if n_detector is None:
            probe = cls(shape, angles, 10**7, pixel_size, detector_spacing, "fan", src, det)
            width = probe._detector_width_for_radius(radius)
            n_detector = int(math.ceil(width / probe.detector_spacing - 1e-9
                                       + 2 * abs(finite_number(center_offset, "center_offset"))))
        return cls(shape, angles, n_detector, pixel_size, detector_spacing, "fan", src, det,
                   center_offset=center_offset)

    # -- derived quantities ----------------------------------------------
    @property
    def n_angles(self) -> int:
        return int(self.angles.size)

    @property
    def range_shape(self) -> tuple[int, int]:
        """Sinogram shape ``(n_angles, n_detector)``."""
        return (self.n_angles, self.n_detector)

    @property
    def image_extent(self) -> tuple[float, float]:
        """Physical size of the image along each axis (mm)."""
        return (self.image_shape[0] * self.pixel_size, self.image_shape[1] * self.pixel_size)

    @property
    def image_radius(self) -> float:
        """Radius of the disc circumscribing the image (mm)."""
        return 0.5 * math.hypot(*self.image_extent)

    @property
    def magnification(self) -> float:
        if self.beam == "parallel":
            return 1.0
        return (self.source_origin + self.origin_detector) / self.source_origin

    @property
    def detector_width(self) -> float:
        return self.n_detector * self.detector_spacing

    @property
    def angles_deg(self) -> np.ndarray:
        return np.rad2deg(self.angles)

    def _detector_width_for_radius(self, radius: float) -> float:
        if self.beam == "parallel":
            return 2 * radius
        # flat detector: the rays tangent to the disc hit it at +-(R+d) tan(asin(r/R))
        half_angle = math.asin(min(radius / self.source_origin, 1.0))
        return 2 * (self.source_origin + self.origin_detector) * math.tan(half_angle)

    # -- identity and serialisation ---------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly description, angles in **degrees** (``angles_deg``)."""
        out = {
            "beam": self.beam,
            "image_shape": list(self.image_shape),
            "pixel_size": self.pixel_size,
            "n_detector": self.n_detector,
            "detector_spacing": self.detector_spacing,
            "angles_deg": [float(a) for a in self.angles_deg],
            "center_offset": self.center_offset,
        }
        if any(self.image_offset):
            out["image_offset"] = list(self.image_offset)
        if self.beam == "fan":
            out["source_origin"] = self.source_origin
            out["origin_detector"] = self.origin_detector
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Geometry":
        """Inverse of :meth:`to_dict`; a missing field is an :class:`InputError`."""
        missing = [k for k in ("image_shape", "n_detector", "angles_deg") if k not in d]
        if missing:
            raise InputError("missing from the geometry description", field=missing[0])
        known = {"beam", "image_shape", "pixel_size", "n_detector", "detector_spacing",
                 "angles_deg", "source_origin", "origin_detector", "center_offset",
                 "image_offset"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError("unknown geometry field", field=unknown[0])
        return cls(
            image_shape=tuple(d["image_shape"]),
            angles=np.deg2rad(np.asarray(d["angles_deg"], dtype=np.float64)),
            n_detector=d["n_detector"],
            pixel_size=d.get("pixel_size", 1.0),
            detector_spacing=d.get("detector_spacing"),
            beam=d.get("beam", "parallel"),
            source_origin=d.get("source_origin"),
            origin_detector=d.get("origin_detector"),
            center_offset=d.get("center_offset", 0.0),
            image_offset=tuple(d.get("image_offset", (0.0, 0.0))),
        )

    def _scalar_fields(self) -> str:
        return json.dumps({k: v for k, v in self.to_dict().items() if k != "angles_deg"},
                          sort_keys=True)

    def _compute_fingerprint(self) -> str:
        h = hashlib.sha256(self._scalar_fields().encode())
        # rounded to 1e-9 rad, so that a degrees round trip keeps the cache key
        h.update(np.ascontiguousarray(np.round(self.angles, 9), dtype="<f8").tobytes())
        return h.hexdigest()

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the geometry (angles to 1e-9 rad): a cache key."""
        return self._fingerprint

    def __eq__(self, other) -> bool:
        # angles compare to 1e-12 rad: radians -> degrees -> radians is not bit-exact
        return (isinstance(other, Geometry)
                and other._scalar_fields() == self._scalar_fields()
                and other.angles.shape == self.angles.shape
                and bool(np.allclose(other.angles, self.angles, rtol=0, atol=1e-12)))

    def __hash__(self) -> int:
        return hash((self._scalar_fields(), self.n_angles))

    def __repr__(self) -> str:
        extra = (f", source_origin={self.source_origin:g}, origin_detector="
                 f"{self.origin_detector:g}" if self.beam == "fan" else "")
        if self.center_offset:
            extra += f", center_offset={self.center_offset:g}"
        if any(self.image_offset):
            extra += f", image_offset=({self.image_offset[0]:g}, {self.image_offset[1]:g})"
        return (f"Geometry(beam={self.beam!r}, image_shape={self.image_shape}, "
                f"n_angles={self.n_angles}, n_detector={self.n_detector}, "
                f"pixel_size={self.pixel_size:g}, detector_spacing="
                f"{self.detector_spacing:g}{extra})")


def _as_shape(image_size) -> tuple[int, int]:
    if np.isscalar(image_size):
        return (int(image_size), int(image_size))
    return tuple(int(s) for s in image_size)


def _make_angles(n_angles, angles, angle_range) -> np.ndarray:
    if angles is not None:
        return np.asarray(angles, dtype=np.float64)
    if n_angles is None:
        raise InputError("give n_angles or angles", field="n_angles")
    n = int(n_angles)
    if n < 1 or n != n_angles:
        raise InputError(f"must be a positive integer, got {n_angles!r}", field="n_angles")
    step = float(angle_range) / n
    return (np.arange(n) + 0.5) * step
