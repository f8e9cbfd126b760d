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
from ctuq.recon.diagnostics import MISREGISTRATION_PX

from conftest import digit_sinogram

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ctuq.ReconstructionConfig(
    preset="reference-28", threads=1, dip={"iterations": 30},
    uncertainty={"em_steps": 1, "n_samples": 2, "predictive_samples": 4, "stored_samples": 0,
                 "predcp": False, "preconditioner_rank": 8, "cg_max_iter": 20})
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


def test_whitening_with_the_noise_model_not_the_inflated_learned_level(measured):
    """A wrong geometry inflates a learned σ² until χ²/dof ≈ 1; the problem's noise
    model (given or estimated from the air) is not inflated and sees the misfit."""
    from ctuq.recon.problem import NoiseModel

    y, sigma, truth, g = measured
    wrong = RayTransform(Geometry.parallel(28, angles=np.deg2rad(ANGLES_DEG),
                                           n_detector=g.n_detector, center_offset=5))
    yt = torch.as_tensor(y)
    x = torch.as_tensor(truth)
    with torch.no_grad():
        fwd = wrong.A(x).numpy().astype(np.float64)
    learned = float(np.mean((y - fwd) ** 2))       # what an EM would learn: χ²/m = 1
    old, _ = check_consistency(yt, wrong, x, learned, {})
    assert old["verdict"] == "ok" and old["noise_source"] == "method"
    assert old["chi2_dof"] == pytest.approx(1.0, rel=1e-3)
    for known in (True, False):
        rec, r = check_consistency(yt, wrong, x, learned, {}, noise=NoiseModel(sigma, known),
                                   misregistration=0.0)
        assert rec["verdict"] == "misfit" and rec["trustworthy"] is False
        assert rec["noise_source"] == ("given" if known else "estimated")
        assert rec["noise_var"] == pytest.approx(sigma ** 2)
        assert rec["noise_var_ratio"] == pytest.approx(learned / sigma ** 2) and learned > \
            10 * sigma ** 2
        assert rec["chi2_dof"] == pytest.approx(learned / sigma ** 2, rel=1e-3)
        np.testing.assert_allclose(r, (y - fwd) / sigma, rtol=1e-3, atol=1e-3)
    # the default tolerance of a quarter-pixel misregistration lowers χ², yet not to 1
    tol, _ = check_consistency(yt, wrong, x, learned, {}, noise=NoiseModel(sigma, False))
    assert tol["misregistration"] == MISREGISTRATION_PX
    assert 1 < tol["chi2_dof"] < rec["chi2_dof"] and tol["verdict"] == "misfit"
    # the right geometry at the data's estimated level stays ok
    ok, _ = check_consistency(yt, RayTransform(g), x, learned, {},
                              noise=NoiseModel(sigma, False))
    assert ok["verdict"] == "ok" and ok["trustworthy"] is True


# solves that converge: the learned σ² is read from the mode's misfit, and the EM does not
# lower it on a step whose solves stopped short (with rank 8 and 20 CG iterations every
# step did, and σ² stayed at the air's estimate)
SMALL = ctuq.ReconstructionConfig(
    threads=1, uncertainty={"em_steps": 1, "n_samples": 2, "predictive_samples": 4,
                            "stored_samples": 0, "predcp": False, "preconditioner_rank": 100,
                            "cg_max_iter": 200})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_5px_centre_error_is_marked_untrustworthy_and_a_right_scan_is_not(seed):
    """24² off-grid scans of unknown noise (estimated from the air), the product's
    default DIP: a 5-pixel centre error is flagged and marked untrustworthy
    although the EM's learned σ² absorbs it; the right geometry is not flagged."""
    from ctuq.bench.misfit import make_scan

    out = {}
    for err in ("right", "centre5"):
        sino, _, _ = make_scan({"split": "tuning", "family": "shepp-variant", "index": seed,
                                "size": 24, "n_angles": 30, "error": err, "noise": 0.03,
                                "noise_seed": 100 + seed})
        assert "flat_dark_corrected" not in sino.meta  # Gaussian line integrals
        d = ctuq.reconstruct(sino, SMALL).diagnostics
        assert d["noise_source"] == "estimated"
        out[err] = d
    assert out["right"]["verdict"] == "ok" and out["right"]["trustworthy"], \
        out["right"]["reason"]
    bad = out["centre5"]
    assert bad["verdict"] == "misfit" and bad["trustworthy"] is False
    # the learned σ² grew with the misfit; the check did not follow it
    assert bad["noise_var_ratio"] > 3 * out["right"]["noise_var_ratio"]


