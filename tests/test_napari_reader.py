"""napari plugin I/O in a real viewer (under Xvfb): the reader turns every
sinogram format and ctuq result files into the expected layers, invalid
files give an error notification and no layer, the writer's file reads back
equal, and the sample data open."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import tifffile

from ctuq.app._reader import napari_get_reader
from ctuq.app._sample_data import simulated_sinogram
from ctuq.data.geometry import Geometry
from ctuq.data.io import Result, read_result, write_result, write_sinogram

pytestmark = [
    pytest.mark.gui,
    pytest.mark.skipif(not os.environ.get("DISPLAY") or
                       os.environ.get("QT_QPA_PLATFORM") == "offscreen",
                       reason="napari needs an X display (run under xvfb-run)"),
]


@pytest.fixture(scope="module")
def sino():
    """A tiny simulated sinogram: 12² image, 10 angles, with its truth."""
    truth = np.zeros((12, 12), np.float32)
    truth[3:9, 4:8] = 1.0
    return simulated_sinogram(truth, 10, phantom="box")


def _notifications():
    from napari.utils.notifications import notification_manager

    return notification_manager.records


def _result(sino, fbp=True):
    rng = np.random.default_rng(0)
    shape = sino.geometry.image_shape
    truth = sino.ground_truth
    return Result(reconstruction=truth + 0.1 * rng.standard_normal(shape).astype(np.float32),
                  std=rng.uniform(0.01, 0.2, shape).astype(np.float32),
                  variance=rng.uniform(0.0, 0.04, shape).astype(np.float32),
                  samples=rng.standard_normal((3,) + shape).astype(np.float32),
                  fbp=rng.standard_normal(shape).astype(np.float32) if fbp else None,
                  ground_truth=truth, geometry=sino.geometry,
                  config={"preset": "reference-28", "dip": {"iterations": 20}},
                  hyperparameters={"sigma2": 0.01, "a": [1.0, 2.0]},
                  em_trace=[{"step": 0, "sigma2": 0.02, "a": [1.0, 1.5]},
                            {"step": 1, "sigma2": 0.01, "a": [1.0, 2.0]}],
                  metrics={"psnr": 21.5}, seed=3, device="cpu", input_path="/data/scan.nxs",
                  units="1/mm")


def _write_formats(folder, s) -> dict:
    """The sinogram ``s`` in every format ctuq reads; name -> (path, has truth)."""
    g = s.geometry
    files = {}
    p = folder / "nx.nxs"
    write_sinogram(p, s)
    files["nxtomo"] = (p, True)
    p = folder / "dx.h5"
    with h5py.File(p, "w") as h:   # DXchange: projections [angles, rows, det]
        h["exchange/data"] = s.data[:, None, :]
        h["exchange/theta"] = g.angles_deg
    files["dxchange"] = (p, False)
    p = folder / "plain.h5"
    with h5py.File(p, "w") as h:
        ds = h.create_dataset("sino", data=s.data)
        ds.attrs["geometry"] = json.dumps(g.to_dict())
    files["hdf5"] = (p, False)
    p = folder / "arr.npy"
    np.save(p, s.data)
    (folder / "arr.json").write_text(json.dumps(g.to_dict()))
    files["npy"] = (p, False)
    p = folder / "arr.npz"
    np.savez(p, sinogram=s.data, geometry=json.dumps(g.to_dict()), ground_truth=s.ground_truth,
             meta=json.dumps({"noise_std": s.noise_std}))
    files["npz"] = (p, True)
    p = folder / "img.tif"
    tifffile.imwrite(p, s.data)
    (folder / "img.json").write_text(json.dumps(g.to_dict()))
    files["tiff"] = (p, False)
    return files


def test_reader_opens_every_sinogram_format(make_napari_viewer, tmp_path, sino):
    viewer = make_napari_viewer()
    files = _write_formats(tmp_path, sino)
    for fmt, (path, has_truth) in files.items():
        viewer.layers.clear()
        viewer.open(str(path), plugin="ctuq")
        stem = path.stem
        names = [lay.name for lay in viewer.layers]
        assert names == ([stem, f"{stem} truth"] if has_truth else [stem]), fmt
        layer = viewer.layers[stem]
        assert layer.data.shape == (10, sino.geometry.n_detector), fmt
        np.testing.assert_allclose(layer.data, sino.data, rtol=1e-6, atol=1e-6)
        md = layer.metadata
        assert md["ctuq_role"] == "sinogram" and md["sinogram_meta"]["format"] == fmt
        g = Geometry.from_dict(md["geometry"])
        np.testing.assert_allclose(g.angles, sino.geometry.angles, atol=1e-9)
        if fmt == "dxchange":  # DXchange has no image shape: the default is the detector's
            assert g.image_shape == (sino.geometry.n_detector,) * 2
        else:
            assert g == sino.geometry, fmt
        assert md["geometry_assumed"] is False
        assert ("ground_truth" in md) == has_truth
        if has_truth:
            truth_layer = viewer.layers[f"{stem} truth"]
            assert truth_layer.data.shape == (12, 12)
            assert tuple(truth_layer.contrast_limits) == (0.0, 1.0)


def test_reader_assumes_angles_for_bare_arrays(make_napari_viewer, tmp_path):
    viewer = make_napari_viewer()
    stack = np.random.default_rng(1).random((2, 9, 13)).astype(np.float32)
    np.save(tmp_path / "bare.npy", stack)
    n_before = len(_notifications())
    viewer.open(str(tmp_path / "bare.npy"), plugin="ctuq")
    layer = viewer.layers["bare"]
    assert layer.data.shape == (2, 9, 13) and layer.metadata["geometry_assumed"] is True
    g = Geometry.from_dict(layer.metadata["geometry"])
    np.testing.assert_allclose(g.angles_deg, np.arange(9) * 20.0, atol=1e-9)  # from 0
    new = _notifications()[n_before:]
    assert any(n.severity == "warning" and "no projection angles" in n.message for n in new)


def test_reader_opens_result_files(make_napari_viewer, tmp_path, sino):
    viewer = make_napari_viewer()
    result = _result(sino)
    write_result(tmp_path / "res.h5", result)
    viewer.open(str(tmp_path / "res.h5"), plugin="ctuq")
    names = [lay.name for lay in viewer.layers]
    assert names == ["res FBP", "res truth", "res reconstruction", "res total std", "res |error|"]
    for lay in viewer.layers:
        assert lay.data.shape == (12, 12)
    cmaps = {lay.name: lay.colormap.name for lay in viewer.layers}
    assert cmaps["res reconstruction"] == "gray" and cmaps["res total std"] == "viridis"
    assert cmaps["res |error|"] == "magma"
    np.testing.assert_array_equal(viewer.layers["res total std"].data, result.std)
    np.testing.assert_allclose(viewer.layers["res |error|"].data,
                               np.abs(result.reconstruction - result.ground_truth))
    # gray layers share the truth's range; the std map starts at 0
    assert tuple(viewer.layers["res reconstruction"].contrast_limits) == (0.0, 1.0)
    lo, hi = viewer.layers["res total std"].contrast_limits
    assert lo == 0.0 and hi == pytest.approx(np.percentile(result.std, 99.5), rel=1e-5)
    # without truth and FBP: only reconstruction and std
    bare = Result(result.reconstruction, result.std)
    write_result(tmp_path / "bare.h5", bare)
    viewer.layers.clear()
    viewer.open(str(tmp_path / "bare.h5"), plugin="ctuq")
    assert [lay.name for lay in viewer.layers] == ["bare reconstruction", "bare total std"]


@pytest.mark.parametrize("case", ["garbage.h5", "nan.npz", "truncated.nxs"])
def test_invalid_file_gives_error_notification_and_no_layer(make_napari_viewer, tmp_path,
                                                            sino, case):
    viewer = make_napari_viewer()
    path = tmp_path / case
    if case == "garbage.h5":
        path.write_bytes(b"this is not HDF5 at all, just text")
    elif case == "nan.npz":
        data = sino.data.copy()
        data[2, 3] = np.nan
        np.savez(path, sinogram=data, angles_deg=sino.geometry.angles_deg)
    else:
        write_sinogram(path, sino)
        blob = path.read_bytes()
        path.write_bytes(blob[: len(blob) // 2])
    n_before = len(_notifications())
    viewer.open(str(path), plugin="ctuq")
    assert len(viewer.layers) == 0
    errors = [n for n in _notifications()[n_before:] if n.severity == "error"]
    assert len(errors) == 1 and case in errors[0].message
    assert viewer.layers is not None and viewer.dims.ndim >= 2  # still usable


def test_reader_refuses_files_that_are_not_ours(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert napari_get_reader(str(tmp_path / "notes.txt")) is None
    assert napari_get_reader(str(tmp_path)) is None
    assert napari_get_reader(str(tmp_path / "missing.h5")) is None
    (tmp_path / "x.npy").write_bytes(b"x")
    assert callable(napari_get_reader(str(tmp_path / "x.npy")))   # ours, even if broken


def test_writer_round_trip(make_napari_viewer, tmp_path, sino):
    viewer = make_napari_viewer()
    result = _result(sino)
    write_result(tmp_path / "res.h5", result)
    viewer.open(str(tmp_path / "res.h5"), plugin="ctuq")
    viewer.layers.select_all()
    written = viewer.layers.save(str(tmp_path / "again.h5"), selected=True, plugin="ctuq")
    assert written == [str(tmp_path / "again.h5")]
    assert read_result(tmp_path / "again.h5") == result
    # an edited std layer is what gets written
    viewer.layers["res total std"].data = viewer.layers["res total std"].data * 2
    viewer.layers.save(str(tmp_path / "edited.h5"), selected=True, plugin="ctuq")
    np.testing.assert_array_equal(read_result(tmp_path / "edited.h5").std, 2 * result.std)


def test_writer_saves_a_single_layer(make_napari_viewer, tmp_path, sino):
    """The std map alone (issue 22): a result file holding that one image, in mm."""
    viewer = make_napari_viewer()
    result = _result(sino)
    write_result(tmp_path / "res.h5", result)
    viewer.open(str(tmp_path / "res.h5"), plugin="ctuq")
    viewer.layers.selection = {viewer.layers["res total std"]}
    written = viewer.layers.save(str(tmp_path / "std.h5"), selected=True, plugin="ctuq")
    assert written == [str(tmp_path / "std.h5")]
    back = read_result(tmp_path / "std.h5")
    assert back.reconstruction is None and back.fbp is None
    np.testing.assert_array_equal(back.std, result.std)
    assert back.geometry == result.geometry and back.units == result.units
    with h5py.File(tmp_path / "std.h5") as h:
        assert h["entry/data"].attrs["signal"] == "std"
        assert h["entry/data/std"].attrs["units"] == "1/mm"
    viewer.layers.clear()
    viewer.open(str(tmp_path / "std.h5"), plugin="ctuq")      # and it opens again
    assert [lay.name for lay in viewer.layers] == ["std total std"]
    # the FBP alone, too
    viewer.layers.clear()
    viewer.open(str(tmp_path / "res.h5"), plugin="ctuq")
    viewer.layers.selection = {viewer.layers["res FBP"]}
    viewer.layers.save(str(tmp_path / "fbp.h5"), selected=True, plugin="ctuq")
    np.testing.assert_array_equal(read_result(tmp_path / "fbp.h5").fbp, result.fbp)


def test_writer_refuses_what_is_not_a_result(make_napari_viewer, tmp_path, sino):
    viewer = make_napari_viewer()
    write_result(tmp_path / "res.h5", _result(sino))
    viewer.open(str(tmp_path / "res.h5"), plugin="ctuq")
    viewer.layers.selection = {viewer.layers["res |error|"]}
    n_before = len(_notifications())
    with pytest.warns(UserWarning, match="did not return any written paths"):
        written = viewer.layers.save(str(tmp_path / "out.h5"), selected=True, plugin="ctuq")
    assert written == [] and not (tmp_path / "out.h5").exists()
    errors = [n for n in _notifications()[n_before:] if n.severity == "error"]
    assert errors and "derived" in errors[0].message


def test_layers_are_in_physical_units(make_napari_viewer, tmp_path, sino):
    """Result layers in mm (scale = pixel size, rotation axis at 0), sinograms in index space."""
    from ctuq.data.geometry import Geometry as G

    viewer = make_napari_viewer()
    g = G.parallel(12, 10, pixel_size=0.25)
    r = _result(sino)
    r.geometry = g
    write_result(tmp_path / "res.h5", r)
    viewer.open(str(tmp_path / "res.h5"), plugin="ctuq")
    lay = viewer.layers["res total std"]
    assert tuple(lay.scale) == (0.25, 0.25)
    assert [str(u) for u in lay.units] == ["millimeter", "millimeter"]
    np.testing.assert_allclose(lay.translate, [(0.5 - 6) * 0.25] * 2)
    # the centre of the image is the rotation axis: world (0, 0) is between the middle pixels
    np.testing.assert_allclose(lay.data_to_world((5.5, 5.5)), (0.0, 0.0), atol=1e-12)
    write_sinogram(tmp_path / "s.nxs", sino)
    viewer.open(str(tmp_path / "s.nxs"), plugin="ctuq")
    s = viewer.layers["s"]
    # index space: an angle is not a length, and napari has one unit per world axis
    assert [str(u) for u in s.units] == ["pixel", "pixel"] and tuple(s.scale) == (1.0, 1.0)


def test_result_opens_three_std_layers_on_one_scale(make_napari_viewer, tmp_path, sino):
    """Total, posterior and model-error std, as the README promises, comparable by colour."""
    viewer = make_napari_viewer()
    r = _result(sino)
    rng = np.random.default_rng(1)
    r.posterior_std = rng.uniform(0.0, 0.1, r.std.shape).astype(np.float32)
    r.model_error_std = np.sqrt(np.maximum(r.std ** 2 - r.posterior_std ** 2, 0))
    write_result(tmp_path / "res.h5", r)
    n_before = len(_notifications())
    viewer.open(str(tmp_path / "res.h5"), plugin="ctuq")
    names = [lay.name for lay in viewer.layers]
    assert names == ["res FBP", "res truth", "res reconstruction", "res model-error std",
                     "res posterior std", "res total std", "res |error|"]
    for name, arr in (("res total std", r.std), ("res posterior std", r.posterior_std),
                      ("res model-error std", r.model_error_std)):
        lay = viewer.layers[name]
        np.testing.assert_array_equal(lay.data, arr)
        assert tuple(lay.contrast_limits) == tuple(viewer.layers["res total std"].contrast_limits)
        assert [str(u) for u in lay.units] == ["millimeter", "millimeter"]
    assert not any("units" in n.message for n in _notifications()[n_before:])
    # saved together, the three come back
    viewer.layers.selection = {viewer.layers[n] for n in ("res reconstruction", "res total std",
                                                          "res posterior std",
                                                          "res model-error std")}
    viewer.layers.save(str(tmp_path / "back.h5"), selected=True, plugin="ctuq")
    back = read_result(tmp_path / "back.h5")
    np.testing.assert_array_equal(back.posterior_std, r.posterior_std)
    np.testing.assert_array_equal(back.model_error_std, r.model_error_std)


def test_sample_data(make_napari_viewer):
    viewer = make_napari_viewer()
    n_before = len(_notifications())
    viewer.open_sample("ctuq", "digit")
    viewer.open_sample("ctuq", "shepp_logan")
    viewer.scale_bar.visible = True
    # sinograms and their truths share index space: no "Inconsistent units" warning
    assert not any("unit" in n.message.lower() for n in _notifications()[n_before:])
    assert viewer.layers.units is not None
    shapes = {lay.name: lay.data.shape for lay in viewer.layers}
    assert shapes == {"digit": (20, 40), "digit truth": (28, 28),
                      "shepp_logan": (60, 91), "shepp_logan truth": (64, 64)}
    md = viewer.layers["shepp_logan"].metadata
    assert md["sinogram_meta"]["noise_std"] > 0
    assert md["ground_truth"].shape == (64, 64)
    assert Geometry.from_dict(md["geometry"]).n_angles == 60
