"""The "Classification benchmark" napari tab in a real viewer (under Xvfb): a tiny run end to
end (metrics table, reliability diagram, image stack with per-image prediction features),
and a bad data set reported without a traceback."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = [
    pytest.mark.gui,
    pytest.mark.skipif(not os.environ.get("DISPLAY") or
                       os.environ.get("QT_QPA_PLATFORM") == "offscreen",
                       reason="napari needs an X display (run under xvfb-run)"),
]


@pytest.fixture
def tab(make_napari_viewer, qtbot, one_thread):
    viewer = make_napari_viewer()
    _, widget = viewer.window.add_plugin_dock_widget("ctuq", "CT reconstruction")
    w = widget.classify_widget
    yield viewer, widget, w
    if w.is_running:
        w.cancel()
        qtbot.waitUntil(lambda: not w.is_running, timeout=60_000)


def test_tiny_benchmark_in_napari(tab, qtbot):
    from dataclasses import replace

    from ctuq.classify.laplace import CLASSIFIER_STO

    viewer, widget, w = tab
    assert widget.tabs.tabText(1) == "Classification benchmark"
    w.epochs_spin.setValue(3)
    w.n_train_spin.setValue(200)
    assert {"ivon", "ivon+lla", "ivon+lla-val"} <= set(w.method_checks)
    for m, box in w.method_checks.items():
        box.setChecked(m in ("map", "lla-sampled", "ivon"))
    w.config_overrides = {"em_steps": 2, "em_samples": 4, "predictive_samples": 8,
                          "angles": (0.0, 90.0), "sto": replace(CLASSIFIER_STO, iterations=40),
                          "ivon_samples": 8}
    worker = w.run()
    assert worker is not None and w.is_running
    qtbot.waitUntil(lambda: not w.is_running, timeout=240_000)
    assert w.result is not None, w.status_label.text()
    assert w.table.rowCount() == 3
    assert [w.table.verticalHeaderItem(i).text() for i in range(3)] == ["map", "ivon",
                                                                         "lla-sampled"]
    acc = float(w.table.item(0, 0).text())
    assert 0 <= acc <= 100
    assert len(w.figure.axes) == 1 and len(w.figure.axes[0].lines) >= 4   # ideal + 3 methods
    images = viewer.layers["digits test images"]
    points = viewer.layers["digits predictions"]
    n = images.data.shape[0]
    assert images.data.shape[1:] == (8, 8) and len(points.data) == n
    feats = points.features
    assert set(feats.columns) >= {"true", "predicted", "confidence", "entropy"}
    probs = w.result.methods["lla-sampled"].test_probs
    np.testing.assert_array_equal(feats["predicted"].to_numpy(), probs.argmax(1))
    np.testing.assert_allclose(feats["confidence"].to_numpy(), probs.max(1))
    assert bool((feats["entropy"] >= 0).all()) and bool((feats["entropy"] <= np.log(10)).all())
    # switching the shown method rewrites the features
    w.show_combo.setCurrentText("map")
    np.testing.assert_allclose(viewer.layers["digits predictions"].features["confidence"],
                               w.result.methods["map"].test_probs.max(1))
    w.show_combo.setCurrentText("ivon")
    np.testing.assert_allclose(viewer.layers["digits predictions"].features["confidence"],
                               w.result.methods["ivon"].test_probs.max(1))


def test_cancel_stops_the_run(tab, qtbot):
    viewer, widget, w = tab
    w.epochs_spin.setValue(2000)                       # long enough to be cancelled mid-way
    for m, box in w.method_checks.items():
        box.setChecked(m == "map")
    w.run()
    qtbot.waitUntil(lambda: "train" in w.status_label.text(), timeout=60_000)
    w.cancel()
    qtbot.waitUntil(lambda: not w.is_running, timeout=30_000)
    assert w.status_label.text() == "Cancelled." and w.result is None


def test_missing_data_set_is_reported(tab, qtbot):
    viewer, widget, w = tab
    w.dataset_combo.setCurrentText("mnist")
    w.data_dir_edit.setText("/nonexistent/folder")
    w.run()
    qtbot.waitUntil(lambda: not w.is_running, timeout=30_000)
    assert w.result is None
    assert w.status_label.text().startswith("Error:") and "data_dir" in w.status_label.text()