# -- in the pipeline's result -----------------------------------------------------------
def test_result_records_the_check_of_the_reconstruction_shown(result, measured):
    y, sigma, _, g = measured
    d = result.diagnostics
    assert set(d) >= {"chi2_dof", "chi2_per_angle", "verdict", "reason", "threshold", "warnings"}
    # no data warning (the tiny solver settings' own warning is about the posterior)
    assert d["verdict"] in ("ok", "misfit")
    assert [w for w in d["warnings"] if not w.startswith("posterior:")] == []
    assert result.residual.shape == y.shape
    # recomputed from the result's own numbers: the reconstruction and the given noise
    # level (not the method's learned σ², recorded beside it with their ratio)
    assert d["noise_source"] == "given" and d["noise_var"] == pytest.approx(sigma ** 2)
    assert d["noise_var_method"] == pytest.approx(result.hyperparameters["sigma2"])
    assert d["noise_var_ratio"] == pytest.approx(d["noise_var_method"] / sigma ** 2)
    assert d["trustworthy"] == (d["verdict"] == "ok")
    op = RayTransform(result.geometry)
    fwd = op.A(torch.as_tensor(result.reconstruction)).numpy()
    # each ray's variance: σ² plus a quarter-pixel misregistration at the slope
    delta = d["misregistration"]
    assert delta == MISREGISTRATION_PX
    slope = np.gradient(fwd.astype(np.float64), axis=1)
    np.testing.assert_allclose(result.residual, (y - fwd) / np.sqrt(sigma ** 2
                                                                  + (delta * slope) ** 2),
                               rtol=1e-3, atol=1e-3)
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


