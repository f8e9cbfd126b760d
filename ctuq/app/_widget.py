"""The ctuq napari widget: reconstruct a sinogram layer with an uncertainty map.

Layout: a :class:`~qtpy.QtWidgets.QTabWidget` with the tab "CT reconstruction"
(sinogram layer, geometry, preset, advanced options, Run / Cancel / Export,
one progress bar per pipeline stage) and a "Classification benchmark" tab
(:class:`ctuq.app._classify_widget.ClassifyWidget`). Results become layers ``"<name> FBP"``,
``"<name> reconstruction"``, ``"<name> std"`` and, with a known truth,
``"<name> |error|"``; a docked matplotlib figure (:class:`ResultPlot`) shows
the calibration curve and the EM trace.

Threading: :meth:`CtuqWidget.run` starts :func:`ctuq.reconstruct` in a napari
``thread_worker``. Progress events cross to the GUI thread through a Qt
signal (queued connection); Cancel sets a :class:`threading.Event` that the
pipeline's ``cancel`` callable reads, so the pipeline raises
:class:`ctuq.errors.Cancelled` within one DIP iteration or one EM step.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np
from qtpy.QtCore import QEvent, QObject, Qt, Signal
from qtpy.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout,
                            QGridLayout, QGroupBox, QHBoxLayout, QLabel, QProgressBar,
                            QPushButton, QScrollArea, QSpinBox, QTabWidget, QVBoxLayout,
                            QWidget)

from ctuq.app._reader import (ASSUMED, GEOMETRY, GROUND_TRUTH, ROLE, SINOGRAM_META, SUFFIX,
                              result_layers)
from ctuq.app._result_plot import ResultPlot
from ctuq.errors import Cancelled, CtuqError, InputError

log = logging.getLogger(__name__)

#: Stages of :func:`ctuq.reconstruct`, in order, with their progress-bar labels.
STAGES = {"fbp": "FBP", "dip": "DIP + TV fit", "em": "EM (hyperparameters)",
          "predictive": "predictive samples"}


def _unwrap(obj):
    """The object behind napari's ``PublicOnlyProxy`` (plugin widgets get proxies)."""
    return getattr(obj, "__wrapped__", obj)


def grid_of(viewer):
    """The viewer's grid settings: ``viewer.canvas.grid`` (napari >= 0.9) or ``viewer.grid``."""
    canvas = getattr(viewer, "canvas", None)
    grid = getattr(canvas, "grid", None)
    return grid if grid is not None else viewer.grid


def _double_spin(lo: float, hi: float, value: float, decimals: int = 4,
                 special: str | None = None) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(lo, hi)
    box.setDecimals(decimals)
    box.setValue(value)
    if special:
        box.setSpecialValueText(special)
    return box


def _int_spin(lo: int, hi: int, value: int, special: str | None = None) -> QSpinBox:
    box = QSpinBox()
    box.setRange(lo, hi)
    box.setValue(value)
    if special:
        box.setSpecialValueText(special)
    return box


#: Roles of layers that get a colorbar (images with a value scale worth reading).
COLORBAR_ROLES = ("reconstruction", "std", "error", "fbp", "ground_truth")


def style_result_layer(viewer, layer) -> None:
    """Colorbar, panel name and scale bar for a ctuq layer (best effort: napari >= 0.6)."""
    role = getattr(layer, "metadata", {}).get(ROLE)
    if role is None:
        return
    try:
        layer.name_overlay.visible = True  # the layer's name in its grid panel
        if role in COLORBAR_ROLES:
            layer.colorbar.visible = True
        units = getattr(layer, "units", ())
        if units and all(str(u) in ("mm", "millimeter") for u in units[-2:]):
            viewer.scale_bar.visible = True
    except (AttributeError, ValueError) as err:  # an older napari: plain layers
        log.debug("cannot style layer %s: %s", layer.name, err)


class _Relay(QObject):
    """Carries progress events from the worker thread to the GUI thread."""

    progress = Signal(object)


