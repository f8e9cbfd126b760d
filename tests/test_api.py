"""The Python API (issue 22 item 4) and what result files hold (item 5, issue 25 item 6):
``ctuq.reconstruct(array, angles=...)``, ``Result.save``, a short repr, the
fitted posterior kept in memory, units on every physical dataset, integer
counts as integers, no empty arrays, provenance."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import ctuq
from ctuq.data.io import Result, read_result
from ctuq.errors import InputError

from conftest import digit_sinogram

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ctuq.ReconstructionConfig(
    preset="reference-28", threads=1, dip={"iterations": 30},
    uncertainty={"em_steps": 1, "n_samples": 2, "predictive_samples": 16, "stored_samples": 2,
                 "predcp": False, "preconditioner_rank": 8, "cg_max_iter": 40})
ANGLES_DEG = np.linspace(0.0, 180.0, 20, endpoint=False)


@pytest.fixture(scope="module")
def measured():
    scan = digit_sinogram(angles=np.deg2rad(ANGLES_DEG))
    return scan.data, scan.meta["noise_std"], scan.ground_truth, scan.geometry


@pytest.fixture(scope="module")
def result(measured):
    y, sigma, _, _ = measured
    return ctuq.reconstruct(y, TINY.merged({"noise_std": sigma}), angles=ANGLES_DEG,
                            image_size=28)


def test_reconstruct_an_array_with_angles(result, measured):
    _, _, _, g = measured
    assert result.reconstruction.shape == (28, 28) and result.std.shape == (28, 28)
    assert result.geometry == g  # degrees in, the same geometry as radians
    assert np.all(result.std > 0)


def test_array_without_angles_says_what_to_give(measured):
    y = measured[0]
    with pytest.raises(InputError, match="angles") as ei:
        ctuq.reconstruct(y, TINY)
    assert "angle_first" in str(ei.value) and "Sinogram" not in str(ei.value)
    with pytest.raises(InputError, match="file name"):
        ctuq.reconstruct("scan.nxs", TINY)
    with pytest.raises(InputError, match="pixel_size"):
        ctuq.reconstruct(y, TINY, angles=ANGLES_DEG, pixel_size=-1)


def test_first_last_count_and_radians(measured):
    from ctuq.recon.pipeline import as_sinogram

    y, _, _, g = measured
    a = as_sinogram(y, angle_first=4.5, angle_last=175.5, n_angles=20, image_size=28)
    np.testing.assert_allclose(a.geometry.angles_deg, np.linspace(4.5, 175.5, 20))
    b = as_sinogram(y, angles=np.deg2rad(ANGLES_DEG), angle_unit="rad", image_size=28)
    assert b.geometry == g
    with pytest.raises(InputError, match="angle_unit"):
        as_sinogram(y, angles=ANGLES_DEG, angle_unit="gradians")


def test_short_repr(result):
    text = repr(result)
    assert len(text) < 300, text
    assert "28 x 28" in text and "mean std" in text and "posterior in memory" in text
    assert "\n" not in text


def test_posterior_stays_with_the_result(result):
    post = result.posterior
    a, b = post.sample(4, seed=1), post.sample(4, seed=1)
    assert a.shape == (4, 28, 28)
    np.testing.assert_array_equal(a, b)                       # seeded: reproducible
    assert not np.allclose(post.sample(4), post.sample(4))   # fresh draws otherwise
    # more samples estimate the same std map as the pipeline's
    std = post.std(64, seed=5)
    corr = np.corrcoef(std.ravel(), result.std.ravel())[0, 1]
    assert corr > 0.8
    # the std of a region's mean: between 0 and the mean of its pixel stds
    region = (slice(10, 18), slice(10, 18))
    s = post.region_std(region, n=64, seed=3)
    assert 0 < s <= float(result.std[region].mean()) * 1.5
    with pytest.raises(InputError, match="region"):
        post.region_std(np.zeros((28, 28), bool))


def test_save_round_trip_without_the_posterior(result, tmp_path):
    path = result.save(tmp_path / "r.h5")
    back = read_result(path)
    assert back == result and back.posterior is None
    with pytest.raises(InputError, match="already exists"):
        result.save(tmp_path / "r.h5")


def test_provenance_is_recorded(result, tmp_path):
    prov = read_result(result.save(tmp_path / "p.h5")).provenance
    for lib in ("torch", "numpy", "h5py", "astra", "odl", "ctuq"):
        assert prov["versions"][lib] not in ("", None, "not installed"), lib
    assert prov["threads"] == 1 and prov["device"] == "cpu"
    assert prov["request"]["seed"] == 0
    with h5py.File(tmp_path / "p.h5") as h:
        assert h["entry/reconstruction/provenance/versions/torch"].asstr()[()] \
            == torch.__version__
        assert h["entry/reconstruction/provenance/threads"][()] == 1


def _walk(h):
    out = {}
    h.visititems(lambda name, obj: out.__setitem__(name, obj)
                 if isinstance(obj, h5py.Dataset) else None)
    return out


PHYSICAL = {  # dataset -> units
    "entry/data/data": "1/mm", "entry/data/data_errors": "1/mm",
    "entry/data/x": "mm", "entry/data/y": "mm",
    "entry/sample/ground_truth": "1/mm",
    "entry/uncertainty/variance": "1/mm^2", "entry/uncertainty/samples": "1/mm",
    "entry/uncertainty/fbp": "1/mm", "entry/uncertainty/dip": "1/mm",
    "entry/reconstruction/geometry/angles_rad": "rad",
    "entry/reconstruction/geometry/pixel_size": "mm",
    "entry/reconstruction/geometry/detector_spacing": "mm",
    "entry/reconstruction/geometry/center_offset": "pixel",
    "entry/metrics/psnr": "dB",
}


def test_units_integers_and_no_empty_arrays(tmp_path, measured):
    y, sigma, truth, g = measured
    from ctuq.data.io import Sinogram

    r = ctuq.reconstruct(Sinogram(y, g, {"noise_std": sigma}, ground_truth=truth), TINY)
    path = r.save(tmp_path / "u.h5")
    with h5py.File(path) as h:
        datasets = _walk(h)
        for name, unit in PHYSICAL.items():
            assert name in datasets, name
            assert datasets[name].attrs.get("units") == unit, name
        for name, ds in datasets.items():
            assert ds.shape is None or ds.size > 0, f"empty {name} {ds.shape}"
        assert datasets["entry/reconstruction/seed"].dtype.kind == "i"
        assert datasets["entry/reconstruction/geometry/image_shape"].dtype.kind == "i"
        assert datasets["entry/reconstruction/geometry/n_detector"].dtype.kind == "i"
        assert h["entry/reconstruction/em_trace"].attrs["n_steps"].dtype.kind == "i"
        params = h["entry/reconstruction/parameters"]
        assert params["dip/iterations"].dtype.kind == "i"
        assert params["uncertainty/laplace/n_samples"].dtype.kind == "i"
        assert params["timings_s/dip"].attrs["units"] == "s"
        for name, ds in datasets.items():  # timings are seconds, counts never float
            if name.startswith("entry/reconstruction/em_trace/") and name.endswith("step"):
                assert ds.dtype.kind == "i", name


def test_units_with_nexusformat(result, tmp_path):
    nx = pytest.importorskip("nexusformat.nexus")
    path = result.save(tmp_path / "n.nxs")
    root = nx.nxload(str(path))
    try:
        data = root["entry/data"]
        assert data.nxsignal.nxname == "data"
        assert data.nxsignal.attrs["units"] == "1/mm"
        assert [a.nxname for a in data.nxaxes] == ["y", "x"]
        assert all(a.attrs["units"] == "mm" for a in data.nxaxes)
        assert root["entry/data/data_errors"].attrs["units"] == "1/mm"
        assert root["entry/reconstruction/geometry/pixel_size"].attrs["units"] == "mm"
    finally:
        root.nxfile.close()


def test_single_image_result(tmp_path, result):
    std_only = Result(std=result.std, geometry=result.geometry, units=result.units)
    back = read_result(std_only.save(tmp_path / "std.h5"))
    assert back.reconstruction is None and np.array_equal(back.std, result.std)
    assert back.units == "1/mm"
    with pytest.raises(InputError, match="at least one image"):
        Result()


def test_solves_stopped_above_tolerance_are_a_warning_in_the_result(measured):
    # one CG iteration without a preconditioner cannot reach 1e-3: the run says so,
    # with the residual, instead of returning a silently wrong std
    y, sigma, _, _ = measured
    capped = TINY.merged({"noise_std": sigma, "uncertainty": {
        "cg_max_iter": 1, "preconditioner_rank": 1}})
    res = ctuq.reconstruct(y, capped, angles=ANGLES_DEG, image_size=28)
    (msg,) = [w for w in res.diagnostics["warnings"] if "linear solves" in w]
    assert f"of {len(res.em_trace)} EM steps" in msg and "preconditioner_rank" in msg
    assert all(t["solver_residual"] > 1e-3 for t in res.em_trace)
    # a run of the same scan whose solves converge carries no such warning
    solved = ctuq.reconstruct(y, TINY.merged({"noise_std": sigma, "uncertainty": {
        "cg_max_iter": 500, "preconditioner_rank": 200}}), angles=ANGLES_DEG, image_size=28)
    assert all(t["solver_converged"] for t in solved.em_trace)
    assert not [w for w in solved.diagnostics["warnings"] if "linear solves" in w]


def test_initial_scale_sketch_reaches_the_result_file(measured, result, tmp_path):
    """``initial_scale = "sketch"`` through the API: the first E-step's prior scale is
    the default's times the recorded factor, and the factor is in the saved file."""
    y, sigma, _, _ = measured
    res = ctuq.reconstruct(y, TINY.merged({"noise_std": sigma, "uncertainty": {
        "initial_scale": "sketch"}}), angles=ANGLES_DEG, image_size=28)
    factor = res.hyperparameters["initial_scale_factor"]
    assert factor > 0 and abs(np.log(factor)) > 1e-3
    assert res.em_trace[0]["a_b"][0] == pytest.approx(result.em_trace[0]["a_b"][0] * factor,
                                                      rel=1e-6)
    assert "initial_scale_factor" not in result.hyperparameters
    res.save(tmp_path / "r.h5")
    assert read_result(tmp_path / "r.h5").hyperparameters["initial_scale_factor"] == \
        pytest.approx(factor)


