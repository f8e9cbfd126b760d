"""Geometry and read options: one set of names for the CLI, TOML, the API,
sidecar files and napari.

:class:`GeometryOptions` says what a user knows about the acquisition (any
subset; the rest comes from the file or from documented defaults), and
:class:`ReadOptions` how to read the file. Both validate themselves through
:mod:`ctuq.fields`, so a bad value is the same clear error whichever way it
came in. TOML::

    [geometry]
    image_size = 128            # pixels (or [rows, columns])
    pixel_size = 0.1            # mm
    angle_first = 0.0           # with angle_last: equispaced, both ends included; their
    angle_last = 179.0          # count is n_angles if given, else the data's rows
    angle_unit = "deg"          # deg | rad (also for file angles without a units attribute)
    center_offset = 1.5         # detector pixels (tomopy's center - n_detector/2)

    [read]
    dataset = "/entry/data/data"
    raw = true                  # intensities: -log(I / I0) with flats/darks
    convention = "astra"        # astra (= tomopy, NXtomo, DXchange) | skimage
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctuq.data.conventions import CONVENTIONS
from ctuq.data.io._common import angle_unit_name
from ctuq.errors import InputError
from ctuq.fields import build, setting, specs, validate

#: Formats accepted by ``format=``.
FORMATS = ("nxtomo", "dxchange", "hdf5", "npy", "npz", "tiff")


def _unit(value: str) -> str:
    try:
        return angle_unit_name(value)
    except InputError as exc:
        raise ValueError(exc.message) from None


@dataclass(frozen=True)
class GeometryOptions:
    """What the user says about the acquisition geometry (every field optional).

    A field given here and also by the file (or its sidecar) must agree with
    it; fields nobody gives get the defaults of
    :func:`ctuq.data.io._resolve.resolve`.
    """

    image_size: Any = setting(None, kind=int, pair=True, minimum=2, maximum=65536, unit="px",
                              doc="Reconstructed image side in pixels, or [rows, columns].")
    pixel_size: float | None = setting(None, kind=float, greater_than=0, maximum=1e6,
                                       unit="mm", doc="Side of one image pixel.")
    detector_spacing: float | None = setting(None, kind=float, greater_than=0, maximum=1e6,
                                             unit="mm",
                                             doc="Distance between detector pixel centres.")
    n_detector: int | None = setting(None, kind=int, minimum=1, maximum=10**6,
                                     doc="Detector pixels (checked against the data).")
    beam: str | None = setting(None, kind=str, choices=("parallel", "fan"),
                               doc="Beam shape: parallel or fan (flat detector).")
    source_origin: float | None = setting(None, kind=float, greater_than=0, maximum=1e9,
                                          unit="mm",
                                          doc="Fan beam: source to rotation axis distance.")
    origin_detector: float | None = setting(None, kind=float, minimum=0, maximum=1e9,
                                            unit="mm",
                                            doc="Fan beam: rotation axis to detector distance.")
    angles: list | None = setting(None, kind=list, item=float,
                                  doc="Projection angles, one per data row (angle_unit).")
    angle_first: float | None = setting(None, kind=float,
                                        doc="First of equispaced angles, both ends included "
                                            "(angle_unit); as many as the data's rows.")
    angle_last: float | None = setting(None, kind=float,
                                       doc="Last of equispaced angles (angle_unit).")
    n_angles: int | None = setting(None, kind=int, minimum=1, maximum=10**6,
                                   doc="Number of angles (checked against the data's rows). "
                                       "Alone: N angles i*180/N deg, i = 0..N-1 (0 included, "
                                       "180 not: scikit-image's and tomopy's angles); fan "
                                       "beam i*360/N deg.")
    angle_unit: str | None = setting(None, kind=str, check=_unit,
                                     doc="deg or rad: unit of the angles given here and of "
                                         "file angles without a units attribute.")
    center_offset: float | str | None = setting(
        None, kind=float, minimum=-1e6, maximum=1e6, unit="detector px",
        doc="Centre of rotation: the axis projects this many pixels right of the detector "
            "centre; 'auto': estimated from the data (parallel beam).")

    def __post_init__(self):
        auto = is_auto(self.center_offset)
        if auto:  # "auto" is not a number: checked apart, kept as the word
            object.__setattr__(self, "center_offset", None)
        validate(self, prefix="geometry")
        if auto:
            object.__setattr__(self, "center_offset", AUTO)
        ends = (self.angle_first is None, self.angle_last is None)
        if ends[0] != ends[1]:
            raise InputError("give angle_first and angle_last together",
                             field="geometry.angle_last" if ends[1] else "geometry.angle_first")
        if self.angle_first is not None:
            if self.angles is not None:
                raise InputError("give either angles or angle_first/angle_last/n_angles",
                                 field="geometry.angles")
            if self.n_angles is not None and self.n_angles > 1 and \
                    self.angle_first == self.angle_last:
                raise InputError("angle_first equals angle_last: every angle the same",
                                 field="geometry.angle_last")
        if self.angles is not None and self.n_angles is not None and \
                len(self.angles) != self.n_angles:
            raise InputError(f"n_angles={self.n_angles} but {len(self.angles)} angles are "
                             "given", field="geometry.n_angles")

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "geometry") -> "GeometryOptions":
        return build(cls, {k: v for k, v in d.items() if v is not None}, prefix)

    def to_dict(self) -> dict:
        """The fields that are set (JSON-able)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def angles_rad(self) -> np.ndarray | None:
        """The angles given (explicit, or first/last/count), in radians; None if none
        (also for angle_first/angle_last without n_angles: see :meth:`angle_ends_rad`)."""
        if self.angles is not None:
            a = np.asarray(self.angles, dtype=np.float64)
        elif self.angle_first is not None and self.n_angles is not None:
            a = np.linspace(self.angle_first, self.angle_last, self.n_angles)
        else:
            return None
        return np.deg2rad(a) if (self.angle_unit or "deg") == "deg" else a

    def angle_ends_rad(self) -> tuple[float, float] | None:
        """``(angle_first, angle_last)`` in radians when they are given without
        ``n_angles`` (the count is then the data's rows); else None."""
        if self.angle_first is None or self.n_angles is not None:
            return None
        ends = np.array([self.angle_first, self.angle_last], dtype=np.float64)
        if (self.angle_unit or "deg") == "deg":
            ends = np.deg2rad(ends)
        return float(ends[0]), float(ends[1])