# -- the widget ----------------------------------------------------------------
class CtuqWidget(QWidget):
    """Reconstruct a sinogram layer with :func:`ctuq.reconstruct` and show the uncertainty.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        Injected by napari when the widget is opened from the Plugins menu.

    Attributes
    ----------
    last_result : Result or None
        The result of the last finished run (what Export writes).
    worker : napari worker or None
        The running (or last) reconstruction worker.
    reconstruct_fn : callable
        ``reconstruct(sinogram, config, progress=, cancel=) -> Result``;
        :func:`ctuq.reconstruct` unless replaced.
    """

    def __init__(self, napari_viewer, parent=None):
        super().__init__(parent)
        self.viewer = napari_viewer
        self.last_result = None
        self.last_name: str | None = None
        self.worker = None
        self.reconstruct_fn: Callable | None = None
        self.plot: ResultPlot | None = None
        self._plot_dock = None
        self._cancel_event = threading.Event()
        self._relay = _Relay()
        self._relay.progress.connect(self._on_progress)
        self._file_angles: np.ndarray | None = None
        self._angle_fields_filled: tuple | None = None
        self._busy = False
        self._selected_ref: weakref.ref | None = None
        self._image_shape: tuple | None = None
        self._window_filter_installed = False
        self._build_ui()
        events = self.viewer.layers.events
        events.inserted.connect(self._on_inserted)
        events.removed.connect(self._refresh_layers)
        events.moved.connect(self._refresh_layers)
        for layer in self.viewer.layers:
            layer.events.name.connect(self._refresh_layers)
        self._refresh_layers()

    # -- layout ------------------------------------------------------------
    def _build_ui(self) -> None:
        outer = QVBoxLayout(self)
        outer.setContentsMargins(2, 2, 2, 2)
        self.tabs = QTabWidget()
        outer.addWidget(self.tabs)

        recon = QWidget()
        self.tabs.addTab(recon, "CT reconstruction")
        layout = QVBoxLayout(recon)

        form = QFormLayout()
        self.layer_combo = QComboBox()
        self.layer_combo.currentIndexChanged.connect(self._on_layer_selected)
        form.addRow("Sinogram layer", self.layer_combo)
        self.preset_combo = QComboBox()
        from ctuq.models.unet import PRESETS

        self.preset_combo.addItems(["auto", *sorted(PRESETS)])
        form.addRow("Preset", self.preset_combo)
        layout.addLayout(form)

        self.geometry_box = QGroupBox("Geometry (from the file; editable)")
        g = QFormLayout(self.geometry_box)
        self.beam_combo = QComboBox()
        self.beam_combo.addItems(["parallel", "fan"])
        self.beam_combo.currentTextChanged.connect(self._on_beam_changed)
        self.n_angles_spin = _int_spin(1, 100_000, 180)
        self.angle_first_spin = _double_spin(-3600, 3600, 0.5)
        self.angle_last_spin = _double_spin(-3600, 3600, 179.5)
        self.n_detector_spin = _int_spin(1, 100_000, 256)
        self.detector_spacing_spin = _double_spin(1e-6, 1e6, 1.0, 6)
        self.pixel_size_spin = _double_spin(1e-6, 1e6, 1.0, 6)
        self.image_size_spin = _int_spin(4, 16_384, 256)
        self.source_origin_spin = _double_spin(1e-6, 1e9, 1000.0, 3)
        self.origin_detector_spin = _double_spin(0.0, 1e9, 1000.0, 3)
        self.center_offset_spin = _double_spin(-1e5, 1e5, 0.0, 3)
        self.center_offset_spin.setToolTip("Centre of rotation: the rotation axis projects "
                                           "this many detector pixels right of the detector "
                                           "centre (tomopy's center - n_detector/2)")
        g.addRow("Beam", self.beam_combo)
        g.addRow("Angles", self.n_angles_spin)
        g.addRow("First angle (°)", self.angle_first_spin)
        g.addRow("Last angle (°)", self.angle_last_spin)
        g.addRow("Detector pixels", self.n_detector_spin)
        g.addRow("Detector spacing (mm)", self.detector_spacing_spin)
        g.addRow("Pixel size (mm)", self.pixel_size_spin)
        g.addRow("Image size (px)", self.image_size_spin)
        g.addRow("Source–axis (mm)", self.source_origin_spin)
        g.addRow("Axis–detector (mm)", self.origin_detector_spin)
        g.addRow("Centre offset (px)", self.center_offset_spin)
        layout.addWidget(self.geometry_box)

        self.advanced_toggle = QCheckBox("Advanced options")
        layout.addWidget(self.advanced_toggle)
        self.advanced_box = QGroupBox()
        a = QFormLayout(self.advanced_box)
        self.iterations_spin = _int_spin(0, 1_000_000, 0, "preset default")
        self.tv_weight_spin = _double_spin(0.0, 1e6, 0.0, 5, "auto (from the noise)")
        self.n_samples_spin = _int_spin(0, 10_000, 0, "preset default")
        self.em_steps_spin = _int_spin(0, 1000, 0, "preset default")
        self.predictive_spin = _int_spin(0, 100_000, 0, "preset default")
        self.predcp_spin = _double_spin(0.0, 1e4, 1.0, 3, "0 (PredCP off)")
        self.seed_spin = _int_spin(0, 2**31 - 1, 0)
        self.device_combo = QComboBox()
        self.device_combo.addItems(self._devices())
        a.addRow("DIP iterations", self.iterations_spin)
        a.addRow("TV weight", self.tv_weight_spin)
        a.addRow("Samples per EM step", self.n_samples_spin)
        a.addRow("EM steps", self.em_steps_spin)
        a.addRow("Predictive samples", self.predictive_spin)
        a.addRow("PredCP scale", self.predcp_spin)
        a.addRow("Seed", self.seed_spin)
        a.addRow("Device", self.device_combo)
        self.advanced_box.setVisible(False)
        self.advanced_toggle.toggled.connect(self.advanced_box.setVisible)
        layout.addWidget(self.advanced_box)

        self.grid_check = QCheckBox("Show results side by side (grid)")
        self.grid_check.setChecked(True)
        layout.addWidget(self.grid_check)

        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run")
        self.cancel_button = QPushButton("Cancel")
        self.export_button = QPushButton("Export…")
        self.run_button.clicked.connect(lambda: self.run())
        self.cancel_button.clicked.connect(self.cancel)
        self.export_button.clicked.connect(self._export_dialog)
        self.cancel_button.setEnabled(False)
        self.export_button.setEnabled(False)
        for b in (self.run_button, self.cancel_button, self.export_button):
            buttons.addWidget(b)
        layout.addLayout(buttons)

        self.progress_box = QGroupBox("Progress")
        self._progress_grid = QGridLayout(self.progress_box)
        self.progress_bars: dict[str, QProgressBar] = {}
        self._progress_labels: dict[str, QLabel] = {}
        for key, label in STAGES.items():
            self._progress_bar(key, label)
        layout.addWidget(self.progress_box)
        self.status_label = QLabel("Pick a sinogram layer and press Run.")
        self.status_label.setWordWrap(True)
        layout.addWidget(self.status_label)
        self.metrics_label = QLabel("")
        self.metrics_label.setWordWrap(True)
        self.metrics_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        layout.addWidget(self.metrics_label)
        layout.addStretch(1)

        from ctuq.app._classify_widget import ClassifyWidget

        self.classify_widget = ClassifyWidget(self.viewer)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.classify_widget)
        self.tabs.addTab(scroll, "Classification benchmark")
        self._form_widgets = [self.layer_combo, self.preset_combo, self.geometry_box,
                              self.advanced_box]
        self._on_beam_changed(self.beam_combo.currentText())

    def set_classification_widget(self, widget: QWidget) -> None:
        """Replace the "Classification benchmark" placeholder tab with ``widget``."""
        index = self.tabs.count() - 1
        self.tabs.removeTab(index)
        self.tabs.insertTab(index, widget, "Classification benchmark")

    def _progress_bar(self, key: str, label: str) -> QProgressBar:
        row = len(self.progress_bars)
        lab = QLabel(label)
        bar = QProgressBar()
        bar.setRange(0, 1)
        bar.setValue(0)
        bar.setFormat("%v / %m")
        self._progress_grid.addWidget(lab, row, 0)
        self._progress_grid.addWidget(bar, row, 1)
        self.progress_bars[key] = bar
        self._progress_labels[key] = lab
        return bar

    @staticmethod
    def _devices() -> list[str]:
        devices = ["auto", "cpu"]
        try:
            import torch

            if torch.cuda.is_available():
                devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        except Exception:  # noqa: BLE001 - no torch CUDA runtime: CPU only
            pass
        return devices

    # -- layers and geometry --------------------------------------------------
    def _candidate_layers(self) -> list:
        from napari.layers import Image

        layers = [lay for lay in self.viewer.layers
                  if isinstance(lay, Image) and lay.ndim in (2, 3) and not lay.rgb]
        ours = [lay for lay in layers if lay.metadata.get(ROLE) == "sinogram"]
        others = [lay for lay in layers if lay.metadata.get(ROLE) is None]
        return ours + others

    def _on_inserted(self, event) -> None:
        event.value.events.name.connect(self._refresh_layers)
        style_result_layer(self.viewer, event.value)
        self._refresh_layers()

    def _refresh_layers(self, event=None) -> None:
        # keep the same layer selected, under its new name if it was renamed
        previous = self._selected_ref() if self._selected_ref is not None else None
        layers = self._candidate_layers()
        ids = [id(_unwrap(lay)) for lay in layers]
        self.layer_combo.blockSignals(True)
        self.layer_combo.clear()
        self.layer_combo.addItems([lay.name for lay in layers])
        if previous is not None and id(previous) in ids:
            self.layer_combo.setCurrentIndex(ids.index(id(previous)))
        self.layer_combo.blockSignals(False)
        if _unwrap(self.selected_layer()) is not previous:
            self._on_layer_selected()

    def selected_layer(self):
        """The sinogram layer picked in the combo box (None if there is none)."""
        name = self.layer_combo.currentText()
        return self.viewer.layers[name] if name and name in self.viewer.layers else None

    def _on_layer_selected(self, *_):
        layer = self.selected_layer()
        self._selected_ref = None if layer is None else weakref.ref(_unwrap(layer))
        if layer is not None:
            self.fill_geometry(layer)

    def fill_geometry(self, layer) -> None:
        """Fill the geometry fields from ``layer.metadata['geometry']`` (else its shape)."""
        from ctuq.data.geometry import Geometry

        n_angles, n_det = layer.data.shape[-2:]
        geom = layer.metadata.get(GEOMETRY)
        try:
            g = Geometry.from_dict(geom) if geom else Geometry.parallel(
                n_det, n_angles, n_detector=n_det)
        except InputError as err:
            log.warning("layer %s: unusable geometry metadata (%s); using defaults",
                        layer.name, err)
            g = Geometry.parallel(n_det, n_angles, n_detector=n_det)
        self.beam_combo.setCurrentText(g.beam)
        self.n_angles_spin.setValue(g.n_angles)
        deg = g.angles_deg
        self.angle_first_spin.setValue(float(deg[0]))
        self.angle_last_spin.setValue(float(deg[-1]))
        self.n_detector_spin.setValue(g.n_detector)
        self.detector_spacing_spin.setValue(g.detector_spacing)
        self.pixel_size_spin.setValue(g.pixel_size)
        self.image_size_spin.setValue(int(max(g.image_shape)))
        if g.beam == "fan":
            self.source_origin_spin.setValue(g.source_origin)
            self.origin_detector_spin.setValue(g.origin_detector)
        self.center_offset_spin.setValue(g.center_offset)
        self._image_offset = tuple(g.image_offset)
        self._image_shape = tuple(g.image_shape)
        self._file_angles = np.asarray(deg, dtype=np.float64)
        self._angle_fields_filled = self._angle_fields()
        self.status_label.setText(
            f"{layer.name}: {'assumed' if layer.metadata.get(ASSUMED) else 'file'} geometry, "
            f"{g.n_angles} angles × {g.n_detector} detector pixels → "
            f"{g.image_shape[0]}×{g.image_shape[1]} image"
            + (" (check the angles!)" if layer.metadata.get(ASSUMED) else ""))

    def _angle_fields(self) -> tuple:
        return (self.n_angles_spin.value(), self.angle_first_spin.value(),
                self.angle_last_spin.value())

    def _on_beam_changed(self, beam: str) -> None:
        fan = beam == "fan"
        self.source_origin_spin.setEnabled(fan)
        self.origin_detector_spin.setEnabled(fan)

    def geometry(self):
        """The :class:`~ctuq.data.geometry.Geometry` described by the fields.

        The file's exact angles are kept while the three angle fields are as
        filled from the file; otherwise the angles are equispaced from the
        first to the last angle.
        """
        from ctuq.data.geometry import Geometry

        if self._file_angles is not None and self._angle_fields() == self._angle_fields_filled:
            angles_deg = self._file_angles
        else:
            n, first, last = self._angle_fields()
            angles_deg = np.linspace(first, last, n) if n > 1 else np.array([first])
        size = self.image_size_spin.value()
        shape = self._image_shape or (size, size)
        if max(shape) != size:
            shape = (size, size)
        d = {"beam": self.beam_combo.currentText(), "image_shape": list(shape),
             "pixel_size": self.pixel_size_spin.value(),
             "n_detector": self.n_detector_spin.value(),
             "detector_spacing": self.detector_spacing_spin.value(),
             "angles_deg": [float(a) for a in angles_deg],
             "center_offset": self.center_offset_spin.value()}
        if any(getattr(self, "_image_offset", (0.0, 0.0))) and max(shape) == max(
                self._image_shape or shape):
            d["image_offset"] = list(self._image_offset)
        if d["beam"] == "fan":
            d["source_origin"] = self.source_origin_spin.value()
            d["origin_detector"] = self.origin_detector_spin.value()
        return Geometry.from_dict(d)

    def sinogram(self):
        """The :class:`~ctuq.data.io.Sinogram` of the selected layer with the field geometry.

        Raises
        ------
        InputError
            No layer selected, or data and geometry do not fit together.
        """
        from ctuq.data.io import Sinogram

        layer = self.selected_layer()
        if layer is None:
            raise InputError("no sinogram layer: open a sinogram file or a sample first",
                             field="sinogram layer")
        geometry = self.geometry()
        meta = dict(layer.metadata.get(SINOGRAM_META) or {})
        meta.setdefault("source", f"napari layer {layer.name}")
        truth = layer.metadata.get(GROUND_TRUTH)
        data = np.asarray(layer.data)
        if truth is not None:
            want = (data.shape[:-2] + tuple(geometry.image_shape))
            if np.shape(truth) != want:
                log.warning("ground truth %s does not fit the image shape %s: dropped",
                            np.shape(truth), want)
                truth = None
        return Sinogram(data, geometry, meta, ground_truth=truth)

    def config(self):
        """The :class:`~ctuq.recon.config.ReconstructionConfig` of the fields."""
        from ctuq.recon.config import ReconstructionConfig

        dip: dict[str, Any] = {}
        unc: dict[str, Any] = {}
        if self.iterations_spin.value() > 0:
            dip["iterations"] = self.iterations_spin.value()
        if self.tv_weight_spin.value() > 0:
            dip["tv_weight"] = self.tv_weight_spin.value()
        if self.n_samples_spin.value() > 0:
            unc["n_samples"] = self.n_samples_spin.value()
        if self.em_steps_spin.value() > 0:
            unc["em_steps"] = self.em_steps_spin.value()
        if self.predictive_spin.value() > 0:
            unc["predictive_samples"] = self.predictive_spin.value()
        scale = self.predcp_spin.value()
        if scale > 0:
            unc["predcp_scale"] = scale
        else:
            unc["predcp"] = False
        return ReconstructionConfig(preset=self.preset_combo.currentText(),
                                    device=self.device_combo.currentText(),
                                    seed=self.seed_spin.value(), dip=dip, uncertainty=unc)

    # -- running -----------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """True from :meth:`run` until the worker has finished (and the UI is re-enabled)."""
        return self._busy

    def run(self):
        """Start a reconstruction of the selected layer in a worker thread.

        Returns
        -------
        worker or None
            The started napari ``FunctionWorker`` (None, after an error
            notification, when the inputs are invalid or a run is going on).
        """
        from napari.qt.threading import thread_worker
        from napari.utils.notifications import show_error

        if self.is_running:
            show_error("ctuq: a reconstruction is already running")
            return None
        try:
            sinogram = self.sinogram()
            config = self.config()
        except InputError as err:
            show_error(f"ctuq: {err}")
            self.status_label.setText(f"Error: {err}")
            return None
        name = self.layer_combo.currentText()
        reconstruct = self.reconstruct_fn
        if reconstruct is None:
            import ctuq

            reconstruct = ctuq.reconstruct
        self._cancel_event.clear()
        cancel_event, relay = self._cancel_event, self._relay

        last = {"t": 0.0, "stage": None}

        def progress(stage, step, total, message=""):
            # every DIP iteration reports; the GUI needs at most 10 updates a second
            now = time.monotonic()
            if stage == last["stage"] and 0 < step < total and now - last["t"] < 0.1:
                return
            last.update(t=now, stage=stage)
            relay.progress.emit((stage, int(step), int(total), str(message)))

        def job():
            # expected outcomes are returned, not raised: napari would show a traceback
            try:
                return "ok", reconstruct(sinogram, config, progress=progress,
                                         cancel=cancel_event.is_set)
            except Cancelled:
                return "cancelled", None
            except CtuqError as err:
                return "error", str(err)

        self._reset_progress()
        worker = thread_worker(job, start_thread=False)()
        worker.returned.connect(lambda out: self._on_returned(out, name))
        worker.errored.connect(self._on_errored)
        worker.finished.connect(self._on_finished)
        self.worker = worker
        self._set_busy(True)
        self.status_label.setText(f"Reconstructing {name}…")
        log.info("reconstructing layer %s (%s)", name, sinogram)
        worker.start()
        return worker

    def cancel(self) -> None:
        """Ask the running reconstruction to stop (it ends within one step)."""
        if self.is_running:
            self._cancel_event.set()
            self.cancel_button.setEnabled(False)
            self.status_label.setText("Cancelling…")

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.run_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)
        self.export_button.setEnabled(not busy and self.last_result is not None)
        for w in self._form_widgets:
            w.setEnabled(not busy)

    def _reset_progress(self) -> None:
        for bar in self.progress_bars.values():
            bar.setRange(0, 1)
            bar.setValue(0)

    def _on_progress(self, event) -> None:
        stage, step, total, message = event
        base, _, rest = stage.partition(" [")
        key = base.split("/")[0].split(":")[0].strip() or "other"
        bar = self.progress_bars.get(key) or self._progress_bar(key, key)
        if rest:
            self._progress_labels[key].setText(f"{STAGES.get(key, key)} [{rest}")
        bar.setRange(0, max(int(total), 1))
        bar.setValue(min(max(int(step), 0), max(int(total), 1)))
        self.status_label.setText(f"{stage}: {step}/{total}" + (f" — {message}" if message
                                                                 else ""))

    def _on_returned(self, out, name: str) -> None:
        from napari.utils.notifications import show_error, show_info

        status, value = out
        if status == "cancelled":
            self.status_label.setText("Cancelled.")
            show_info("ctuq: reconstruction cancelled")
        elif status == "error":
            self.status_label.setText(f"Error: {value}")
            show_error(f"ctuq: {value}")
        else:
            self.show_result(value, name)

    def _on_errored(self, exc) -> None:
        # napari already shows the exception as a notification
        log.error("reconstruction failed: %s: %s", type(exc).__name__, exc)
        self.status_label.setText(f"Failed: {type(exc).__name__}: {exc}")

    def _on_finished(self) -> None:
        self._set_busy(False)

    # -- results ----------------------------------------------------------
    def show_result(self, result, name: str) -> None:
        """Add (or update) the result layers of ``result`` and dock the plot."""
        self.last_result, self.last_name = result, name
        for data, kwargs, _ in result_layers(result, name):
            if kwargs["metadata"][ROLE] == "ground_truth" and any(
                    lay.metadata.get(ROLE) == "ground_truth" and lay.name.startswith(name)
                    for lay in self.viewer.layers):
                continue  # the truth is already shown (it came with the sinogram)
            self._set_layer(data, kwargs)
        if self.grid_check.isChecked():
            grid_of(self.viewer).enabled = True
        rec_name = f"{name} {SUFFIX['reconstruction']}"
        if rec_name in self.viewer.layers:
            self.viewer.layers.selection.active = self.viewer.layers[rec_name]
        self.viewer.reset_view()
        self._show_plot(result)
        shown, full = self._metrics_text(result)
        self.metrics_label.setText(shown)
        self.metrics_label.setToolTip(full)
        self.status_label.setText(f"Done: {name}.")
        self.export_button.setEnabled(True)

    def _set_layer(self, data, kwargs) -> None:
        name = kwargs["name"]
        if name in self.viewer.layers:
            layer = self.viewer.layers[name]
            layer.data = data
            layer.metadata = kwargs["metadata"]
            layer.contrast_limits_range = kwargs["contrast_limits"]
            layer.contrast_limits = kwargs["contrast_limits"]
            layer.colormap = kwargs["colormap"]
            for key in ("scale", "translate", "units"):
                if key in kwargs:
                    setattr(layer, key, kwargs[key])
            style_result_layer(self.viewer, layer)
        else:
            self.viewer.add_image(data, **kwargs)

    #: Metrics shown under the buttons (all of them are in the label's tooltip).
    SHOWN_METRICS = (("psnr", "PSNR {:.2f} dB"), ("psnr_fbp", "(FBP {:.2f} dB)"),
                     ("ssim", "SSIM {:.3f}"), ("coverage_1sigma", "coverage ±1σ {:.0%}"),
                     ("coverage_2sigma", "±2σ {:.0%}"),
                     ("spearman_std_abs_error", "Spearman(std, |error|) {:.2f}"))

    @classmethod
    def _metrics_text(cls, result) -> tuple[str, str]:
        m = result.metrics
        shown = " · ".join(fmt.format(m[key]) for key, fmt in cls.SHOWN_METRICS if key in m)
        full = "\n".join(f"{k}: {v:.6g}" for k, v in sorted(m.items()))
        return shown, full

    def _show_plot(self, result) -> None:
        if self.plot is None:
            self.plot = ResultPlot(theme=getattr(self.viewer, "theme", None))
            self._plot_dock = self.viewer.window.add_dock_widget(
                self.plot, name="ctuq: calibration and EM trace", area="bottom")
        self.plot.show_result(result)

    # -- export -------------------------------------------------------------
    def export(self, path, overwrite: bool = True) -> Path:
        """Write the last result to ``path`` as a ctuq result file.

        Raises
        ------
        InputError
            No result yet, or the file cannot be written.
        """
        from ctuq.data.io import write_result

        if self.last_result is None:
            raise InputError("nothing to export: run a reconstruction first", field="export")
        out = write_result(path, self.last_result, overwrite=overwrite)
        log.info("exported %s", out)
        return out

    def _export_dialog(self) -> None:
        from napari.utils.notifications import show_error, show_info

        default = f"{self.last_name or 'result'}_ctuq.h5"
        path, _ = QFileDialog.getSaveFileName(self, "Export ctuq result", default,
                                              "ctuq result (*.h5 *.nxs)")
        if not path:
            return
        try:
            out = self.export(path, overwrite=True)  # the dialog asked about replacing
        except InputError as err:
            show_error(f"ctuq: {err}")
            return
        show_info(f"ctuq: wrote {out}")

    # -- closing -----------------------------------------------------------
    def showEvent(self, event) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        window = self.window()
        if not self._window_filter_installed and window is not self:
            window.installEventFilter(self)
            self._window_filter_installed = True

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt API
        # closing the main window cancels a running job, so that napari does not
        # wait for a long reconstruction to finish before it quits
        if event.type() == QEvent.Close:
            self._cancel_event.set()
        return False
