"""Sinogram and result file I/O: every format round-trips, flat/dark
correction is exact, geometry is merged or refused, writes are atomic."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import tifffile

from ctuq.data.geometry import Geometry
from ctuq.data.io import (Result, Sinogram, detect_format, read_result, read_sinogram,
                          sha256_file, write_result, write_sinogram)
from ctuq.errors import InputError

RNG = np.random.default_rng(1234)


def _sino(shape=(7, 11)):
    return RNG.random(shape).astype(np.float32)


def _listing(folder):
    return sorted(os.listdir(folder))


# -- NXtomo from a beamline: flats, darks, angles in degrees, lengths in metres
def _write_raw_nxtomo(path, *, rows=2, n_proj=5, n_det=9, mutate=None):
    """Raw NXtomo: dark, flat, projections, flat; returns the expected sinogram."""
    rng = np.random.default_rng(7)
    p = rng.uniform(0.1, 2.0, (n_proj, rows, n_det))            # true line integrals
    darks = rng.uniform(90, 110, (2, rows, n_det))
    flats = rng.uniform(900, 1100, (3, rows, n_det))
    d, f = darks.mean(0), flats.mean(0)
    proj = (f - d) * np.exp(-p) + d
    frames = np.concatenate([darks[:1], flats[:2], proj, flats[2:], darks[1:]])
    keys = np.array([2, 1, 1] + [0] * n_proj + [1, 2], dtype=np.uint8)
    angles = np.concatenate([[0, 0, 0], np.arange(n_proj) * 36.0, [180, 180]])
    with h5py.File(path, "w") as h:
        e = h.create_group("entry")
        e.attrs["NX_class"] = "NXentry"
        e["definition"] = "NXtomo"
        det = e.create_group("instrument/detector")
        det["data"] = frames
        det["image_key"] = keys
        det["x_pixel_size"] = 6.5e-6
        det["x_pixel_size"].attrs["units"] = "m"
        det["distance"] = 0.1                       # parallel beam: ignored
        det["distance"].attrs["units"] = "m"
        e["sample/rotation_angle"] = angles
        e["sample/rotation_angle"].attrs["units"] = "degrees"
        if mutate:
            mutate(h)
    expected = -np.log((proj - d) / (f - d))
    return expected.transpose(1, 0, 2), np.arange(n_proj) * 36.0


def test_nxtomo_flats_darks_reproduce_known_sinogram(tmp_path):
    path = tmp_path / "scan.nxs"
    expected, angles_deg = _write_raw_nxtomo(path)
    s = read_sinogram(path)
    assert s.is_stack and s.shape == (2, 5, 9) and s.data.dtype == np.float32
    np.testing.assert_allclose(s.data, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.geometry.angles_deg, angles_deg, atol=1e-12)
    assert s.geometry.detector_spacing == pytest.approx(0.0065)
    assert s.geometry.beam == "parallel"
    assert s.geometry.image_shape == (9, 9)         # default: side = n_detector
    assert s.meta["flat_dark_corrected"] and s.meta["n_flats"] == 3 and s.meta["n_darks"] == 2
    assert s.meta["format"] == "nxtomo" and detect_format(path) == "nxtomo"
    assert [t.shape for t in s.slices()] == [(5, 9), (5, 9)]


def test_nxtomo_projection_below_dark_is_named(tmp_path):
    def bad(h):
        h["entry/instrument/detector/data"][4, 0, 3] = 0.0     # a projection frame
    _write_raw_nxtomo(tmp_path / "bad.nxs", mutate=bad)
    with pytest.raises(InputError, match="not positive") as ei:
        read_sinogram(tmp_path / "bad.nxs")
    assert ei.value.file.endswith("bad.nxs")
    assert ei.value.field == "/entry/instrument/detector/data"


def test_nxtomo_raw_without_flats_needs_explicit_marking(tmp_path):
    p = RNG.uniform(0.1, 1.0, (6, 8))
    intens = np.exp(-p)
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as h:
        h["entry/instrument/detector/data"] = intens
        h["entry/sample/rotation_angle"] = np.linspace(0, 150, 6)
    as_is = read_sinogram(path)
    np.testing.assert_allclose(as_is.data, intens, rtol=1e-6)        # no guessing
    np.testing.assert_allclose(read_sinogram(path, raw=True).data, p, rtol=1e-5)
    with h5py.File(path, "a") as h:
        h["entry/instrument/detector/data"].attrs["quantity"] = "intensity"
    np.testing.assert_allclose(read_sinogram(path).data, p, rtol=1e-5)
    with pytest.raises(InputError, match="contradicts") as ei:
        read_sinogram(path, raw=False)
    assert ei.value.field == "raw"


def test_nxtomo_contradictory_angles_option(tmp_path):
    path = tmp_path / "scan.nxs"
    _, angles_deg = _write_raw_nxtomo(path)
    assert read_sinogram(path, angles=angles_deg).geometry.n_angles == 5   # same: fine
    with pytest.raises(InputError, match="contradictory") as ei:
        read_sinogram(path, angles=angles_deg + 1)
    assert ei.value.field == "angles"
    with pytest.raises(InputError, match="contradictory"):
        read_sinogram(path, angles=np.arange(4))
    with pytest.raises(InputError, match="contradictory") as ei:
        read_sinogram(path, detector_spacing=1.0)
    assert ei.value.field == "detector_spacing"
    assert read_sinogram(path, n_angles=5).geometry.n_angles == 5
    with pytest.raises(InputError, match="n_angles=4") as ei:
        read_sinogram(path, n_angles=4)
    assert ei.value.field == "n_angles"


def test_nxtomo_fan_beam_from_distances(tmp_path):
    path = tmp_path / "fan.nxs"
    with h5py.File(path, "w") as h:
        h["entry/instrument/detector/data"] = _sino((8, 40))
        h["entry/instrument/detector/x_pixel_size"] = 0.5
        h["entry/instrument/detector/x_pixel_size"].attrs["units"] = "mm"
        h["entry/instrument/detector/distance"] = 100.0
        h["entry/instrument/detector/distance"].attrs["units"] = "mm"
        h["entry/instrument/source/distance"] = -0.2
        h["entry/instrument/source/distance"].attrs["units"] = "m"
        h["entry/sample/rotation_angle"] = np.arange(8) * 45.0
    g = read_sinogram(path).geometry
    assert (g.beam, g.source_origin, g.origin_detector) == ("fan", 200.0, 100.0)
    assert g.pixel_size == pytest.approx(0.5 / 1.5)
    # the default image is the largest square whose inscribed disc the detector sees
    side = g.image_shape[0]
    assert side >= 2 and g.image_shape == (side, side)
    assert g._detector_width_for_radius(side * g.pixel_size / 2) <= g.detector_width + 1e-9
    assert g._detector_width_for_radius((side + 1) * g.pixel_size / 2) > g.detector_width
    with pytest.raises(InputError):  # far too large: refused
        Geometry.fan(side + 8, angles=g.angles, source_origin=200.0, origin_detector=100.0,
                     n_detector=40, pixel_size=g.pixel_size, detector_spacing=0.5)


# -- DXchange --------------------------------------------------------------------
def test_dxchange_white_dark_theta(tmp_path):
    rng = np.random.default_rng(3)
    p = rng.uniform(0.1, 2.0, (6, 3, 10))
    white = rng.uniform(500, 600, (4, 3, 10))
    dark = rng.uniform(5, 10, (2, 3, 10))
    proj = (white.mean(0) - dark.mean(0)) * np.exp(-p) + dark.mean(0)
    path = tmp_path / "scan.h5"
    with h5py.File(path, "w") as h:
        h["exchange/data"] = proj.astype(np.float64)
        h["exchange/data_white"] = white
        h["exchange/data_dark"] = dark
        h["exchange/theta"] = np.linspace(0, 150, 6)
    s = read_sinogram(path, pixel_size=0.1)
    assert detect_format(path) == "dxchange" and s.meta["format"] == "dxchange"
    np.testing.assert_allclose(s.data, p.transpose(1, 0, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.geometry.angles_deg, np.linspace(0, 150, 6))
    assert s.geometry.pixel_size == pytest.approx(0.1)
    with h5py.File(path, "a") as h:
        del h["exchange/theta"]
        h["exchange/theta"] = np.linspace(0, 150, 5)
    with pytest.raises(InputError, match="5 angles") as ei:
        read_sinogram(path)
    assert ei.value.field == "/exchange/theta"


# -- plain HDF5, npy + sidecar, npz, TIFF ---------------------------------------
def test_plain_hdf5_geometry_from_attributes(tmp_path):
    data = _sino((3, 6, 12))
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as h:
        ds = h.create_dataset("recon/sino", data=data)
        ds.attrs["angles_deg"] = np.arange(6) * 30.0
        ds.attrs["pixel_size"] = 0.5
        ds.attrs["detector_spacing"] = 0.5
        ds.attrs["image_shape"] = [8, 8]
        h["other"] = np.zeros(3)
    with pytest.raises(InputError, match="--dataset") as ei:
        read_sinogram(path)                        # two datasets: which one?
    assert ei.value.field == "dataset"
    s = read_sinogram(path, dataset="recon/sino")
    assert np.array_equal(s.data, data) and s.meta["format"] == "hdf5"
    assert s.geometry == Geometry.parallel((8, 8), angles=np.deg2rad(np.arange(6) * 30.0),
                                           n_detector=12, pixel_size=0.5)
    with h5py.File(path, "a") as h:
        h["recon/sino"].attrs["geometry"] = json.dumps({"pixel_size": 0.25})
    with pytest.raises(InputError, match="contradictory"):
        read_sinogram(path, dataset="recon/sino")


def test_npy_with_sidecar_and_options(tmp_path):
    data = _sino((9, 13))
    path = tmp_path / "sino.npy"
    np.save(path, data)
    with pytest.raises(InputError, match="no projection angles") as ei:
        read_sinogram(path)
    assert ei.value.field == "angles"
    s = read_sinogram(path, n_angles=9)
    np.testing.assert_allclose(s.geometry.angles_deg, np.arange(9) * 20.0, atol=1e-9)
    assert s.geometry.image_shape == (13, 13) and np.array_equal(s.data, data)
    with pytest.raises(InputError, match="n_angles"):
        read_sinogram(path, n_angles=10)
    g = Geometry.parallel(9, n_angles=9, n_detector=13, pixel_size=0.2)
    (tmp_path / "sino.json").write_text(json.dumps(g.to_dict()))
    s = read_sinogram(path)
    assert np.allclose(s.geometry.angles, g.angles, atol=1e-12)
    assert s.geometry.image_shape == (9, 9) and s.geometry.pixel_size == 0.2
    assert s.meta["sidecar"].endswith("sino.json")
    assert read_sinogram(path, pixel_size=0.2).geometry.pixel_size == 0.2   # agrees
    with pytest.raises(InputError, match="contradictory") as ei:
        read_sinogram(path, pixel_size=0.3)
    assert ei.value.field == "pixel_size"
    (tmp_path / "sino.npy.json").write_text("{}")
    with pytest.raises(InputError, match="two sidecar"):
        read_sinogram(path)


def test_npy_recognised_by_content_not_extension(tmp_path):
    data = _sino((5, 8))
    with open(tmp_path / "weird.dat", "wb") as fh:
        np.save(fh, data)
    assert detect_format(tmp_path / "weird.dat") == "npy"
    assert np.array_equal(read_sinogram(tmp_path / "weird.dat", n_angles=5).data, data)
    (tmp_path / "fake.h5").write_bytes(b"this is not HDF5 at all")
    with pytest.raises(InputError, match="extension .h5"):
        read_sinogram(tmp_path / "fake.h5")


def test_npz_keys(tmp_path):
    g = Geometry.fan(10, n_angles=12)
    data = _sino(g.range_shape)
    gt = _sino((10, 10))
    path = tmp_path / "s.npz"
    np.savez(path, sinogram=data, geometry=json.dumps(g.to_dict()), ground_truth=gt,
             meta=json.dumps({"noise_std": 0.01}))
    s = read_sinogram(path)
    assert np.array_equal(s.data, data) and np.array_equal(s.ground_truth, gt)
    assert s.geometry.beam == "fan" and np.allclose(s.geometry.angles, g.angles)
    assert s.meta["noise_std"] == 0.01 and s.noise_std == 0.01
    np.savez(tmp_path / "one.npz", data[None], angles_deg=np.arange(12) * 30.0)
    s = read_sinogram(tmp_path / "one.npz")
    assert s.shape == (1, 12, data.shape[1]) and s.geometry.n_angles == 12
    np.savez(tmp_path / "two.npz", a=data, b=data)
    with pytest.raises(InputError, match="which array"):
        read_sinogram(tmp_path / "two.npz", n_angles=12)
    assert np.array_equal(read_sinogram(tmp_path / "two.npz", dataset="b", n_angles=12).data,
                          data)


def test_tiff_single_and_stack(tmp_path):
    one = _sino((6, 10))
    tifffile.imwrite(tmp_path / "one.tif", one)
    s = read_sinogram(tmp_path / "one.tif", angles=np.arange(6) * 30.0)
    assert np.array_equal(s.data, one) and s.meta["format"] == "tiff"
    stack = _sino((3, 6, 10))
    tifffile.imwrite(tmp_path / "stack.tiff", stack, photometric="minisblack")
    s = read_sinogram(tmp_path / "stack.tiff", n_angles=6)
    assert np.array_equal(s.data, stack) and s.n_slices == 3
    with pytest.raises(InputError, match="projection rows"):
        read_sinogram(tmp_path / "stack.tiff", n_angles=3)
    blob = (tmp_path / "stack.tiff").read_bytes()
    (tmp_path / "cut.tif").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(InputError, match="(?i)truncated|corrupt"):
        read_sinogram(tmp_path / "cut.tif", n_angles=6)


# -- validation of paths and values -------------------------------------------
@pytest.mark.parametrize("case", ["missing", "directory", "empty", "unrelated", "nan",
                                  "complex", "ndim", "empty_array", "truncated_h5"])
def test_bad_inputs_are_input_errors(tmp_path, case):
    path = tmp_path / "in.npy"
    if case == "directory":
        path = tmp_path / "folder"
        path.mkdir()
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "unrelated":
        path = tmp_path / "notes.txt"
        path.write_text("hello")
    elif case == "nan":
        a = _sino((4, 6))
        a[2, 3] = np.nan
        np.save(path, a)
    elif case == "complex":
        np.save(path, np.ones((4, 6), complex))
    elif case == "ndim":
        np.save(path, np.ones((2, 2, 4, 6)))
    elif case == "empty_array":
        np.save(path, np.ones((0, 6)))
    elif case == "truncated_h5":
        path = tmp_path / "in.nxs"
        _write_raw_nxtomo(path)
        path.write_bytes(path.read_bytes()[:3000])
    before = _listing(tmp_path)
    with pytest.raises(InputError) as ei:
        read_sinogram(path, n_angles=4)
    assert ei.value.file is not None and os.path.basename(str(path)) in ei.value.file
    assert _listing(tmp_path) == before             # reading creates nothing


def test_nan_error_names_field_and_position(tmp_path):
    path = tmp_path / "n.h5"
    a = _sino((4, 6))
    a[1, 2] = np.inf
    with h5py.File(path, "w") as h:
        h["entry/instrument/detector/data"] = a
    with pytest.raises(InputError, match=r"non-finite.*\(1, 2\)") as ei:
        read_sinogram(path, n_angles=4)
    assert ei.value.field == "/entry/instrument/detector/data"


def test_unknown_option_is_refused(tmp_path):
    np.save(tmp_path / "a.npy", _sino((4, 6)))
    with pytest.raises(InputError) as ei:
        read_sinogram(tmp_path / "a.npy", n_angles=4, pixelsize=1)
    assert ei.value.field == "pixelsize"


# -- ctuq's own NXtomo ---------------------------------------------------------
@pytest.mark.parametrize("beam", ["parallel", "fan"])
def test_simulated_nxtomo_round_trip(tmp_path, beam):
    g = (Geometry.parallel(12, n_angles=17, pixel_size=0.3) if beam == "parallel"
         else Geometry.fan(12, n_angles=17, source_origin=40.0, origin_detector=25.0))
    shape = (2,) + g.range_shape if beam == "fan" else g.range_shape
    gt = _sino(((2,) if beam == "fan" else ()) + g.image_shape)
    meta = {"noise_std": 0.02, "noise_level": 0.05, "seed": 11, "phantom": "shepp_logan",
            "units": "1", "extra": {"list": [1, 2.5]}}
    s = Sinogram(_sino(shape), g, meta, gt)
    out = write_sinogram(tmp_path / "sim.nxs", s)
    back = read_sinogram(out)
    assert back.geometry == g                       # exact, radians included
    assert np.array_equal(back.data, s.data) and np.array_equal(back.ground_truth, gt)
    assert {k: v for k, v in back.meta.items() if k not in ("source", "format")} == meta
    with h5py.File(out) as h:                       # readable by other NXtomo tools
        assert h["entry/definition"].asstr()[()] == "NXtomo"
        assert h["entry/sample/ground_truth"].attrs["seed"] == 11
        assert h["entry/sample/ground_truth"].attrs["noise_level"] == 0.05
        np.testing.assert_allclose(h["entry/sample/rotation_angle"][()], g.angles_deg)
        assert h["entry/data/data"].shape == (17,) + ((2,) if beam == "fan" else ()) + (
            g.n_detector,)


def test_sinogram_validates_shapes():
    g = Geometry.parallel(8, n_angles=5, n_detector=12)
    with pytest.raises(InputError, match="5 angles") as ei:
        Sinogram(np.zeros((6, 12)), g)
    assert ei.value.field == "angles"
    with pytest.raises(InputError) as ei:
        Sinogram(np.zeros((5, 12)), g, ground_truth=np.zeros((7, 7)))
    assert ei.value.field == "ground_truth"


# -- results -------------------------------------------------------------------
def _result(stack=False, full=True, input_path=None):
    g = Geometry.parallel(6, n_angles=8, pixel_size=0.5)
    lead = (3,) if stack else ()
    rec = _sino(lead + (6, 6))
    kw = {}
    if full:
        kw = dict(variance=_sino(lead + (6, 6)), samples=_sino(lead + (4, 6, 6)),
                  fbp=_sino(lead + (6, 6)), dip=_sino(lead + (6, 6)),
                  ground_truth=_sino(lead + (6, 6)), geometry=g,
                  config={"dip": {"iterations": 100, "lr": 1e-3, "channels": [8, 16]},
                          "tv_weight": 0.5, "device": "auto", "flag": True, "none": None},
                  hyperparameters={"noise_variance": 0.01, "ard": [1.0, 2.5, 3.0]},
                  em_trace=[{"step": 0, "noise_variance": 0.02, "ard": [1.0, 2.0, 3.0]},
                            {"step": 1, "noise_variance": 0.01, "note": "converged",
                             "ard": [1.0, 2.5, 3.0]}],
                  metrics={"psnr": 31.5, "ssim": 0.91, "coverage_95": 0.94},
                  input_sha256="0" * 64, seed=2024, device="cpu", units="1/mm")
    return Result(rec, _sino(lead + (6, 6)), input_path=input_path, **kw)


@pytest.mark.parametrize("stack,full", [(False, False), (False, True), (True, True)])
def test_result_round_trip(tmp_path, stack, full):
    r = _result(stack, full, input_path=str(tmp_path / "in.nxs"))
    write_result(tmp_path / "out.h5", r)
    back = read_result(tmp_path / "out.h5")
    assert back == r
    assert back.em_trace == r.em_trace and back.config == r.config
    assert detect_format(tmp_path / "out.h5") == "result"
    assert _listing(tmp_path) == ["out.h5"]


EXPECTED_LAYOUT = {
    "entry": "NXentry", "entry/instrument": "NXinstrument",
    "entry/instrument/source": "NXsource", "entry/sample": "NXsample",
    "entry/reconstruction": "NXprocess", "entry/reconstruction/parameters": "NXparameters",
    "entry/reconstruction/parameters/dip": "NXcollection",
    "entry/reconstruction/hyperparameters": "NXcollection",
    "entry/reconstruction/em_trace": "NXcollection",
    "entry/reconstruction/geometry": "NXcollection",
    "entry/data": "NXdata", "entry/uncertainty": "NXcollection",
    "entry/metrics": "NXcollection",
}
EXPECTED_DATASETS = {
    "entry/definition", "entry/title", "entry/start_time",
    "entry/instrument/source/type", "entry/instrument/source/name",
    "entry/instrument/source/probe", "entry/sample/name", "entry/sample/ground_truth",
    "entry/reconstruction/program", "entry/reconstruction/version",
    "entry/reconstruction/date", "entry/reconstruction/images",
    "entry/reconstruction/parameters/config_json",
    "entry/reconstruction/parameters/raw_file",
    "entry/reconstruction/parameters/tv_weight", "entry/reconstruction/parameters/device",
    "entry/reconstruction/parameters/flag",
    "entry/reconstruction/parameters/dip/iterations",
    "entry/reconstruction/parameters/dip/lr", "entry/reconstruction/parameters/dip/channels",
    "entry/reconstruction/hyperparameters/noise_variance",
    "entry/reconstruction/hyperparameters/ard", "entry/reconstruction/hyperparameters_json",
    "entry/reconstruction/em_trace/step", "entry/reconstruction/em_trace/noise_variance",
    "entry/reconstruction/em_trace/ard", "entry/reconstruction/em_trace_json",
    "entry/reconstruction/geometry/json", "entry/reconstruction/geometry/angles_rad",
    "entry/reconstruction/geometry/beam", "entry/reconstruction/geometry/image_shape",
    "entry/reconstruction/geometry/n_detector", "entry/reconstruction/geometry/pixel_size",
    "entry/reconstruction/geometry/detector_spacing",
    "entry/reconstruction/geometry/center_offset",
    "entry/reconstruction/input_file", "entry/reconstruction/input_sha256",
    "entry/reconstruction/seed", "entry/reconstruction/device",
    "entry/data/data", "entry/data/data_errors", "entry/data/x", "entry/data/y",
    "entry/data/slice",
    "entry/uncertainty/variance", "entry/uncertainty/samples", "entry/uncertainty/fbp",
    "entry/uncertainty/dip",
    "entry/metrics/psnr", "entry/metrics/ssim", "entry/metrics/coverage_95",
}


def test_result_file_layout(tmp_path):
    r = _result(stack=True, full=True, input_path="scan.nxs")
    write_result(tmp_path / "r.h5", r)
    groups, datasets = {}, set()
    with h5py.File(tmp_path / "r.h5") as h:
        h.visititems(lambda n, o: groups.__setitem__(n, o.attrs.get("NX_class"))
                     if isinstance(o, h5py.Group) else datasets.add(n))
        assert groups == EXPECTED_LAYOUT
        assert datasets == EXPECTED_DATASETS
        assert h["entry/definition"].asstr()[()] == "NXtomoproc"
        assert h["entry/reconstruction/program"].asstr()[()] == "ctuq"
        d = h["entry/data"]
        assert d.attrs["signal"] == "data"
        assert list(d.attrs["axes"]) == ["slice", "y", "x"]
        assert (d.attrs["slice_indices"], d.attrs["y_indices"], d.attrs["x_indices"]) == (0, 1, 2)
        assert d["data_errors"].shape == d["data"].shape == (3, 6, 6)
        assert d["x"].attrs["units"] == "mm"
        np.testing.assert_allclose(d["x"][()], (np.arange(6) - 2.5) * 0.5)
        assert json.loads(h["entry/reconstruction/parameters/config_json"].asstr()[()]) \
            == r.config
        np.testing.assert_allclose(h["entry/reconstruction/em_trace/noise_variance"][()],
                                   [0.02, 0.01])
        assert h["entry/reconstruction/seed"][()] == 2024


def test_2d_result_axes(tmp_path):
    write_result(tmp_path / "r.h5", _result(stack=False, full=False))
    with h5py.File(tmp_path / "r.h5") as h:
        assert list(h["entry/data"].attrs["axes"]) == ["y", "x"]
        assert h["entry/data/x"].attrs["units"] == "pixel"     # no geometry known
        assert "uncertainty" not in h["entry"] and "metrics" not in h["entry"]


# -- safe writing ----------------------------------------------------------------
def test_existing_output_is_not_replaced_without_overwrite(tmp_path):
    out = tmp_path / "r.h5"
    out.write_bytes(b"precious")
    with pytest.raises(InputError, match="already exists") as ei:
        write_result(out, _result(full=False))
    assert ei.value.field == "output"
    assert out.read_bytes() == b"precious" and _listing(tmp_path) == ["r.h5"]
    write_result(out, _result(full=False), overwrite=True)
    assert read_result(out).reconstruction.shape == (6, 6)
    assert _listing(tmp_path) == ["r.h5"]


def test_input_is_never_overwritten(tmp_path):
    src = tmp_path / "scan.nxs"
    _write_raw_nxtomo(src)
    digest = sha256_file(src)
    s = read_sinogram(src)
    with pytest.raises(InputError, match="input file"):
        write_sinogram(src, s, overwrite=True)
    r = _result(full=False, input_path=str(src))
    with pytest.raises(InputError, match="input file"):
        write_result(tmp_path / "." / "scan.nxs", r, overwrite=True)
    assert sha256_file(src) == digest and _listing(tmp_path) == ["scan.nxs"]


def test_failed_write_leaves_nothing(tmp_path):
    r = _result(full=False)
    r.config = {"bad": object()}                    # not JSON-able
    with pytest.raises(InputError, match="JSON") as ei:
        write_result(tmp_path / "r.h5", r)
    assert ei.value.field == "config.bad"
    r.config = {}
    r.samples = object()                            # breaks the writer half-way
    with pytest.raises(Exception):
        write_result(tmp_path / "r.h5", r)
    assert _listing(tmp_path) == []
    with pytest.raises(InputError, match="folder does not exist"):
        write_result(tmp_path / "nope" / "r.h5", _result(full=False))


def test_result_validation():
    with pytest.raises(InputError) as ei:
        Result(np.zeros((4, 4)), np.zeros((4, 5)))
    assert ei.value.field == "std"
    with pytest.raises(InputError) as ei:
        Result(np.zeros((4, 4)), -np.ones((4, 4)))
    assert ei.value.field == "std"
    with pytest.raises(InputError) as ei:
        Result(np.zeros((4, 4)), np.zeros((4, 4)), samples=np.zeros((3, 4, 5)))
    assert ei.value.field == "samples"
    with pytest.raises(InputError) as ei:
        Result(np.zeros((4, 4)), np.zeros((4, 4)), geometry=Geometry.parallel(5, 3))
    assert ei.value.field == "geometry"


def test_result_file_is_not_a_sinogram_and_vice_versa(tmp_path):
    write_result(tmp_path / "r.h5", _result(full=False))
    with pytest.raises(InputError, match="read_result"):
        read_sinogram(tmp_path / "r.h5")
    _write_raw_nxtomo(tmp_path / "s.nxs")
    with pytest.raises(InputError, match="not a ctuq result"):
        read_result(tmp_path / "s.nxs")


def test_corrupted_result_data_is_detected(tmp_path):
    r = _result(full=False)
    write_result(tmp_path / "r.h5", r)
    blob = bytearray((tmp_path / "r.h5").read_bytes())
    i = bytes(blob).find(r.reconstruction.tobytes()[:32])
    assert i > 0
    blob[i + 9] ^= 0x40
    (tmp_path / "bad.h5").write_bytes(bytes(blob))
    with pytest.raises(InputError, match="corrupt") as ei:
        read_result(tmp_path / "bad.h5")
    assert ei.value.field == "/entry/data/data"


def test_sidecar_takes_the_option_names(tmp_path):
    """The sidecar accepts n_angles, angle_first/last, angle_unit, image_size (issue 22:
    it rejected the n_angles its own error message suggested)."""
    np.save(tmp_path / "s.npy", _sino((9, 15)))
    (tmp_path / "s.json").write_text(json.dumps({"n_angles": 9, "image_size": 12}))
    s = read_sinogram(tmp_path / "s.npy")
    assert s.geometry.image_shape == (12, 12)
    np.testing.assert_allclose(s.geometry.angles_deg, np.arange(9) * 20.0, atol=1e-9)
    (tmp_path / "s.json").write_text(json.dumps(
        {"angle_first": 0.0, "angle_last": 1.6, "n_angles": 9, "angle_unit": "rad",
         "center_offset": 0.5}))
    s = read_sinogram(tmp_path / "s.npy")
    np.testing.assert_allclose(s.geometry.angles, np.linspace(0, 1.6, 9))
    assert s.geometry.center_offset == 0.5
    (tmp_path / "s.json").write_text(json.dumps({"n_angles": 8}))
    with pytest.raises(InputError, match="n_angles"):
        read_sinogram(tmp_path / "s.npy")
    (tmp_path / "s.json").write_text(json.dumps({"colour": 8}))
    with pytest.raises(InputError, match="colour"):
        read_sinogram(tmp_path / "s.npy")


def test_data_errors_is_labelled_as_the_total_std(tmp_path):
    """data/data_errors holds the total std (posterior and model error), not the
    posterior part, which is uncertainty/posterior_std: the labels say which is which."""
    rng = np.random.default_rng(1)
    post, model = rng.uniform(0.1, 1, (2, 5, 5))
    r = Result(rng.random((5, 5)), np.hypot(post, model), posterior_std=post,
               model_error_std=model)
    write_result(tmp_path / "r.h5", r)
    with h5py.File(tmp_path / "r.h5") as h:
        errors = h["entry/data/data_errors"]
        label = errors.attrs["long_name"]
        label = label.decode() if isinstance(label, bytes) else label
        np.testing.assert_allclose(errors[()], np.hypot(post, model), rtol=1e-6)
        assert "total" in label and label != "posterior standard deviation"
        part = h["entry/uncertainty/posterior_std"]
        np.testing.assert_allclose(part[()], post, rtol=1e-6)
        assert part.attrs["long_name"] == "posterior standard deviation"