def test_initial_noise_residual_reaches_the_result_file_in_data_units(measured, tmp_path):
    """``initial_noise = "residual"`` with the noise level unknown: the first E-step's σ²
    is recorded in the data's units (the trace's), and scales with the data as c²."""
    y, _, _, _ = measured
    cfg = TINY.merged({"uncertainty": {"initial_noise": "residual", "em_steps": 1}})
    res = ctuq.reconstruct(y, cfg, angles=ANGLES_DEG, image_size=28)
    first = res.hyperparameters["initial_sigma2"]
    assert res.hyperparameters["data_scale"] != 1.0  # a unit conversion to get right
    assert res.em_trace[0]["sigma2"] == pytest.approx(first, rel=1e-6)
    scaled = ctuq.reconstruct(y * 1e3, cfg, angles=ANGLES_DEG, image_size=28)
    assert scaled.hyperparameters["initial_sigma2"] == pytest.approx(first * 1e6, rel=0.01)
    res.save(tmp_path / "r.h5")
    assert read_result(tmp_path / "r.h5").hyperparameters["initial_sigma2"] == \
        pytest.approx(first)


def test_solver_warnings_count_the_missed_steps_per_slice():
    from ctuq.recon.pipeline import solver_warnings

    ok = {"solver_converged": True, "solver_residual": 1e-4}
    missed = {"solver_converged": False, "solver_residual": 0.48}
    assert solver_warnings([[ok, ok]]) == []
    assert solver_warnings([[{"step": 0}]]) == []  # a method without solves
    (msg,) = solver_warnings([[ok, missed], [missed]])
    assert "2 of 3 EM steps (slices [0, 1])" in msg and "0.48" in msg
