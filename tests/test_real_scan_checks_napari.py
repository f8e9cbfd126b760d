"""napari and the real-scan checks: the whitened residual as a layer of a result,
a warning notification for a misfit or a data warning, the checks kept on export."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ctuq.data.geometry import Geometry
from ctuq.data.io import Result, read_result, write_result

pytestmark = [
    pytest.mark.gui,
    pytest.mark.skipif(not os.environ.get("DISPLAY") or
                       os.environ.get("QT_QPA_PLATFORM") == "offscreen",
                       reason="napari needs an X display (run under xvfb-run)"),
]


def _result(verdict="misfit"):
    g = Geometry.parallel(12, 10)
    rng = np.random.default_rng(0)
    img = rng.random((12, 12)).astype(np.float32)
    return Result(reconstruction=img, std=img * 0.1 + 0.01, geometry=g,
                  residual=rng.normal(size=(10, g.n_detector)).astype(np.float32) * 5,
                  diagnostics={"verdict": verdict, "reason": "χ²/dof 25 (threshold 8)",
                               "chi2_dof": 25.0, "threshold": 8.0,
                               "warnings": ["95 % of the line integrals are negative"]})


def test_residual_layer_and_export_keep_the_checks(make_napari_viewer, tmp_path):
    from ctuq.app._reader import residual_layer

    r = _result()
    data, kwargs, kind = residual_layer(r, "res")
    assert kind == "image" and kwargs["name"] == "res whitened residual"
    np.testing.assert_array_equal(data, r.residual)
    lo, hi = kwargs["contrast_limits"]
    assert lo == -hi and hi >= 3.0 and kwargs["metadata"]["verdict"] == "misfit"
    assert "scale" not in kwargs  # index space, like the sinogram
    assert residual_layer(Result(reconstruction=r.reconstruction), "x") is None
    write_result(tmp_path / "res.h5", r)
    viewer = make_napari_viewer()
    viewer.open(str(tmp_path / "res.h5"), plugin="ctuq")
    # export of the result keeps the checks
    viewer.layers.selection = {viewer.layers["res reconstruction"], viewer.layers["res total std"]}
    viewer.layers.save(str(tmp_path / "out.h5"), selected=True, plugin="ctuq")
    back = read_result(tmp_path / "out.h5")
    assert back.diagnostics == r.diagnostics
    np.testing.assert_array_equal(back.residual, r.residual)


def test_misfit_and_data_warnings_are_notified():
    from napari.utils.notifications import notification_manager

    from ctuq.app._result_layers import notify_checks

    n = len(notification_manager.records)
    notify_checks(_result("misfit"), "scan")
    new = notification_manager.records[n:]
    assert [x.severity for x in new] == ["warning", "warning"]
    assert "misfit" in new[0].message and "negative" in new[1].message
    n = len(notification_manager.records)
    ok = _result("ok")
    ok.diagnostics["warnings"] = []
    notify_checks(ok, "scan")
    assert len(notification_manager.records) == n
    # an image that is not the DIP output is named (uncertainty.heldout_input_fallback)
    ok.config = {"model_error": {"info": {"input_fallback": {
        "used": True, "t": 6.35, "t_min": 2.0, "heldout_misfit": {"fit": 2.0, "input": 1.0}}}}}
    notify_checks(ok, "scan")
    new = notification_manager.records[n:]
    assert [x.severity for x in new] == ["info"] and "the TV image" in new[0].message
    assert "t 6.35 > 2" in new[0].message


def test_show_result_puts_the_residual_beside_the_sinogram(make_napari_viewer):
    from napari.utils.notifications import notification_manager

    viewer = make_napari_viewer()
    _, widget = viewer.window.add_plugin_dock_widget("ctuq", "CT reconstruction")
    r = _result()
    n = len(notification_manager.records)
    widget.show_result(r, "scan")
    try:
        assert "scan whitened residual" in viewer.layers
        # (the results viewer keeps only mm layers: test_napari_widget's end-to-end run)
        assert all(lay.metadata.get("ctuq_role") != "residual" for lay in
                   widget.results_viewer().layers)
        assert any("misfit" in x.message for x in notification_manager.records[n:])
    finally:
        widget.close_results_viewer()