# -- shown by the CLI -------------------------------------------------------------------
def _unwrapped(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_info_shows_the_verdict_the_stages_and_the_warnings(tmp_path, capsys):
    from ctuq.app.cli import main
    from ctuq.data.io import write_result

    g = Geometry((12, 12), np.deg2rad(np.arange(20) * 9.0), 18)
    img = np.ones((12, 12), np.float32)
    r = Result(reconstruction=img, std=img * 0.5, geometry=g,
               residual=np.zeros((20, 18), np.float32),
               diagnostics={"verdict": "misfit", "reason": "χ²/dof 25.3 (threshold 8)",
                            "chi2_dof": 25.3, "threshold": 8.0, "chi2_per_angle": [1.0] * 20,
                            "warnings": ["12 % of something odd"],
                            "center": {"used": 2.25, "estimate": 2.25, "std": 0.034,
                                       "confidence": 0.9, "method": "vo"}},
               provenance={"stages": {"seconds": {"fbp": 0.5, "dip": 3.25, "total": 4.0},
                                      "counts": {"dip_iterations": 30}}})
    path = write_result(tmp_path / "r.h5", r)
    capsys.readouterr()
    assert main(["info", str(path)]) == 0
    text = _unwrapped(capsys.readouterr().out)
    assert "misfit: χ²/dof 25.3 (threshold 8)" in text
    assert "12 % of something odd" in text
    assert "offset used 2.25 px; estimate 2.25 ± 0.034 px (vo, confidence 0.9)" in text
    assert "4.00 total: fbp 0.50, dip 3.25" in text and "dip iterations 30" in text


def test_summary_table_and_json_carry_the_fit(tmp_path, capsys):
    import json

    from ctuq.app._cli_output import summary_table, write_summary_json
    from ctuq.app.batch import Outcome, result_checks

    r = Result(reconstruction=np.ones((4, 4), np.float32),
               diagnostics={"verdict": "misfit", "reason": "too big", "warnings": ["w1"]},
               provenance={"stages": {"seconds": {"dip": 1.5}}})
    o = Outcome("a.h5", "out/a.ctuq.h5", "done", 2.0, **result_checks(r))
    capsys.readouterr()
    summary_table([o, Outcome("b.h5", "out/b.ctuq.h5", "failed", error="bad")])
    text = _unwrapped(capsys.readouterr().out)
    assert " fit " in f" {text} " and "misfit" in text
    assert "a.h5: misfit: too big" in text and "a.h5: warning: w1" in text
    write_summary_json(tmp_path / "s.json", [o], run_id="x")
    doc = json.loads((tmp_path / "s.json").read_text())["outcomes"][0]
    assert doc["fit"] == "misfit" and doc["warnings"] == ["w1"]
    assert doc["stages"] == {"dip": 1.5}


# -- center_offset = "auto" -------------------------------------------------------------
def _offset_scan(offset: float):
    angles = np.deg2rad(np.linspace(0.0, 180.0, 24, endpoint=False))
    g = Geometry.parallel(24, angles=angles, n_detector=36, center_offset=offset)
    truth = digits(1, 24, seed=0)[0]
    y, sigma = simulate_sinogram(truth, RayTransform(g), 0.02, seed=2)
    return y.numpy(), sigma, angles


TINY_24 = TINY.merged({"preset": "reference-28", "dip": {"iterations": 5},
                       "uncertainty": {"predictive_samples": 2}})


def test_center_offset_auto_estimates_and_uses_the_offset():
    y, sigma, angles = _offset_scan(2.3)
    r = ctuq.reconstruct(y, TINY_24.merged({"noise_std": sigma}), angles=np.rad2deg(angles),
                         image_size=24, center_offset="auto")
    c = r.diagnostics["center"]
    assert c["requested"] == "auto" and c["confidence"] >= 0.5
    assert abs(c["estimate"] - 2.3) < 0.5 and 0 < c["std"] < 0.25
    assert r.geometry.center_offset == pytest.approx(c["estimate"]) == c["used"]


def test_center_offset_auto_in_the_config_and_a_fallback_to_zero(caplog):
    y, sigma, angles = _offset_scan(0.0)
    cfg = TINY_24.merged({"noise_std": sigma, "geometry": {"center_offset": "AUTO"}})
    assert cfg.geometry["center_offset"] == "auto"
    # eight angles over 40 deg cannot fix the centre: offset 0 and a warning
    few = np.deg2rad(np.linspace(0, 40, 8))
    g = Geometry.parallel(24, angles=few, n_detector=36)
    yf, _ = simulate_sinogram(digits(1, 24, seed=0)[0], RayTransform(g), 0.02, seed=2)
    with caplog.at_level(logging.WARNING):
        r = ctuq.reconstruct(Sinogram(yf.numpy(), g), cfg)
    c = r.diagnostics["center"]
    assert c["used"] == 0.0 and r.geometry.center_offset == 0.0 and c["confidence"] < 0.5
    assert any("center_offset auto" in w for w in r.diagnostics["warnings"])
    assert any("center_offset auto" in rec.getMessage() for rec in caplog.records)


def test_center_offset_flag_takes_auto_or_a_number():
    from ctuq.app._cli_options import parse_settings
    from ctuq.errors import InputError

    assert parse_settings({"geometry__center_offset": "auto"}) == \
        {"geometry": {"center_offset": "auto"}}
    assert parse_settings({"geometry__center_offset": "-1.5"}) == \
        {"geometry": {"center_offset": -1.5}}
    with pytest.raises(InputError, match="--center-offset"):
        parse_settings({"geometry__center_offset": "left"})
    with pytest.raises(InputError, match="center_offset"):
        ctuq.ReconstructionConfig(geometry={"center_offset": "middle"})


# -- warnings about the data ------------------------------------------------------------
def test_data_warnings_for_the_angle_unit_negative_and_integer_data(caplog):
    g = Geometry.parallel(12, angles=np.deg2rad(np.linspace(0, 3.1, 10)), n_detector=18)
    data = np.ones((10, 18), np.float32)
    with caplog.at_level(logging.WARNING):
        w = data_warnings(Sinogram(data, g))
    assert len(w) == 1 and "look like radians" in w[0]
    assert len(caplog.records) == 1
    g2 = Geometry.parallel(12, angles=np.linspace(0, 179, 10), n_detector=18)  # degrees as rad
    assert "look like degrees" in data_warnings(Sinogram(data, g2))[0]
    good = Geometry.parallel(12, angles=np.deg2rad(np.linspace(0, 171, 10)), n_detector=18)
    assert data_warnings(Sinogram(data, good)) == []
    neg = -np.abs(np.random.default_rng(0).normal(size=(10, 18))).astype(np.float32)
    assert "negative" in data_warnings(Sinogram(neg, good))[0]
    assert "integers" in data_warnings(Sinogram(data, good, meta={"source_dtype": "uint16"}))[0]


def test_integer_array_is_noted_in_the_result(measured):
    y, sigma, _, _ = measured
    counts = np.round(y * 100).astype(np.int32)
    r = ctuq.reconstruct(counts, TINY.merged({"noise_std": 100 * sigma, "dip": {"iterations": 3},
                                              "uncertainty": {"predictive_samples": 2}}),
                         angles=ANGLES_DEG, image_size=28)
    assert any("integers (int32)" in w for w in r.diagnostics["warnings"])


def test_center_offset_auto_through_a_file(tmp_path):
    from ctuq.data.io import write_sinogram
    from ctuq.recon.pipeline import reconstruct_file

    y, sigma, angles = _offset_scan(2.3)
    g = Geometry.parallel(24, angles=angles, n_detector=36)  # the file says 0
    src = write_sinogram(tmp_path / "s.nxs", Sinogram(y, g, meta={"noise_std": sigma}))
    r = reconstruct_file(src, tmp_path / "r.h5", TINY_24, center_offset="auto", isolate=False)
    back = read_result(tmp_path / "r.h5")
    assert abs(back.diagnostics["center"]["estimate"] - 2.3) < 0.5
    assert back.geometry.center_offset == pytest.approx(r.diagnostics["center"]["used"])
    assert back.config == r.config


def test_raw_frames_without_a_stated_centre_get_it_estimated(tmp_path):
    """A scanner's raw frames rarely state the centre: the reader marks it 'auto' and the
    reconstruction estimates it; a centre the user (or the file) states is used as given."""
    import json

    from ctuq.data.io import read_sinogram
    from ctuq.data.realistic import simulate_realistic
    from ctuq.recon.pipeline import reconstruct_file

    scan = simulate_realistic("rectangles", 24, 36, I0=1e5, center_offset=2.0, seed=3,
                              phantom_seed=3)
    src = scan.write(tmp_path / "raw.nxs")
    with h5py.File(src, "r") as f:  # the file does not state the centre it does not know
        assert "center_offset" not in json.loads(f["entry/ctuq/geometry"][()])
    assert read_sinogram(src).meta["center_offset"] == "auto"
    r = reconstruct_file(src, tmp_path / "r.h5", TINY_24, isolate=False)
    c = read_result(tmp_path / "r.h5").diagnostics["center"]
    assert c["requested"] == "auto" and abs(c["used"] - 2.0) < 0.5
    assert r.geometry.center_offset == pytest.approx(c["used"])
    stated = reconstruct_file(src, tmp_path / "r0.h5", TINY_24, isolate=False,
                              center_offset=0.0)
    assert stated.geometry.center_offset == 0.0 and "center" not in stated.diagnostics
    # the same frames written with a stated centre: used as stated
    from ctuq.data.io import write_sinogram

    plain = Sinogram(scan.line_integrals, scan.geometry, ground_truth=scan.truth)
    path = write_sinogram(tmp_path / "stated.nxs", plain, frames={
        "projections": scan.projections, "flats": scan.flats, "darks": scan.darks})
    assert "center_offset" not in read_sinogram(path).meta


def test_integer_file_is_noted_once(measured, tmp_path, caplog):
    from ctuq.recon.pipeline import reconstruct_file

    y, sigma, _, _ = measured
    np.save(tmp_path / "counts.npy", np.round(y * 100).astype(np.uint16 if y.min() >= 0
                                                              else np.int16))
    cfg = TINY.merged({"noise_std": 100 * sigma, "dip": {"iterations": 3},
                       "uncertainty": {"predictive_samples": 2}})
    with caplog.at_level(logging.WARNING):
        r = reconstruct_file(tmp_path / "counts.npy", tmp_path / "r.h5", cfg, isolate=False,
                             angles=list(ANGLES_DEG), image_size=28)
    assert sum("integers" in w for w in r.diagnostics["warnings"]) == 1
    assert sum("integers" in rec.getMessage() for rec in caplog.records) == 1
    assert read_result(tmp_path / "r.h5").diagnostics["warnings"] == r.diagnostics["warnings"]


def test_cli_center_offset_auto_and_summary_json(tmp_path, capsys):
    import json

    from ctuq.app.cli import main
    from ctuq.data.io import write_sinogram

    y, sigma, angles = _offset_scan(2.3)
    g = Geometry.parallel(24, angles=angles, n_detector=36)
    src = write_sinogram(tmp_path / "scan.nxs", Sinogram(y, g, meta={"noise_std": sigma}))
    (tmp_path / "tiny.toml").write_text(
        'preset = "reference-28"\nthreads = 1\n[dip]\niterations = 5\n[uncertainty]\n'
        'em_steps = 1\nn_samples = 2\npredictive_samples = 2\nstored_samples = 0\n'
        'predcp = false\ncg_max_iter = 20\n')
    out = tmp_path / "out"
    assert main(["reconstruct", str(src), "--out", str(out), "--config",
                 str(tmp_path / "tiny.toml"), "--center-offset", "auto",
                 "--summary-json", str(tmp_path / "s.json")]) == 0
    doc = json.loads((tmp_path / "s.json").read_text())["outcomes"][0]
    assert doc["fit"] in ("ok", "misfit") and doc["stages"]["dip"] > 0
    r = read_result(doc["output"])
    assert abs(r.diagnostics["center"]["estimate"] - 2.3) < 0.5
    assert r.geometry.center_offset == r.diagnostics["center"]["used"]
    assert r.config["noise_std"] == pytest.approx(sigma)
    assert " fit " in " ".join(capsys.readouterr().out.replace("│", " ").split()) + " "


def test_a_stack_records_one_verdict_and_a_residual_per_slice(measured, tmp_path):
    y, sigma, _, _ = measured
    stack = np.stack([y, y[:, ::-1]])
    cfg = TINY.merged({"noise_std": sigma, "dip": {"iterations": 3},
                       "uncertainty": {"predictive_samples": 2}})
    r = ctuq.reconstruct(stack, cfg, angles=ANGLES_DEG, image_size=28)
    d = r.diagnostics
    assert r.residual.shape == stack.shape and len(d["slices"]) == 2
    assert np.shape(d["chi2_per_angle"]) == (2, len(ANGLES_DEG))
    assert d["chi2_dof"] == max(s["chi2_dof"] for s in d["slices"])
    assert (d["verdict"] == "misfit") == any(s["verdict"] == "misfit" for s in d["slices"])
    st = r.provenance["stages"]
    assert st["counts"]["dip_iterations"] == 6 and len(st["slices"]) == 2
    back = read_result(r.save(tmp_path / "s.h5"))
    assert back.diagnostics == d and np.array_equal(back.residual, r.residual)


def test_summary_names_an_image_that_is_not_the_dip_output(tmp_path, capsys):
    import json

    from ctuq.app._cli_output import summary_table, write_summary_json
    from ctuq.app.batch import Outcome, result_checks

    config = {"uncertainty": {"method": "laplace", "model_error": "heldout",
                              "laplace": {"mean": "linear-heldout"}},
              "model_error": {"t0": 1.0, "s1": 0.5, "info": {"step_length": 0.7349}}}
    stepped = Result(reconstruction=np.ones((4, 4), np.float32), config=config)
    plain = Result(reconstruction=np.ones((4, 4), np.float32),
                   config={**config, "uncertainty": {**config["uncertainty"],
                                                     "laplace": {"mean": "dip"}}})
    outcomes = [Outcome(f"{n}.h5", f"out/{n}.ctuq.h5", "done", 1.0, **result_checks(r))
                for n, r in (("a", stepped), ("b", plain))]
    capsys.readouterr()
    summary_table(outcomes)
    text = _unwrapped(capsys.readouterr().out)
    assert ("a.h5: reconstruction: DIP output + the linear model's step "
            "(linear-heldout, length 0.73)") in text
    assert "b.h5: reconstruction" not in text
    write_summary_json(tmp_path / "s.json", outcomes, run_id="x")
    doc = json.loads((tmp_path / "s.json").read_text())["outcomes"]
    assert doc[0]["image"].endswith("length 0.73)") and doc[1]["image"] is None