@dataclass(frozen=True)
class ReadOptions:
    """How to read a sinogram file."""

    dataset: str | None = setting(None, kind=str,
                                  doc="HDF5 dataset (or NXtomo entry) / npz key of the "
                                      "sinogram.")
    raw: bool | None = setting(None, kind=bool,
                               doc="true: raw intensities (-log with flats/darks); false: "
                                   "line integrals; default: as the file says.")
    format: str | None = setting(None, kind=str, choices=FORMATS,
                                 doc="Insist on one format.")
    convention: str = setting("astra", kind=str, choices=CONVENTIONS,
                              doc="astra (= tomopy, NXtomo, DXchange) or skimage (radon's "
                                  "[detector, angle] layout and centre).")
    max_memory_gib: float | None = setting(None, kind=float, greater_than=0, maximum=1e6,
                                           unit="GiB",
                                           doc="Memory budget of a read and of the image "
                                               "(default: half the physical memory).")
    allow_external: bool = setting(False, kind=bool,
                                   doc="Follow HDF5 external links / external storage.")
    isolate: bool = setting(True, kind=bool,
                            doc="Read each file in a child process (a crashing or hanging "
                                "HDF5 library cannot take the caller down).")
    read_timeout: float | None = setting(None, kind=float, greater_than=0, maximum=1e6,
                                         unit="s", doc="Time limit of an isolated read "
                                         "(default: 30 s + 1 s per 20 MB of file).")

    def __post_init__(self):
        validate(self, prefix="read")

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "read") -> "ReadOptions":
        return build(cls, dict(d), prefix)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def max_bytes(self) -> int:
        """The budget in bytes (0: the default, half the physical memory)."""
        return 0 if self.max_memory_gib is None else int(self.max_memory_gib * 1024**3)

    def reader_kwargs(self) -> dict:
        """Keyword arguments of :func:`ctuq.data.io.read_sinogram`."""
        return {"dataset": self.dataset, "raw": self.raw, "format": self.format,
                "convention": self.convention, "max_memory_gib": self.max_memory_gib,
                "allow_external": self.allow_external}


#: ``center_offset = "auto"``: the centre of rotation estimated from the data
#: (:func:`ctuq.data.center.estimate_center_offset`, in the pipeline).
AUTO = "auto"
#: Geometry options that take :data:`AUTO` as well as a number.
AUTO_OPTIONS = ("center_offset",)


def is_auto(value) -> bool:
    """``value`` is the word ``auto`` (any case, surrounding blanks ignored)."""
    return isinstance(value, str) and value.strip().lower() == AUTO


def without_auto(options: dict) -> tuple[dict, bool]:
    """``options`` less a ``center_offset = "auto"``, and whether it was there."""
    if is_auto(options.get("center_offset")):
        return {k: v for k, v in options.items() if k != "center_offset"}, True
    return dict(options), False


#: Names of the geometry options (``read_sinogram(**geometry_options)``).
GEOMETRY_OPTION_NAMES = tuple(specs(GeometryOptions))
#: Names of the read options.
READ_OPTION_NAMES = tuple(specs(ReadOptions))
