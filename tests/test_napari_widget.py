"""The ctuq napari widget in a real viewer (under Xvfb): layout and geometry
fields, a tiny reconstruction end to end, Cancel, invalid settings, export,
and ``ctuq gui``."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

pytest.importorskip("qtpy")  # a headless machine without Qt (a GPU box) still collects the rest
from ctuq.app._widget import grid_of  # noqa: E402
from ctuq.data.geometry import Geometry  # noqa: E402
from ctuq.data.io import read_result  # noqa: E402

pytestmark = [
    pytest.mark.gui,
    pytest.mark.skipif(not os.environ.get("DISPLAY") or
                       os.environ.get("QT_QPA_PLATFORM") == "offscreen",
                       reason="napari needs an X display (run under xvfb-run)"),
]


def _notifications():
    from napari.utils.notifications import notification_manager

    return notification_manager.records


@pytest.fixture
def viewer_widget(make_napari_viewer, qtbot):
    """A viewer with the digit sample (28², 20 angles) and the docked ctuq widget."""
    viewer = make_napari_viewer()
    _, widget = viewer.window.add_plugin_dock_widget("ctuq", "CT reconstruction")
    viewer.open_sample("ctuq", "digit")
    yield viewer, widget
    if widget.is_running:  # never leave a worker behind
        widget.cancel()
        qtbot.waitUntil(lambda: not widget.is_running, timeout=30_000)


def _tiny(widget, iterations=20):
    widget.advanced_toggle.setChecked(True)
    widget.setting("dip.iterations").value = iterations
    widget.setting("uncertainty.em_steps").value = 1
    widget.setting("uncertainty.n_samples").value = 2
    widget.setting("uncertainty.predictive_samples").value = 4


def _geo(widget, name):
    """The value of a geometry field."""
    return widget.geometry_box.fields[name].value


def _set_geo(widget, **values):
    for name, value in values.items():
        widget.geometry_box.fields[name].value = value


def test_layout_and_geometry_fields(viewer_widget):
    viewer, w = viewer_widget
    assert [w.tabs.tabText(i) for i in range(w.tabs.count())] == [
        "CT reconstruction", "Classification benchmark"]
    assert type(w.tabs.widget(1).widget()).__name__ == "ClassifyWidget"
    # only the sinogram is offered (not its truth), and its geometry fills the fields
    assert [w.layer_combo.itemText(i) for i in range(w.layer_combo.count())] == ["digit"]
    layer_geometry = Geometry.from_dict(viewer.layers["digit"].metadata["geometry"])
    assert (_geo(w, "n_angles"), _geo(w, "n_detector"), _geo(w, "image_size")) == (20, 40, 28)
    assert _geo(w, "beam") == "parallel"
    assert w.geometry() == layer_geometry                   # the file's exact angles
    # editable: the fields are what is used
    _set_geo(w, pixel_size=0.5, detector_spacing=0.5, angle_first=0.0, angle_last=171.0)
    g = w.geometry()
    assert g.pixel_size == 0.5 and g.detector_spacing == 0.5
    np.testing.assert_allclose(g.angles_deg, np.arange(20) * 9.0)
    sino = w.sinogram()
    assert sino.ground_truth is not None and sino.meta["phantom"] == "digit"
    # a plain image layer (no ctuq metadata) gets defaults from its shape
    viewer.add_image(np.zeros((30, 50), np.float32), name="plain")
    w.layer_combo.setCurrentText("plain")
    # and the readers' angles for a bare array: i * 180 / n from 0
    np.testing.assert_allclose(w.geometry().angles_deg, np.arange(30) * 6.0, atol=1e-9)
    assert (_geo(w, "n_angles"), _geo(w, "n_detector"), _geo(w, "image_size")) == (30, 50, 50)
    assert w.sinogram().ground_truth is None
    # renaming keeps the selection
    viewer.layers["plain"].name = "renamed"
    assert w.layer_combo.currentText() == "renamed" and _geo(w, "n_angles") == 30
    cfg = w.config()
    assert cfg.preset == "auto" and cfg.dip == {} and cfg.uncertainty == {}
    _tiny(w)
    assert w.setting("uncertainty.predcp").value is False   # the default (docs/defaults.md)
    cfg = w.config()
    assert cfg.dip == {"iterations": 20}
    assert cfg.uncertainty == {"em_steps": 1, "n_samples": 2, "predictive_samples": 4}


def test_advanced_rows_follow_the_preset_and_record_changes(viewer_widget):
    from ctuq.recon.presets import DIP_DEFAULTS, UNCERTAINTY_DEFAULTS

    viewer, w = viewer_widget                            # the digit: 28², reference-28
    iterations, n_samples = w.setting("dip.iterations"), w.setting("uncertainty.n_samples")
    assert iterations.value == DIP_DEFAULTS["reference-28"]["iterations"]
    assert n_samples.value == UNCERTAINTY_DEFAULTS["reference-28"]["n_samples"]
    assert w.setting("dip.tv_weight").value is None     # auto: from the noise level
    n_samples.value = 3
    w.setting("preset").value = "dip-64"
    assert iterations.value == DIP_DEFAULTS["dip-64"]["iterations"]  # untouched: follows
    assert n_samples.value == 3                                       # changed: kept
    w.setting("dip.tv_weight").value = 0.25
    w.setting("seed").value = 7
    assert not w.setting("uncertainty.predcp_scale").enabled   # PredCP off by default
    w.setting("uncertainty.predcp").value = True
    assert w.setting("uncertainty.predcp_scale").enabled
    cfg = w.config()
    assert (cfg.preset, cfg.seed, cfg.device) == ("dip-64", 7, "auto")
    assert cfg.dip == {"tv_weight": 0.25}
    assert cfg.uncertainty == {"n_samples": 3, "predcp": True}
    # what the rows show is what the run uses
    dip, unc = cfg.resolve(w.geometry().image_shape)
    for key, value in w.forms["dip"].values().items():
        assert getattr(dip, key) == value, key
    for key, value in w.forms["uncertainty"].values().items():
        assert getattr(unc, key) == value, key
    # preset auto: untouched rows follow the image size's preset
    w.setting("preset").value = "auto"
    assert iterations.value == DIP_DEFAULTS["reference-28"]["iterations"]
    w.geometry_box.fields["image_size"].value = 64
    assert iterations.value == DIP_DEFAULTS["dip-64"]["iterations"]
    assert w.config().dip == {"tv_weight": 0.25}


def test_invalid_geometry_gives_error_and_no_run(viewer_widget):
    viewer, w = viewer_widget
    _set_geo(w, n_detector=41)               # the data have 40 detector pixels
    n_before = len(_notifications())
    assert w.run() is None
    errors = [n for n in _notifications()[n_before:] if n.severity == "error"]
    assert errors and "40 detector pixels" in errors[0].message
    assert w.run_button.isEnabled() and not w.is_running
    assert len(viewer.layers) == 2


def test_cancel_stops_quickly_and_viewer_stays_usable(viewer_widget, qtbot):
    from qtpy.QtCore import Qt

    viewer, w = viewer_widget
    w.advanced_toggle.setChecked(True)
    w.setting("dip.iterations").value = 200_000  # would run for hours
    n_layers = len(viewer.layers)
    n_before = len(_notifications())
    worker = w.run()
    assert worker is not None and not w.run_button.isEnabled()
    assert w.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: w.progress_bars["dip"].value() >= 50, timeout=60_000)
    assert w.progress_bars["dip"].maximum() == 200_000
    assert w.progress_bars["fbp"].value() == w.progress_bars["fbp"].maximum() == 1
    # the GUI thread keeps serving events while the worker computes
    t0 = time.perf_counter()
    qtbot.wait(200)
    assert time.perf_counter() - t0 < 2.0
    t0 = time.perf_counter()
    qtbot.mouseClick(w.cancel_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.is_running, timeout=10_000)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, f"cancel took {elapsed:.1f} s"
    qtbot.waitUntil(lambda: w.run_button.isEnabled(), timeout=5_000)
    assert not w.cancel_button.isEnabled()
    assert len(viewer.layers) == n_layers and w.last_result is None
    infos = [n.message for n in _notifications()[n_before:]]
    assert any("cancelled" in m for m in infos)
    assert not any(n.severity == "error" for n in _notifications()[n_before:])
    # the viewer is usable afterwards
    viewer.add_image(np.ones((8, 8)), name="after")
    shot = viewer.screenshot(canvas_only=False)
    assert shot.ndim == 3 and shot.shape[-1] == 4


def test_cancel_during_hyperparameter_fit(viewer_widget, qtbot):
    """Cancel lands inside the EM loop (preconditioner sketch, CG, PredCP M-step).

    At 64² one E-step takes 15–30 s on two cores (a Nyström sketch of 220
    products, a PredCP refresh of 176): before those polled ``cancel``, this
    took 33–40 s.
    """
    from qtpy.QtCore import Qt

    viewer, w = viewer_widget
    viewer.open_sample("ctuq", "shepp_logan")
    w.layer_combo.setCurrentText("shepp_logan")
    assert _geo(w, "image_size") == 64
    _tiny(w)
    w.setting("uncertainty.em_steps").value = 500   # would run for an hour
    w.setting("uncertainty.n_samples").value = 8
    n_layers = len(viewer.layers)
    w.run()
    qtbot.waitUntil(lambda: w.progress_bars["em"].value() >= 1, timeout=120_000)
    assert w.progress_bars["em"].maximum() == 500      # em_steps, not E-steps
    for delay_ms in (0, 700):                # right after an E-step, then mid-step
        qtbot.wait(delay_ms)
        assert w.is_running
    t0 = time.perf_counter()
    qtbot.mouseClick(w.cancel_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not w.is_running, timeout=30_000)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, f"cancel during EM took {elapsed:.1f} s"
    qtbot.waitUntil(lambda: w.run_button.isEnabled(), timeout=5_000)
    assert len(viewer.layers) == n_layers and w.last_result is None


def test_run_mc_dropout_from_the_widget(viewer_widget, qtbot):
    """The method choice of the form reaches the pipeline: MC-dropout DIP runs from napari
    and gives the same layers (its std has no model-error part of its own to hide)."""
    viewer, w = viewer_widget
    _tiny(w)
    w.setting("uncertainty.method").value = "mc-dropout"
    assert w.config().uncertainty["method"] == "mc-dropout"
    w.run()
    qtbot.waitUntil(lambda: not w.is_running, timeout=300_000)
    qtbot.waitUntil(lambda: w.run_button.isEnabled(), timeout=5_000)
    assert w.last_result is not None, w.status_label.text()
    assert w.last_result.config["uncertainty"]["method"] == "mc-dropout"
    names = [lay.name for lay in w.results_viewer().layers]
    for name in ("digit reconstruction", "digit total std", "digit posterior std",
                 "digit model-error std"):
        assert name in names
    assert np.all(w.last_result.posterior_std > 0)
    w.close_results_viewer()


def test_run_end_to_end(viewer_widget, qtbot, tmp_path):
    viewer, w = viewer_widget
    n_before = len(_notifications())
    _tiny(w)
    w.run()
    qtbot.waitUntil(lambda: not w.is_running, timeout=300_000)
    qtbot.waitUntil(lambda: w.run_button.isEnabled(), timeout=5_000)
    assert w.last_result is not None, w.status_label.text()
    # the sinogram (index space) and the images (mm) cannot share napari's world:
    # the results have a viewer of their own, with consistent units
    results = w.results_viewer()
    assert results is not viewer
    assert results.layers.extent.units is not None                  # no "Inconsistent units"
    assert not any("units" in n.message for n in _notifications()[n_before:])
    names = [lay.name for lay in results.layers]
    for name in ("digit FBP", "digit reconstruction", "digit total std", "digit posterior std",
                 "digit model-error std", "digit |error|"):
        assert name in names
        assert results.layers[name].data.shape == (28, 28)
    assert names.count("digit truth") == 1
    assert results.layers["digit total std"].colormap.name == "viridis"
    assert results.layers["digit |error|"].colormap.name == "magma"
    assert np.all(results.layers["digit total std"].data >= 0)
    assert grid_of(results).enabled
    # physical units, a colorbar per result image, names in the grid panels, a scale bar in
    # mm, the colour bars' unit in a caption
    for name in ("digit reconstruction", "digit total std", "digit posterior std",
                 "digit model-error std", "digit |error|"):
        lay = results.layers[name]
        assert [str(u) for u in lay.units] == ["millimeter", "millimeter"], name
        assert tuple(lay.scale) == (1.0, 1.0)
        assert lay.colorbar.visible and lay.name_overlay.visible, name
    assert results.scale_bar.visible
    assert [str(u) for u in results.layers.units] == ["millimeter", "millimeter"]
    caption = results.canvas.overlays.text
    assert caption.visible and caption.text == "colour bars in 1/mm"
    assert w.last_result.posterior is not None          # the fitted posterior, in memory
    for stage in ("fbp", "dip", "em", "predictive"):
        bar = w.progress_bars[stage]
        assert bar.value() == bar.maximum() > 0, stage
    assert w.progress_bars["dip"].maximum() == 20
    assert "PSNR" in w.metrics_label.text()
    assert w.plot is not None and "ctuq: calibration and EM trace" in viewer.window.dock_widgets
    cal, em = w.plot.figure.axes
    assert len(cal.lines) == 2 and len(em.lines) >= 2     # calibration; EM variances + σ²
    assert w.export_button.isEnabled()
    out = w.export(tmp_path / "digit_ctuq.h5")
    assert read_result(out) == w.last_result
    # showing a result again (a second run) updates the layers instead of adding new ones
    w.show_result(w.last_result, "digit")
    assert w.results_viewer() is results and [lay.name for lay in results.layers] == names
    w.close_results_viewer()
    assert w._results_viewer is None


def test_gui_opens_file_with_widget_docked(qtbot, tmp_path):
    from ctuq.app._sample_data import simulated_sinogram
    from ctuq.app.gui import open_gui
    from ctuq.data.io import write_sinogram
    from ctuq.errors import InputError

    truth = np.zeros((12, 12), np.float32)
    truth[4:8, 4:8] = 1.0
    write_sinogram(tmp_path / "scan.nxs", simulated_sinogram(truth, 10, phantom="box"))
    with pytest.raises(InputError):
        open_gui(tmp_path / "missing.nxs", show=False)
    viewer = open_gui(tmp_path / "scan.nxs", show=False)
    try:
        assert [lay.name for lay in viewer.layers] == ["scan", "scan truth"]
        widget = viewer.window.dock_widgets["CT reconstruction (ctuq)"]
        assert widget.layer_combo.currentText() == "scan"
        assert widget.geometry_box.fields["n_angles"].value == 10
    finally:
        viewer.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the check is for X/Wayland")
def test_gui_without_display_is_one_clear_error(monkeypatch):
    from ctuq.app.gui import open_gui
    from ctuq.errors import InputError

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with pytest.raises(InputError, match="xvfb-run") as ei:
        open_gui(None)
    assert ei.value.field == "DISPLAY"
