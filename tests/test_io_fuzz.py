"""Property-based tests: hundreds of malformed files (wrong shapes and dtypes,
NaN/Inf, missing or contradictory fields, truncated bytes, garbage,
directories) each end in an InputError, and no output is left behind."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctuq.data.geometry import Geometry
from ctuq.data.io import Result, Sinogram, read_result, read_sinogram, write_result, \
    write_sinogram
from ctuq.errors import InputError

SETTINGS = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NA, ND, ROWS = 5, 8, 2          # angles, detector pixels, rows: small and fast


def _valid_sino(rng, shape=(NA, ND)):
    return rng.uniform(0.1, 2.0, shape).astype(np.float32)


# -- builders of valid files, mutated by the makers below -------------------------
def _raw_nxtomo(path, mutate=None):
    rng = np.random.default_rng(0)
    darks = rng.uniform(90, 110, (2, ROWS, ND))
    flats = rng.uniform(900, 1100, (2, ROWS, ND))
    proj = (flats.mean(0) - darks.mean(0)) * np.exp(-rng.uniform(0.1, 2, (NA, ROWS, ND))) \
        + darks.mean(0)
    parts = {"data": np.concatenate([darks, flats, proj]),
             "image_key": np.array([2, 2, 1, 1] + [0] * NA, np.int8),
             "rotation_angle": np.concatenate([[0.0] * 4, np.arange(NA) * 36.0])}
    with h5py.File(path, "w") as h:
        det = h.create_group("entry/instrument/detector")
        det["data"] = parts["data"]
        det["image_key"] = parts["image_key"]
        det["x_pixel_size"] = 0.1
        det["x_pixel_size"].attrs["units"] = "mm"
        h["entry/sample/rotation_angle"] = parts["rotation_angle"]
        h["entry/sample/rotation_angle"].attrs["units"] = "degree"
        if mutate is not None:
            mutate(h)


def _replace(h, name, value):
    if name in h:
        del h[name]
    h[name] = value


def _nxtomo_mutation(name, frame, pix):
    """The function that breaks a valid raw NXtomo file in the way ``name`` says.

    ``frame`` is a projection frame (4 .. 4+NA-1), ``pix`` a (row, column).
    """
    D = "entry/instrument/detector/data"
    K = "entry/instrument/detector/image_key"
    A = "entry/sample/rotation_angle"
    px = "entry/instrument/detector/x_pixel_size"

    def set_value(key, index, value):
        def f(h):
            a = h[key][()]
            a[index] = value
            _replace(h, key, a)
        return f

    def set_attr(key, attr, value):
        return lambda h: h[key].attrs.__setitem__(attr, value)

    return {
        "no data": lambda h: h.__delitem__(D),
        "1-D data": lambda h: _replace(h, D, np.ones(9 + NA)),
        "4-D data": lambda h: _replace(h, D, np.ones((4 + NA, 1, ROWS, ND))),
        "empty data": lambda h: _replace(h, D, np.ones((0, ROWS, ND))),
        "text data": lambda h: _replace(h, D, np.full((4 + NA, ROWS, ND), b"ab")),
        "complex data": lambda h: _replace(h, D, np.ones((4 + NA, ROWS, ND), complex)),
        "data is a group": lambda h: (h.__delitem__(D), h.create_group(D)),
        "dangling data link": lambda h: (h.__delitem__(D),
                                         h.__setitem__(D, h5py.SoftLink("/nowhere"))),
        "NaN in a projection": set_value(D, (frame,) + pix, np.nan),
        "Inf in a projection": set_value(D, (frame,) + pix, np.inf),
        "projection below dark": set_value(D, (frame,) + pix, 0.0),
        "flat below dark": lambda h: (set_value(D, (2,) + pix, 0.0)(h),
                                      set_value(D, (3,) + pix, 0.0)(h)),
        "NaN in a flat": set_value(D, (2,) + pix, np.nan),
        "image_key too short": lambda h: _replace(h, K, np.zeros(NA, np.int8)),
        "image_key value 7": set_value(K, frame, 7),
        "no projections": lambda h: _replace(h, K, np.ones(4 + NA, np.int8)),
        "darks without flats": lambda h: _replace(
            h, K, np.array([2, 2, 3, 3] + [0] * NA, np.int8)),
        "angles wrong length": lambda h: _replace(h, A, np.arange(NA + 2) * 10.0),
        "angles NaN": set_value(A, frame, np.nan),
        "repeated angles": set_value(A, frame, 0.0 if frame != 4 else 36.0),
        "angle units": set_attr(A, "units", "furlongs"),
        "pixel size NaN": lambda h: _replace(h, px, np.nan),
        "pixel size negative": lambda h: _replace(h, px, -0.1),
        "pixel size units": set_attr(px, "units", "parsec"),
        "quantity bogus": set_attr(D, "quantity", "bogus"),
        "declared line integrals with flats": set_attr(D, "quantity", "line_integral"),
        "bad ctuq geometry JSON": lambda h: h.__setitem__("entry/ctuq/geometry", "{not json"),
        "ctuq geometry contradicts": lambda h: h.__setitem__(
            "entry/ctuq/geometry", json.dumps({"detector_spacing": 0.5})),
        "ground truth wrong shape": lambda h: h.__setitem__(
            "entry/sample/ground_truth", np.ones((ROWS, 3, 3))),
        "two entries": lambda h: h.copy("entry", "entry2"),
    }[name]


NXTOMO_MUTATIONS = [
    "no data", "1-D data", "4-D data", "empty data", "text data", "complex data",
    "data is a group", "dangling data link", "NaN in a projection", "Inf in a projection",
    "projection below dark", "flat below dark", "NaN in a flat", "image_key too short",
    "image_key value 7", "no projections", "darks without flats", "angles wrong length",
    "angles NaN", "repeated angles", "angle units", "pixel size NaN", "pixel size negative",
    "pixel size units", "quantity bogus", "declared line integrals with flats",
    "bad ctuq geometry JSON", "ctuq geometry contradicts", "ground truth wrong shape",
    "two entries",
]


#: what each NXtomo mutation's error must mention (its field, or else its message)
NXTOMO_EXPECTED = {
    "no data": "detector/data", "1-D data": "detector/data", "4-D data": "detector/data",
    "empty data": "empty", "text data": "non-numeric", "complex data": "complex",
    "data is a group": "group", "dangling data link": "detector/data",
    "NaN in a projection": "NaN", "Inf in a projection": "infinite",
    "projection below dark": "intensity - dark", "flat below dark": "image_key==1",
    "NaN in a flat": "image_key==1", "image_key too short": "image_key",
    "image_key value 7": "image_key", "no projections": "no projection",
    "darks without flats": "image_key==2", "angles wrong length": "rotation_angle",
    "angles NaN": "rotation_angle", "repeated angles": "repeated", "angle units": "@units",
    "pixel size NaN": "x_pixel_size", "pixel size negative": "pixel",
    "pixel size units": "x_pixel_size@units", "quantity bogus": "@quantity",
    "declared line integrals with flats": "raw", "bad ctuq geometry JSON": "/entry/ctuq/geometry",
    "ctuq geometry contradicts": "detector_spacing", "ground truth wrong shape": "ground_truth",
    "two entries": "entries",
}


def _draw_nxtomo_mutation(draw, name=None):
    name = name or draw(st.sampled_from(NXTOMO_MUTATIONS))
    frame = draw(st.integers(4, 4 + NA - 1))
    pix = (draw(st.integers(0, ROWS - 1)), draw(st.integers(0, ND - 1)))
    return _nxtomo_mutation(name, frame, pix)


# -- makers: each writes one malformed input into `folder` ------------------------
def make_npy_shape(draw, folder, rng):
    shape = draw(st.sampled_from([(), (NA,), (1, 1, NA, ND), (0, ND), (NA, 0), (2, 0, ND)]))
    np.save(folder / "s.npy", rng.random(shape))
    return folder / "s.npy", {"n_angles": NA}


def make_npy_dtype(draw, folder, rng):
    dtype = draw(st.sampled_from(["c8", "c16", "?", "U4", "S3", "M8[s]", "m8[s]",
                                  [("a", "f4"), ("b", "i2")]]))
    np.save(folder / "s.npy", np.zeros((NA, ND), dtype=dtype))
    return folder / "s.npy", {"n_angles": NA}


def make_npy_nonfinite(draw, folder, rng):
    a = _valid_sino(rng).astype(draw(st.sampled_from(["f4", "f8"])))
    bad = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e39]))
    if bad == 1e39:
        a = a.astype("f8")                          # overflows float32 on the cast
    n = draw(st.integers(1, 3))
    for _ in range(n):
        a[draw(st.integers(0, NA - 1)), draw(st.integers(0, ND - 1))] = bad
    np.save(folder / "s.npy", a)
    return folder / "s.npy", {"n_angles": NA}


def make_npy_angles(draw, folder, rng):
    np.save(folder / "s.npy", _valid_sino(rng))
    how = draw(st.sampled_from(["count", "n_angles", "nan", "repeated", "none", "raw_neg"]))
    if how == "count":
        n = draw(st.integers(1, 12).filter(lambda k: k != NA))
        return folder / "s.npy", {"angles": np.arange(n) * 10.0}
    if how == "n_angles":
        return folder / "s.npy", {"n_angles": draw(st.integers(1, 12).filter(lambda k: k != NA))}
    if how == "nan":
        ang = np.arange(NA) * 10.0
        ang[draw(st.integers(0, NA - 1))] = np.nan
        return folder / "s.npy", {"angles": ang}
    if how == "repeated":
        return folder / "s.npy", {"angles": [0.0] * NA}
    if how == "raw_neg":
        a = _valid_sino(rng)
        a[draw(st.integers(0, NA - 1)), draw(st.integers(0, ND - 1))] = -1.0
        np.save(folder / "s.npy", a)
        return folder / "s.npy", {"n_angles": NA, "raw": True}
    return folder / "s.npy", {}


def make_sidecar(draw, folder, rng):
    np.save(folder / "s.npy", _valid_sino(rng))
    text = draw(st.sampled_from([
        "{not json", "[1, 2, 3]", json.dumps({"colour": "blue"}),
        json.dumps({"angles_deg": list(range(NA + 1))}),
        json.dumps({"angles_deg": list(range(NA)), "pixel_size": -1}),
        json.dumps({"angles_deg": list(range(NA)), "image_shape": [100, 100]}),
        json.dumps({"angles_deg": list(range(NA)), "n_detector": ND + 1}),
        json.dumps({"angles_deg": list(range(NA)), "beam": "cone"}),
        json.dumps({"angles_deg": list(range(NA)), "beam": "fan"}),
        json.dumps({"geometry": {"angles_deg": list(range(NA))}, "extra": 1}),
    ]))
    name = draw(st.sampled_from(["s.json", "s.npy.json"]))
    (folder / name).write_text(text)
    return folder / "s.npy", {}


def make_npz(draw, folder, rng):
    a = _valid_sino(rng)
    how = draw(st.sampled_from(["ambiguous", "geometry_text", "angles_count", "gt_shape",
                                "pickled", "meta_list", "missing_key"]))
    path = folder / "s.npz"
    if how == "ambiguous":
        np.savez(path, x=a, y=a, angles_deg=np.arange(NA) * 1.0)
    elif how == "geometry_text":
        np.savez(path, sinogram=a, geometry=draw(st.sampled_from(["{oops", "42", "null"])))
    elif how == "angles_count":
        np.savez(path, sinogram=a, angles_deg=np.arange(NA + 1) * 1.0)
    elif how == "gt_shape":
        np.savez(path, sinogram=a, angles_deg=np.arange(NA) * 1.0, ground_truth=np.ones((3, 3)))
    elif how == "pickled":
        np.savez(path, sinogram=np.array([a, None], dtype=object))
    elif how == "meta_list":
        np.savez(path, sinogram=a, angles_deg=np.arange(NA) * 1.0, meta=json.dumps([1]))
    else:
        np.savez(path, sinogram=a, angles_deg=np.arange(NA) * 1.0)
        return path, {"dataset": "nope"}
    return path, {}


def make_nxtomo(draw, folder, rng):
    _raw_nxtomo(folder / "s.nxs", _draw_nxtomo_mutation(draw))
    return folder / "s.nxs", {}


def make_dxchange(draw, folder, rng):
    how = draw(st.sampled_from(["theta_len", "white_shape", "white_nan", "white_le_dark",
                                "no_theta", "1d", "theta_text"]))
    p = rng.uniform(0.1, 2, (NA, ROWS, ND))
    white = rng.uniform(500, 600, (3, ROWS, ND))
    dark = rng.uniform(5, 10, (2, ROWS, ND))
    proj = (white.mean(0) - dark.mean(0)) * np.exp(-p) + dark.mean(0)
    theta = np.arange(NA) * 36.0
    if how == "theta_len":
        theta = np.arange(NA + 1) * 30.0
    elif how == "white_shape":
        white = white[:, :, :-1]
    elif how == "white_nan":
        white[0, 0, draw(st.integers(0, ND - 1))] = np.nan
    elif how == "white_le_dark":
        white[:, 0, draw(st.integers(0, ND - 1))] = 1.0
    elif how == "1d":
        proj = proj.reshape(-1)
    with h5py.File(folder / "s.h5", "w") as h:
        h["exchange/data"] = proj
        h["exchange/data_white"] = white
        h["exchange/data_dark"] = dark
        if how == "theta_text":
            h["exchange/theta"] = np.array([b"a"] * NA)
        elif how != "no_theta":
            h["exchange/theta"] = theta
    return folder / "s.h5", {}


def make_plain_hdf5(draw, folder, rng):
    how = draw(st.sampled_from(["angles", "beam", "geometry_json", "image_shape", "group",
                                "missing", "n_detector", "unknown_attr_json", "two"]))
    with h5py.File(folder / "s.h5", "w") as h:
        ds = h.create_dataset("g/sino", data=_valid_sino(rng))
        ds.attrs["angles_deg"] = np.arange(NA) * 36.0
        if how == "angles":
            ds.attrs["angles_deg"] = np.arange(NA - 1) * 36.0
        elif how == "beam":
            ds.attrs["beam"] = "cone"
        elif how == "geometry_json":
            ds.attrs["geometry"] = "{broken"
        elif how == "image_shape":
            ds.attrs["image_shape"] = [1]
        elif how == "n_detector":
            ds.attrs["n_detector"] = ND + 3
        elif how == "unknown_attr_json":
            ds.attrs["geometry"] = json.dumps({"wavelength": 1})
        elif how == "two":
            h["h/other"] = np.ones(3)
            return folder / "s.h5", {}
    kw = {"dataset": {"group": "g", "missing": "g/nothing"}.get(how, "g/sino")}
    return folder / "s.h5", kw


def _valid_files(folder, rng):
    """Valid files of each format, and where their essential bytes end."""
    g = Geometry.parallel(6, n_angles=NA, n_detector=ND)
    write_sinogram(folder / "own.nxs", Sinogram(_valid_sino(rng), g, {"seed": 1},
                                                rng.random((6, 6))))
    _raw_nxtomo(folder / "raw.nxs")
    np.save(folder / "a.npy", _valid_sino(rng))
    np.savez(folder / "a.npz", sinogram=_valid_sino(rng), angles_deg=np.arange(NA) * 1.0)
    tifffile.imwrite(folder / "a.tif", _valid_sino(rng, (2, NA, ND)), photometric="minisblack")
    with tifffile.TiffFile(folder / "a.tif") as t:
        tif_end = max(o + n for p in t.pages for o, n in zip(p.dataoffsets, p.databytecounts))
    ends = {name: os.path.getsize(folder / name) for name in
            ("own.nxs", "raw.nxs", "a.npy", "a.npz")}
    ends["a.tif"] = tif_end
    return ends


def make_truncated(draw, folder, rng):
    src = folder / "valid"
    src.mkdir()
    ends = _valid_files(src, rng)
    name = draw(st.sampled_from(sorted(ends)))
    blob = (src / name).read_bytes()
    n = draw(st.integers(0, ends[name] - 1))
    path = folder / ("cut" + os.path.splitext(name)[1])
    path.write_bytes(blob[:n])
    return path, {"n_angles": NA} if name in ("a.npy", "a.tif") else {}


def make_garbage(draw, folder, rng):
    blob = draw(st.binary(min_size=0, max_size=600))
    ext = draw(st.sampled_from([".h5", ".nxs", ".npy", ".npz", ".tif", ".txt", ""]))
    path = folder / ("g" + ext)
    path.write_bytes(blob)
    return path, {"n_angles": NA}


def make_not_a_file(draw, folder, rng):
    how = draw(st.sampled_from(["directory", "missing", "result"]))
    if how == "directory":
        (folder / "d.nxs").mkdir()
        return folder / "d.nxs", {}
    if how == "result":
        write_result(folder / "r.h5", Result(np.zeros((4, 4)), np.ones((4, 4))))
        return folder / "r.h5", {}
    return folder / "missing.nxs", {}


MAKERS = {f.__name__[5:]: f for f in (
    make_npy_shape, make_npy_dtype, make_npy_nonfinite, make_npy_angles, make_sidecar,
    make_npz, make_nxtomo, make_dxchange, make_plain_hdf5, make_truncated, make_garbage,
    make_not_a_file)}


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _check_read_fails(root, make):
    """Make a malformed input, read it and write it on: an InputError naming
    the file, nothing in the output folder, the input folder untouched."""
    inputs, outputs = root / "in", root / "out"
    inputs.mkdir()
    outputs.mkdir()
    path, kwargs = make(inputs)
    before = _tree(inputs)
    with pytest.raises(InputError) as ei:
        sino = read_sinogram(path, **kwargs)
        write_sinogram(outputs / "out.nxs", sino)
    assert ei.value.file is not None                # the file is named
    assert _tree(outputs) == []                     # nothing written
    assert _tree(inputs) == before                  # input untouched
    return ei.value


@settings(max_examples=300, **SETTINGS)
@given(data=st.data(), kind=st.sampled_from(sorted(MAKERS)))
def test_malformed_sinogram_files_are_input_errors(tmp_path_factory, data, kind):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    _check_read_fails(tmp_path_factory.mktemp("fuzz"),
                      lambda folder: MAKERS[kind](data.draw, folder, rng))


@pytest.mark.parametrize("mutation", sorted(NXTOMO_EXPECTED))
@settings(max_examples=4, **SETTINGS)
@given(data=st.data())
def test_every_nxtomo_mutation_is_an_input_error(tmp_path_factory, mutation, data):
    def make(folder):
        _raw_nxtomo(folder / "s.nxs", _draw_nxtomo_mutation(data.draw, mutation))
        return folder / "s.nxs", {}
    err = _check_read_fails(tmp_path_factory.mktemp("nxmut"), make)
    assert NXTOMO_EXPECTED[mutation] in f"{err.field} {err.message}"


# -- result files ------------------------------------------------------------------
def _valid_result(rng):
    g = Geometry.parallel(4, n_angles=3)
    return Result(rng.random((4, 4)), rng.random((4, 4)), samples=rng.random((2, 4, 4)),
                  geometry=g, config={"a": {"b": 1}}, hyperparameters={"s": 0.5},
                  em_trace=[{"s": 0.5}], metrics={"psnr": 20.0}, seed=3, device="cpu")


def _result_mutation(name, i, j):
    E = "entry"

    def replace(key, value):
        return lambda h: _replace(h, f"{E}/{key}", value)

    def delete(key):
        return lambda h: h.__delitem__(f"{E}/{key}")

    def nan_in_data(h):
        a = h[f"{E}/data/data"][()]
        a[i, j] = np.nan
        _replace(h, f"{E}/data/data", a)

    return {
        "no data": delete("data/data"),
        "no errors": delete("data/data_errors"),
        "no process": delete("reconstruction"),
        "errors shape": replace("data/data_errors", np.ones((4, 5))),
        "1-D data": replace("data/data", np.ones(4)),
        "negative std": replace("data/data_errors", -np.ones((4, 4))),
        "NaN in data": nan_in_data,
        "text data": replace("data/data", np.full((4, 4), b"x")),
        "samples shape": replace("uncertainty/samples", np.ones((2, 4, 5))),
        "config not JSON": replace("reconstruction/parameters/config_json", "{nope"),
        "config a list": replace("reconstruction/parameters/config_json", "[1, 2]"),
        "trace an object": replace("reconstruction/em_trace_json", "{}"),
        "hyperparameters a number": replace("reconstruction/hyperparameters_json", "3"),
        "definition": replace("definition", "NXtomo"),
        "seed float": replace("reconstruction/seed", 1.5),
        "geometry incomplete": replace("reconstruction/geometry/json",
                                       json.dumps({"n_detector": 7})),
        "geometry contradicts": replace("reconstruction/geometry/json", json.dumps(
            {"image_shape": [5, 5], "n_detector": 9, "angles_deg": [1, 2, 3]})),
        "metric text": replace("metrics/psnr", b"high"),
        "ground truth shape": replace("sample/ground_truth", np.ones((3, 3))),
    }[name]


RESULT_MUTATIONS = [
    "no data", "no errors", "no process", "errors shape", "1-D data", "negative std",
    "NaN in data", "text data", "samples shape", "config not JSON", "config a list",
    "trace an object", "hyperparameters a number", "definition", "seed float",
    "geometry incomplete", "geometry contradicts", "metric text", "ground truth shape",
]


@settings(max_examples=100, **SETTINGS)
@given(data=st.data())
def test_malformed_result_files_are_input_errors(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("fuzzres")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    path = root / "r.h5"
    write_result(path, _valid_result(rng))
    if data.draw(st.booleans(), label="truncate"):
        blob = path.read_bytes()
        path.write_bytes(blob[:data.draw(st.integers(0, len(blob) - 1), label="cut")])
    else:
        name = data.draw(st.sampled_from(RESULT_MUTATIONS), label="mutation")
        with h5py.File(path, "a") as h:
            _result_mutation(name, data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3)))(h)
    with pytest.raises(InputError) as ei:
        read_result(path)
    assert ei.value.file is not None
    assert _tree(root) == ["r.h5"]


@pytest.mark.parametrize("mutation", RESULT_MUTATIONS)
def test_every_result_mutation_is_an_input_error(tmp_path, mutation):
    path = tmp_path / "r.h5"
    write_result(path, _valid_result(np.random.default_rng(5)))
    with h5py.File(path, "a") as h:
        _result_mutation(mutation, 1, 2)(h)
    with pytest.raises(InputError) as ei:
        read_result(path)
    assert ei.value.file is not None and _tree(tmp_path) == ["r.h5"]


@settings(max_examples=100, **SETTINGS)
@given(data=st.data())
def test_malformed_results_are_not_written(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("fuzzwrite")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    how = data.draw(st.sampled_from(["nan", "inf_std", "neg_var", "shape", "samples", "ndim",
                                     "config_object", "config_key", "metric_name",
                                     "metric_value", "seed", "exists", "geometry"]))
    rec, std = rng.random((4, 4)), rng.random((4, 4))
    kw: dict = {}
    target = root / "r.h5"
    with pytest.raises(InputError):
        if how == "nan":
            rec[data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))] = np.nan
        elif how == "inf_std":
            std[0, data.draw(st.integers(0, 3))] = np.inf
        elif how == "neg_var":
            kw["variance"] = -rng.random((4, 4))
        elif how == "shape":
            std = rng.random((4, data.draw(st.integers(1, 3))))
        elif how == "samples":
            kw["samples"] = rng.random((2, 4, data.draw(st.integers(5, 6))))
        elif how == "ndim":
            rec = rng.random(data.draw(st.sampled_from([(4,), (1, 1, 4, 4)])))
        elif how == "config_object":
            kw["config"] = {"x": data.draw(st.sampled_from([object(), {1, 2}, b"bytes"]))}
        elif how == "config_key":
            kw["config"] = {"x": {3: "three"}}
        elif how == "metric_name":
            kw["metrics"] = {data.draw(st.sampled_from(["a/b", "", ".."])): 1.0}
        elif how == "metric_value":
            kw["metrics"] = {"psnr": "high"}
        elif how == "seed":
            kw["seed"] = data.draw(st.sampled_from([1.5, "7", True]))
        elif how == "exists":
            target.mkdir()                          # a directory where the file should go
        elif how == "geometry":
            kw["geometry"] = Geometry.parallel(5, n_angles=3)
        write_result(target, Result(rec, std, **kw))
    assert _tree(root) == (["r.h5"] if how == "exists" else [])
