"""The real-scan checks wired into the product: the consistency stage (whitened
residual, χ²/dof, verdict) in the result and its file, the stage timings in the
provenance, warnings on the data, ``center_offset='auto'``."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
import torch

import ctuq
from ctuq.data.geometry import Geometry
from ctuq.data.io import Result, Sinogram, read_result
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import digits
from ctuq.data.simulate import simulate_sinogram
from ctuq.recon.consistency import check_consistency, data_warnings

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ctuq.ReconstructionConfig(
    preset="reference-28", threads=1, dip={"iterations": 30},
    uncertainty={"em_steps": 1, "n_samples": 2, "predictive_samples": 4, "stored_samples": 0,
                 "predcp": False, "preconditioner_rank": 8, "cg_max_iter": 20})
ANGLES_DEG = np.linspace(0.0, 180.0, 20, endpoint=False)


@pytest.fixture(scope="module")
def measured():
    g = Geometry.parallel(28, angles=np.deg2rad(ANGLES_DEG))
    truth = digits(1)[0]
    y, sigma = simulate_sinogram(truth, RayTransform(g), 0.05, seed=1)
    return y.numpy(), sigma, truth, g


@pytest.fixture(scope="module")
def result(measured):
    y, sigma, _, _ = measured
    return ctuq.reconstruct(y, TINY.merged({"noise_std": sigma}), angles=ANGLES_DEG,
                            image_size=28)


# -- the consistency check itself ------------------------------------------------------
def test_residual_and_chi2_agree_with_a_dense_computation(measured):
    y, sigma, truth, g = measured
    op = RayTransform(g, backend="matrix")
    dense = op.A(torch.eye(28 * 28).reshape(-1, 28, 28)).reshape(28 * 28, -1).T.double()
    x = torch.as_tensor(truth, dtype=torch.float32)
    rec, r = check_consistency(torch.as_tensor(y), op, x, sigma ** 2, {"gamma_total": 100.0})
    want = (y.astype(np.float64).ravel() - dense.numpy() @ truth.astype(np.float64).ravel())
    want = want.reshape(y.shape) / sigma
    np.testing.assert_allclose(r, want, rtol=1e-4, atol=1e-4)
    assert rec["effective_parameters"] == 100.0 and rec["dof"] == y.size - 100.0
    assert rec["chi2_dof"] == pytest.approx(float((want ** 2).sum()) / (y.size - 100), rel=1e-4)
    assert len(rec["chi2_per_angle"]) == y.shape[0]
    # the truth at the true noise level is consistent; at a tenth of it, not
    assert rec["verdict"] == "ok", rec["reason"]
    bad, _ = check_consistency(torch.as_tensor(y), op, x, (sigma / 10) ** 2, {})
    assert bad["verdict"] == "misfit" and bad["effective_parameters"] is None
    assert bad["dof"] == y.size


def test_gamma_beyond_the_rays_falls_back_to_the_ray_count(measured):
    y, sigma, truth, g = measured
    op = RayTransform(g)
    rec, _ = check_consistency(torch.as_tensor(y), op, torch.as_tensor(truth), sigma ** 2,
                               {"gamma_total": float(y.size + 5)})
    assert rec["effective_parameters"] is None and rec["dof"] == y.size


# -- in the pipeline's result -----------------------------------------------------------
def test_result_records_the_check_of_the_reconstruction_shown(result, measured):
    y, sigma, _, g = measured
    d = result.diagnostics
    assert set(d) >= {"chi2_dof", "chi2_per_angle", "verdict", "reason", "threshold", "warnings"}
    assert d["verdict"] in ("ok", "misfit") and d["warnings"] == []
    assert result.residual.shape == y.shape
    # recomputed from the result's own numbers: the reconstruction and its noise level
    sigma2 = result.hyperparameters["sigma2"]
    op = RayTransform(result.geometry)
    fwd = op.A(torch.as_tensor(result.reconstruction)).numpy()
    np.testing.assert_allclose(result.residual, (y - fwd) / np.sqrt(sigma2), rtol=1e-3,
                               atol=1e-3)
    assert d["chi2_dof"] == pytest.approx(float((result.residual.astype(np.float64) ** 2).sum())
                                          / d["dof"], rel=1e-4)
    assert (d["verdict"] == "misfit") == (d["chi2_dof"] > d["threshold"]
                                          or max(d["chi2_per_angle"]) > 4 * d["threshold"])


def test_a_misfit_is_logged(measured, caplog):
    y, sigma, _, _ = measured
    # a noise level far below the data's: the residual is not explained
    with caplog.at_level(logging.WARNING, logger="ctuq.recon.pipeline"):
        r = ctuq.reconstruct(y, TINY.merged({"noise_std": sigma / 20,
                                             "dip": {"iterations": 5}}),
                             angles=ANGLES_DEG, image_size=28)
    assert r.diagnostics["verdict"] == "misfit"
    assert any("misfit" in rec.getMessage() for rec in caplog.records)


def test_stage_timings_and_counts_in_the_provenance(result):
    st = result.provenance["stages"]
    sec, counts = st["seconds"], st["counts"]
    for name in ("fbp", "dip", "uncertainty", "em", "predictive", "model_error",
                 "consistency", "metrics", "total"):
        assert sec[name] >= 0, name
    assert sec["em"] + sec["predictive"] <= sec["uncertainty"] + 1e-6
    assert sum(sec[k] for k in ("fbp", "dip", "uncertainty", "model_error", "consistency")) \
        <= sec["total"] + 1e-6
    assert counts["dip_iterations"] == 30
    assert counts["em_steps"] == result.hyperparameters["em_steps"]
    assert counts["solver_iterations"] == sum(t["solver_iterations"] for t in result.em_trace)


def test_diagnostics_round_trip_through_the_file(result, tmp_path):
    p = result.save(tmp_path / "r.h5")
    back = read_result(p)
    assert back == result
    assert back.diagnostics == result.diagnostics
    np.testing.assert_array_equal(back.residual, result.residual)
    with h5py.File(p, "r") as f:
        g = f["entry/diagnostics"]
        assert g.attrs["verdict"] == result.diagnostics["verdict"]
        assert g.attrs["chi2_dof"] == pytest.approx(result.diagnostics["chi2_dof"])
        assert g["residual"].shape == result.residual.shape
        assert g["chi2_per_angle"].shape == (len(ANGLES_DEG),)


def test_a_file_without_diagnostics_still_reads(result, tmp_path):
    p = result.save(tmp_path / "r.h5")
    with h5py.File(p, "a") as f:
        del f["entry/diagnostics"]
    back = read_result(p)
    assert back.diagnostics == {} and back.residual is None
    np.testing.assert_array_equal(back.reconstruction, result.reconstruction)


def test_a_residual_of_the_wrong_shape_is_refused(result):
    from ctuq.errors import InputError

    with pytest.raises(InputError, match="residual"):
        Result(reconstruction=result.reconstruction, geometry=result.geometry,
               residual=np.zeros((3, 4), np.float32))
