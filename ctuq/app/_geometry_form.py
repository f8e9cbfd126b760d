"""The geometry box of the napari widget: geometry options filled from a layer, editable.

The rows are the :class:`~ctuq.data.io.options.GeometryOptions` fields
(:class:`~ctuq.app._settings_form.SettingsForm`: their ranges, choices and help
texts), angles in degrees, lengths in mm. :meth:`GeometryForm.fill` sets them
from a layer's ``metadata['geometry']`` (else from its shape);
:meth:`GeometryForm.geometry` turns them back into a
:class:`~ctuq.data.geometry.Geometry`, keeping the file's exact angles while the
three angle fields are as filled.
"""

from __future__ import annotations

import logging

import numpy as np
from qtpy.QtWidgets import QGroupBox, QVBoxLayout

from ctuq.app._reader import GEOMETRY
from ctuq.app._settings_form import SettingsForm
from ctuq.errors import InputError

log = logging.getLogger(__name__)

#: The geometry fields shown, with their row labels (the widget's units).
FIELDS = {"beam": "Beam", "n_angles": "Angles", "angle_first": "First angle (°)",
          "angle_last": "Last angle (°)", "n_detector": "Detector pixels",
          "detector_spacing": "Detector spacing (mm)", "pixel_size": "Pixel size (mm)",
          "image_size": "Image size (px)", "source_origin": "Source–axis (mm)",
          "origin_detector": "Axis–detector (mm)", "center_offset": "Centre offset (px)"}
#: What the fields hold before a layer fills them.
START = dict(beam="parallel", n_angles=180, angle_first=0.0, angle_last=179.0, n_detector=256,
             detector_spacing=1.0, pixel_size=1.0, image_size=256, source_origin=1000.0,
             origin_detector=1000.0, center_offset=0.0)
#: Decimals shown (and kept) per float field: µm for sizes, 1e-4° for angles.
DECIMALS = dict(angle_first=4, angle_last=4, detector_spacing=6, pixel_size=6, source_origin=3,
                origin_detector=3, center_offset=3)
#: Fields that only a fan beam uses (disabled for a parallel beam).
FAN_ONLY = ("source_origin", "origin_detector")


class GeometryForm(QGroupBox):
    """The acquisition geometry as editable fields.

    Attributes
    ----------
    form : SettingsForm
        The generated rows; ``fields`` is ``form.widgets`` (name -> magicgui widget).
    """

    def __init__(self, parent=None):
        super().__init__("Geometry (from the file; editable)", parent)
        from ctuq.data.io.options import GeometryOptions

        self.form = SettingsForm(GeometryOptions, list(FIELDS), prefix="geometry", labels=FIELDS,
                                 defaults=START, decimals=DECIMALS, allow_auto=False)
        self.fields = self.form.widgets
        layout = QVBoxLayout(self)
        layout.addWidget(self.form.native)
        self._file_angles: np.ndarray | None = None
        self._filled_angles: tuple | None = None
        self._image_shape: tuple | None = None
        self._image_offset: tuple = (0.0, 0.0)
        self.fields["beam"].changed.connect(self._on_beam)
        self._on_beam(self.fields["beam"].value)

    def _on_beam(self, beam: str) -> None:
        for name in FAN_ONLY:
            self.fields[name].enabled = beam == "fan"

    def angle_fields(self) -> tuple:
        """``(n_angles, first, last)`` as the fields hold them."""
        return tuple(self.fields[n].value for n in ("n_angles", "angle_first", "angle_last"))

    def image_shape(self) -> tuple:
        """The image shape: the file's while its larger side is the image-size field."""
        size = self.fields["image_size"].value
        shape = self._image_shape or (size, size)
        return shape if max(shape) == size else (size, size)

    def fill(self, layer):
        """Set the fields from ``layer.metadata['geometry']`` (else its shape); the Geometry."""
        from ctuq.data.geometry import Geometry

        n_angles, n_det = layer.data.shape[-2:]
        geom = layer.metadata.get(GEOMETRY)
        # no geometry: i * 180 / n degrees from 0, as the readers assume for bare arrays
        from_zero = np.arange(n_angles) * (np.pi / n_angles)
        try:
            g = Geometry.from_dict(geom) if geom else Geometry.parallel(
                n_det, angles=from_zero, n_detector=n_det)
        except InputError as err:
            log.warning("layer %s: unusable geometry metadata (%s); using defaults",
                        layer.name, err)
            g = Geometry.parallel(n_det, angles=from_zero, n_detector=n_det)
        deg = g.angles_deg
        # the shape first: a change of the image-size field reads it
        self._image_shape = tuple(g.image_shape)
        self._image_offset = tuple(g.image_offset)
        values = dict(beam=g.beam, n_angles=g.n_angles, angle_first=float(deg[0]),
                      angle_last=float(deg[-1]), n_detector=g.n_detector,
                      detector_spacing=g.detector_spacing, pixel_size=g.pixel_size,
                      image_size=int(max(g.image_shape)), center_offset=g.center_offset)
        if g.beam == "fan":
            values.update(source_origin=g.source_origin, origin_detector=g.origin_detector)
        self.form.set_values(values, clip=True)
        self._file_angles = np.asarray(deg, dtype=np.float64)
        self._filled_angles = self.angle_fields()
        return g

    def geometry(self):
        """The :class:`~ctuq.data.geometry.Geometry` described by the fields.

        The file's exact angles are kept while the three angle fields are as
        filled from the file; otherwise the angles are equispaced from the
        first to the last angle.
        """
        from ctuq.data.geometry import Geometry

        v = self.form.values()
        if self._file_angles is not None and self.angle_fields() == self._filled_angles:
            angles_deg = self._file_angles
        else:
            n, first, last = self.angle_fields()
            angles_deg = np.linspace(first, last, n) if n > 1 else np.array([first])
        shape = self.image_shape()
        d = {"beam": v["beam"], "image_shape": list(shape), "pixel_size": v["pixel_size"],
             "n_detector": v["n_detector"], "detector_spacing": v["detector_spacing"],
             "angles_deg": [float(a) for a in angles_deg], "center_offset": v["center_offset"]}
        if any(self._image_offset) and max(shape) == max(self._image_shape or shape):
            d["image_offset"] = list(self._image_offset)
        if d["beam"] == "fan":
            d["source_origin"] = v["source_origin"]
            d["origin_detector"] = v["origin_detector"]
        return Geometry.from_dict(d)
