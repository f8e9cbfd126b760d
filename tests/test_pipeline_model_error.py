"""The model-error stage of the pipeline: the decomposition of the total std,
each method, the calibration file, and what the result file holds."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch

import ctuq
from ctuq.app.batch import net_input_note
from ctuq.errors import InputError
from ctuq.recon.config import UncertaintyConfig
from ctuq.recon.model_error import ModelErrorCoefficients, edge_strength
from ctuq.recon.model_error.heldout import preferred_input
from ctuq.recon.model_error.terms import (AUTO_INPUT_T, FLOOR_EXCESS, FLOOR_REJECT_NATS,
                                         edge_concentration, fit_rule, floor_applies,
                                         floor_rejection, heldout_noise_scale)

from conftest import digit_sinogram

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(noise_std=None, **unc):
    return ctuq.ReconstructionConfig(
        preset="reference-28", threads=1, dip={"iterations": 60}, noise_std=noise_std,
        uncertainty={"em_steps": 1, "n_samples": 2, "predictive_samples": 16,
                     "stored_samples": 0, "predcp": False, "preconditioner_rank": 8,
                     "cg_max_iter": 40, **unc})


@pytest.fixture(scope="module")
def scan():
    return digit_sinogram(24)


@pytest.fixture(scope="module")
def heldout(scan):
    return ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4))


def test_total_variance_is_posterior_plus_model_error(heldout):
    r = heldout
    np.testing.assert_allclose(r.std.astype(np.float64) ** 2,
                               r.posterior_std.astype(np.float64) ** 2
                               + r.model_error_std.astype(np.float64) ** 2, rtol=1e-4)
    np.testing.assert_allclose(r.variance, r.std.astype(np.float64) ** 2, rtol=1e-4)
    assert r.model_error_std.max() > 0  # the held-out projections saw a model error
    me = r.config["model_error"]
    # every 4th of 24 angles is 6, fewer than heldout_min_out (7): every 3rd, 8 angles
    assert me["method"] == "heldout" and me["info"]["heldout_angles"] == 8


def test_the_correlation_length_reaches_the_held_out_fit_and_its_record(scan, heldout):
    assert heldout.config["model_error"]["info"]["correlation_length"] == 0.0  # the default
    r = ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4,
                                       heldout_correlation_length=2.0))
    me = r.config["model_error"]
    assert me["info"]["correlation_length"] == 2.0
    # the same residuals read as correlated errors: other coefficients, the same image
    assert (me["t0"], me["s1"]) != (heldout.config["model_error"]["t0"],
                                    heldout.config["model_error"]["s1"])
    np.testing.assert_array_equal(r.reconstruction, heldout.reconstruction)
    with pytest.raises(InputError, match="heldout_correlation_length"):
        UncertaintyConfig(heldout_correlation_length=-1.0)


def test_model_error_is_largest_on_edges(heldout):
    e = edge_strength(heldout.reconstruction).numpy()
    m = heldout.model_error_std
    if heldout.config["model_error"]["s1"] > 0:
        assert m[e > 0.5 * e.max()].mean() > m[e == 0].mean()


def test_metrics_report_the_total_and_the_posterior_alone(heldout):
    m = heldout.metrics
    assert m["coverage_2sigma"] >= m["coverage_2sigma_posterior"]
    assert np.isfinite(m["pixel_log_likelihood_posterior"])


def test_result_file_holds_the_decomposition(heldout, tmp_path):
    path = heldout.save(tmp_path / "r.ctuq.h5")
    with h5py.File(path) as f:
        total = f["entry/data/data_errors"][()]
        post = f["entry/uncertainty/posterior_std"][()]
        model = f["entry/uncertainty/model_error_std"][()]
        assert f["entry/uncertainty/model_error_std"].attrs["units"] == "1/mm"
    np.testing.assert_allclose(total.astype(np.float64) ** 2,
                               post.astype(np.float64) ** 2 + model.astype(np.float64) ** 2,
                               rtol=1e-4)
    back = ctuq.data.io.read_result(path)
    np.testing.assert_array_equal(back.model_error_std, heldout.model_error_std)


def test_none_keeps_the_posterior_alone(scan):
    r = ctuq.reconstruct(scan, _config(model_error="none"))
    assert r.model_error_std.max() == 0
    np.testing.assert_allclose(r.std, r.posterior_std, rtol=1e-6)


def test_calibrated_and_conformal_use_the_named_file(scan, tmp_path):
    path = ModelErrorCoefficients(2.0, 0.3, "calibrated", conformal=1.5).save(tmp_path / "c.json")
    cal = ctuq.reconstruct(scan, _config(model_error="calibrated", model_error_file=str(path)))
    var_post = cal.posterior_std.astype(np.float64) ** 2
    want = 4.0 * var_post.mean() + 0.09 * edge_strength(cal.reconstruction).numpy() ** 2
    np.testing.assert_allclose(cal.model_error_std.astype(np.float64) ** 2, want, rtol=1e-3,
                               atol=1e-10)
    conf = ctuq.reconstruct(scan, _config(model_error="conformal", model_error_file=str(path)))
    np.testing.assert_allclose(conf.std, 1.5 * conf.posterior_std, rtol=1e-4)


def test_missing_calibration_is_one_clear_error(scan, tmp_path):
    with pytest.raises(InputError, match="no such model-error file"):
        ctuq.reconstruct(scan, _config(model_error="calibrated",
                                       model_error_file=str(tmp_path / "none.json")))


def test_heldout_prior_comes_from_the_named_file_or_the_shipped_one(tmp_path, monkeypatch):
    from ctuq.recon.config import UncertaintyConfig
    from ctuq.recon.model_error import coefficients as me
    from ctuq.recon.model_error import make_model_error

    def heldout_prior(unc, preset):  # as the pipeline prepares the term for unc's method
        term = make_model_error("heldout", unc, preset,
                                shipped=unc.method_class.shipped_calibration).prepare()
        return term.calibration, term.source

    path = ModelErrorCoefficients(2.0, 0.3, "calibrated").save(tmp_path / "c.json")
    prior, source = heldout_prior(UncertaintyConfig(model_error_file=str(path)), "dip-64")
    assert (prior.t0, prior.s1, source) == (2.0, 0.3, str(path))
    monkeypatch.setattr(me, "DEFAULTS_DIR", tmp_path)
    assert heldout_prior(UncertaintyConfig(), "dip-64") == (None, None)  # none shipped
    ModelErrorCoefficients(1.0, 0.1, "calibrated").save(tmp_path / "dip-64.json")
    prior, source = heldout_prior(UncertaintyConfig(), "dip-64")
    assert (prior.t0, source) == (1.0, "shipped:dip-64")
    assert heldout_prior(UncertaintyConfig(heldout_prior_width=0), "dip-64") == (None, None)
    # IVON's std is not the one the shipped files were fitted with
    assert heldout_prior(UncertaintyConfig(method="ivon"), "dip-64") == (None, None)
    with pytest.raises(InputError, match="heldout_prior_width"):
        UncertaintyConfig(heldout_prior_width=-1)


def test_heldout_with_a_calibration_records_its_prior_and_the_likelihood_optimum(scan, tmp_path):
    path = ModelErrorCoefficients(2.0, 0.3, "calibrated").save(tmp_path / "c.json")
    r = ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4,
                                       model_error_file=str(path), heldout_prior_width=0.5,
                                       heldout_calibration_floor=True))
    info = r.config["model_error"]["info"]
    # the fit's excess is measured for the held-out noise rule ('residual', the default)
    prior = dict(info["prior"])
    assert prior.pop("fit_excess") > 0
    assert prior.pop("floor_rejection_nats") >= 0.0  # measured; 'on' never drops the floor
    assert prior == {"t0": 2.0, "s1": 0.3, "width": 0.5, "floor": True, "from": str(path),
                     "floor_rule": "on", "floor_rejected": False, "texture": False,
                     "edge_concentration": None, "texture_threshold": 0.0}
    assert set(info["mle"]) == {"t0", "s1"}
    var_post = r.posterior_std.astype(np.float64) ** 2
    me = r.config["model_error"]
    assert me["t0"] >= 2.0 and me["s1"] >= 0.3  # the calibration is the lower bound
    want = me["t0"] ** 2 * var_post.mean() + me["s1"] ** 2 * edge_strength(
        r.reconstruction).numpy() ** 2
    np.testing.assert_allclose(r.model_error_std.astype(np.float64) ** 2, want, rtol=1e-3,
                               atol=1e-10)
    back = ctuq.data.io.read_result(r.save(tmp_path / "r.ctuq.h5"))
    assert back.config["model_error"]["info"]["prior"] == info["prior"]
    assert back.config["uncertainty"]["heldout_calibration_floor"] == "on"  # True read as on
    free = ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4,
                                          model_error_file=str(path), heldout_prior_width=0.5,
                                          heldout_calibration_floor="off"))
    assert free.config["model_error"]["info"]["prior"]["floor"] is False
    # the same likelihood and search (both coefficients calibrated): the bound alone differs
    mf = free.config["model_error"]
    assert (me["t0"], me["s1"]) == pytest.approx((max(mf["t0"], 2.0), max(mf["s1"], 0.3)),
                                                 rel=1e-6)
    # 'checked': these projections reject the floor (by far more than FLOOR_REJECT_NATS),
    # so the coefficients are the unfloored fit's
    checked = ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4,
                                             model_error_file=str(path),
                                             heldout_prior_width=0.5,
                                             heldout_calibration_floor="checked"))
    mc = checked.config["model_error"]
    assert mc["info"]["prior"]["floor_rejection_nats"] > FLOOR_REJECT_NATS
    assert mc["info"]["prior"]["floor_rejected"] and mc["info"]["prior"]["floor"]
    assert (mc["t0"], mc["s1"]) == pytest.approx((mf["t0"], mf["s1"]), rel=1e-6)


def test_auto_floor_reads_the_fits_excess_the_consistency_stage_also_measures(scan, tmp_path):
    """``'auto'`` (the default) floors exactly when the image leaves more than the noise
    in the data; its excess is the consistency stage's χ² with every ray a degree of
    freedom (two computations of one number), and the floor then bounds the free fit."""
    path = ModelErrorCoefficients(2.0, 0.3, "calibrated").save(tmp_path / "c.json")
    runs = {}
    for rule in ("auto", "off", "on"):
        runs[rule] = ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4,
                                                    model_error_file=str(path),
                                                    heldout_prior_width=0.5,
                                                    heldout_calibration_floor=rule))
    r = runs["auto"]
    prior = r.config["model_error"]["info"]["prior"]
    d = r.diagnostics
    m = np.asarray(scan.data).size
    assert prior["floor_rule"] == "auto"
    assert prior["fit_excess"] == pytest.approx(d["chi2_dof"] * d["dof"] / m, rel=1e-5)
    assert prior["floor"] is (prior["fit_excess"] > FLOOR_EXCESS)
    want = runs["on" if prior["floor"] else "off"].config["model_error"]
    assert (r.config["model_error"]["t0"], r.config["model_error"]["s1"]) == pytest.approx(
        (want["t0"], want["s1"]), rel=1e-6)


def test_floor_rule_choices_and_their_decisions():
    assert UncertaintyConfig().heldout_calibration_floor == "auto"
    # the dip-64 and dip-128 presets check their floor; a user's choice still wins
    cfg = ctuq.ReconstructionConfig()
    assert cfg.resolve((64, 64))[1].heldout_calibration_floor == "checked"
    assert cfg.resolve((128, 128))[1].heldout_calibration_floor == "checked"
    assert cfg.resolve((256, 256))[1].heldout_calibration_floor == "auto"
    given = ctuq.ReconstructionConfig(uncertainty={"heldout_calibration_floor": "auto"})
    assert given.resolve((64, 64))[1].heldout_calibration_floor == "auto"
    assert given.resolve((128, 128))[1].heldout_calibration_floor == "auto"
    assert UncertaintyConfig(heldout_calibration_floor=False).heldout_calibration_floor == "off"
    with pytest.raises(InputError, match="heldout_calibration_floor"):
        UncertaintyConfig(heldout_calibration_floor="sometimes")
    assert floor_applies("auto", FLOOR_EXCESS * 1.01) and not floor_applies("auto", 0.9)
    assert not floor_applies("auto", None)  # no calibration: nothing measured, no floor
    assert floor_applies("on", 0.5) and not floor_applies("off", 50.0)
    # 'checked' floors where 'auto' does; only it drops a floor the projections reject
    for excess in (None, 0.9, FLOOR_EXCESS * 1.01):
        assert floor_applies("checked", excess) == floor_applies("auto", excess)
    assert floor_rejection("checked") == FLOOR_REJECT_NATS
    assert all(floor_rejection(c) == math.inf for c in ("auto", "on", "off"))
    # fit_rule: the three together, as the pipeline and every offline refit pass them
    assert fit_rule("checked", FLOOR_EXCESS * 1.01, 0.2, 0.35) == {
        "floor": True, "floor_reject": FLOOR_REJECT_NATS, "texture": True}
    assert fit_rule("checked", 0.9, 0.5, 0.35) == {
        "floor": False, "floor_reject": FLOOR_REJECT_NATS, "texture": False}
    # no edge measurement, or no threshold: never a texture
    assert not fit_rule("on", None, None, 0.35)["texture"]
    assert not fit_rule("on", None, 0.2)["texture"]
    assert fit_rule("auto", 5.0, threshold=10.0)["floor"] is False
    assert fit_rule("off", 50.0)["floor_reject"] == math.inf
    with pytest.raises(InputError, match="heldout_calibration_floor"):
        fit_rule("sometimes", 1.0)


def test_texture_threshold_frees_the_negligible_coefficient_of_a_textured_image(scan, tmp_path):
    """``heldout_texture_threshold``: with the floor on and a calibration without ``t0``,
    ``t0`` is held at zero unless the image shown is textured (its edge concentration,
    recorded, below the threshold); then both are the maximum likelihood's, the prior's
    centre not pulling them, and the calibration bounds ``s1`` below."""
    path = str(ModelErrorCoefficients(0.0, 0.002, "calibrated").save(tmp_path / "c.json"))

    def run(floor, threshold):
        return ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4,
                                              model_error_file=path, heldout_prior_width=0.5,
                                              heldout_calibration_floor=floor,
                                              heldout_texture_threshold=threshold))

    runs = {t: run("on", t) for t in (0.0, 0.999)}
    held, freed = (runs[t].config["model_error"] for t in (0.0, 0.999))
    off = run("off", 0.0).config["model_error"]
    assert off["t0"] > 0.0  # these held-out projections want a constant pixel error
    assert held["t0"] == 0.0 and held["info"]["prior"]["edge_concentration"] is None
    prior = freed["info"]["prior"]
    # the image shown is what was measured; a digit's edges are not all of its gradient
    assert prior["edge_concentration"] == pytest.approx(
        edge_concentration(runs[0.999].reconstruction), rel=1e-6)
    assert prior["edge_concentration"] < 0.999 and prior["texture_threshold"] == 0.999
    assert prior["texture"] and not held["info"]["prior"]["texture"]
    # the maximum likelihood (recorded beside it), s1 still bounded below by the calibration;
    # the prior (width 0.5 around s1 = 0.002) pulls the unfloored fit's s1, not the texture's
    mle = freed["info"]["mle"]
    assert (freed["t0"], freed["s1"]) == pytest.approx((mle["t0"], max(mle["s1"], 0.002)),
                                                       rel=1e-6)
    assert (off["t0"], off["s1"]) != pytest.approx((freed["t0"], freed["s1"]), rel=1e-3)
    # the presets: dip-64 (the 16-channel network's narrow calibration) only
    cfg = ctuq.ReconstructionConfig()
    assert cfg.resolve((64, 64))[1].heldout_texture_threshold == 0.35
    assert cfg.resolve((128, 128))[1].heldout_texture_threshold == 0.0
    with pytest.raises(InputError, match="heldout_texture_threshold"):
        UncertaintyConfig(heldout_texture_threshold=1.5)


def test_held_out_noise_rule_choices_and_their_scales():
    assert UncertaintyConfig().heldout_noise == "residual"
    with pytest.raises(InputError, match="heldout_noise"):
        UncertaintyConfig(heldout_noise="estimated")
    ok, flagged = {"chi2_dof": 2.5, "verdict": "ok"}, {"chi2_dof": 40.0, "verdict": "misfit"}
    assert heldout_noise_scale("given", ok) == 1.0
    assert heldout_noise_scale("residual", ok) == 2.5
    assert heldout_noise_scale("residual", {"chi2_dof": 0.7, "verdict": "ok"}) == 1.0
    assert heldout_noise_scale("residual", flagged) == 1.0  # a wrong geometry keeps σ²
    assert heldout_noise_scale("residual", None) == 1.0


def test_residual_noise_reads_the_fits_excess_as_noise_on_the_held_out_rays(scan):
    """``heldout_noise = 'residual'``: the held-out likelihood's σ² is scaled by the
    fit's excess (the consistency stage's χ² with every ray a degree of freedom), so
    less of the held-out residual is left to the model error. (60 iterations leave an
    excess of ~17 at the true σ, a misfit; at 2.5 σ the fit is accepted with ~2.7.)"""
    sigma = 2.5 * scan.meta["noise_std"]
    runs = {rule: ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4,
                                                 heldout_noise=rule, noise_std=sigma))
            for rule in ("given", "residual")}
    r, given = runs["residual"], runs["given"]
    info, d = r.config["model_error"]["info"], r.diagnostics
    excess = d["chi2_dof"] * d["dof"] / np.asarray(scan.data).size
    assert info["noise_rule"] == "residual" and 1 < excess < 14.5
    assert info["noise_scale"] == pytest.approx(excess, rel=1e-5)
    assert given.config["model_error"]["info"]["noise_scale"] == 1.0
    np.testing.assert_array_equal(r.reconstruction, given.reconstruction)
    assert (r.model_error_std ** 2).mean() < (given.model_error_std ** 2).mean()


@pytest.mark.parametrize("method", ["heldout", "calibrated"])
def test_a_missing_calibration_file_stops_the_run_before_any_fit(scan, tmp_path, method):
    stages = []
    with pytest.raises(InputError, match="no such model-error file"):
        ctuq.reconstruct(scan, _config(model_error=method,
                                       model_error_file=str(tmp_path / "none.json")),
                         progress=lambda stage, *a: stages.append(stage))
    assert "dip" not in stages


def test_a_shared_fit_records_the_held_out_fit_inside_the_dip_stage(scan, heldout):
    shared = ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4,
                                            dip_from_heldout=0.5))
    sec, counts = (shared.provenance["stages"][k] for k in ("seconds", "counts"))
    # the held-out fit ran the whole schedule, the fit on all angles half of it
    assert counts["dip_heldout_iterations"] == 60 and counts["dip_iterations"] == 30
    assert 0 < sec["dip_heldout"] <= sec["dip"]
    # two separate fits record no shared part
    assert "dip_heldout" not in heldout.provenance["stages"]["seconds"]
    assert heldout.provenance["stages"]["counts"]["dip_iterations"] == 60
    assert np.isfinite(shared.std).all() and shared.std.shape == (28, 28)


def _auto_config(net_input, share):
    return ctuq.ReconstructionConfig(
        preset="reference-28", threads=1, dip={"iterations": 60, "net_input": net_input},
        uncertainty={"em_steps": 1, "n_samples": 2, "predictive_samples": 16,
                     "stored_samples": 0, "predcp": False, "preconditioner_rank": 8,
                     "cg_max_iter": 40, "model_error": "heldout", "heldout_every": 4,
                     "dip_from_heldout": share})


@pytest.mark.parametrize("share", [0.5, 0.0])
def test_auto_input_is_the_run_with_the_input_that_predicts_the_left_out_rows(scan, share):
    auto = ctuq.reconstruct(scan, _auto_config("auto", share))
    choice = auto.config["model_error"]["info"]["net_input"]
    misfit, per = choice["heldout_misfit"], choice["per_angle"]
    assert set(misfit) == {"fbp", "tv"} and all(0 < m < math.inf for m in misfit.values())
    assert len(per["fbp"]) == len(per["tv"]) > 1  # one value per left-out angle
    assert all(np.mean(per[k]) == pytest.approx(misfit[k]) for k in per)
    assert (choice["chosen"], choice["t"]) == preferred_input(per, "fbp", AUTO_INPUT_T)
    # the same as a run told that input: the held-out fit, the fit on all angles, the std
    told = ctuq.reconstruct(scan, _auto_config(choice["chosen"], share))
    # what `ctuq info` says of it
    note = net_input_note(auto.config)
    assert note.startswith({"fbp": "FBP (auto", "tv": "TV image (auto"}[choice["chosen"]])
    assert f"t {choice['t']['tv']:.2f}" in note and net_input_note(told.config) is None
    np.testing.assert_allclose(auto.reconstruction, told.reconstruction, rtol=0, atol=1e-6)
    np.testing.assert_allclose(auto.std, told.std, rtol=1e-4)
    counts = auto.provenance["stages"]["counts"]
    assert counts["dip_heldout_iterations"] == 60
    assert counts["dip_iterations"] == (30 if share else 60)
    # both held-out fits are timed inside the DIP stage (without 'auto' and sharing, none is)
    sec = auto.provenance["stages"]["seconds"]
    told_held = told.provenance["stages"]["seconds"].get("dip_heldout", 0.0)
    assert told_held < sec["dip_heldout"] <= sec["dip"]
    assert "net_input" not in told.config["model_error"]["info"]


def test_auto_input_without_the_held_out_fits_is_one_clear_error(scan):
    cfg = ctuq.ReconstructionConfig(preset="reference-28", dip={"net_input": "auto"},
                                    uncertainty={"model_error": "none"})
    with pytest.raises(InputError, match="held-out fits") as err:
        ctuq.reconstruct(scan, cfg)
    assert err.value.field == "dip.net_input"


def test_auto_fits_side_by_side_make_the_fits_made_one_after_the_other(scan):
    two = _auto_config("auto", 0.5).merged({"threads": 2})  # the held-out fits side by side
    one = ctuq.reconstruct(scan, _auto_config("auto", 0.5))
    both = ctuq.reconstruct(scan, two)
    a, b = (r.config["model_error"]["info"]["net_input"] for r in (one, both))
    assert a["chosen"] == b["chosen"]
    for name in ("fbp", "tv"):  # one thread each: the same held-out fits
        np.testing.assert_allclose(b["per_angle"][name], a["per_angle"][name], rtol=1e-5)
    # the fit on all angles then runs on two threads: equal up to float rounding
    np.testing.assert_allclose(both.reconstruction, one.reconstruction, atol=1e-3)
    sec = both.provenance["stages"]["seconds"]
    assert 0 < sec["dip_heldout"] <= sec["dip"]  # the fits' wall time, not their sum


def test_the_held_out_fit_beside_the_fit_on_all_angles(scan, heldout):
    """Two separate fits, a known noise level, two threads: the held-out fit runs beside
    the fit on all angles, one thread each, and the fit on all angles is the one-thread
    run's. (The EM then runs on two threads; this test's capped solves make its std
    move with the thread count, so the held-out coefficients are compared in the next
    test, on one thread.)"""
    two = ctuq.reconstruct(scan, _config(model_error="heldout", heldout_every=4)
                           .merged({"threads": 2}))
    assert two.config["model_error"]["info"]["fit_beside"] is True
    assert "fit_beside" not in heldout.config["model_error"]["info"]
    np.testing.assert_array_equal(two.reconstruction, heldout.reconstruction)
    stages = two.provenance["stages"]
    assert 0 < stages["seconds"]["dip_heldout"] <= stages["seconds"]["dip"]
    assert stages["counts"]["dip_heldout_iterations"] == 60
    assert np.isfinite(two.std).all() and (two.model_error_std > 0).any()


def test_the_beside_fit_is_the_fit_the_term_would_make_and_only_where_it_can_be():
    """The term's held-out fit made beside (here: called first, on this thread) gives
    the coefficients of the fit it makes after the method; a noise level the method
    changed, an unknown one, one thread, a continued fit, or ``heldout_beside = false``
    make no beside fit."""
    from ctuq.recon.model_error import make_model_error
    from ctuq.recon.problem import ReconstructionProblem
    from ctuq.recon.provenance import torch_threads

    def problem_of(noise_std, **unc):
        cfg = ctuq.ReconstructionConfig(seed=0, device="cpu", threads=2, noise_std=noise_std,
                                        dip={"iterations": 30},
                                        uncertainty={"model_error": "heldout",
                                                     "dip_from_heldout": 0.0, **unc})
        sino = digit_sinogram(24)
        if noise_std is None:
            sino.meta.pop("noise_std", None)
        return ReconstructionProblem.from_sinogram(sino, cfg)

    def term_of(problem):
        return make_model_error("heldout", problem.uncertainty, problem.preset).prepare()

    problem = problem_of(0.02)
    with torch_threads(2):
        beside, after = term_of(problem), term_of(problem)
        made = beside.beside_fit(problem)
        assert made is not None
        with torch_threads(1):
            made()
            fit = ctuq.recon.dip.fit_dip(problem.y, problem.op, problem.dip,
                                         noise_std=problem.noise.std)
            var = torch.full(fit.reconstruction.shape, 1e-4, dtype=torch.float64)
            nv = problem.noise.variance
            a, b = (t.variance(problem, fit, var, nv).coefficients for t in (beside, after))
            assert a.info["fit_beside"] is True and "fit_beside" not in b.info
            assert (a.t0, a.s1) == (b.t0, b.s1)
            assert beside.shared_fit() is not None and after.shared_fit() is None
            # the method learned another noise level: the term fits again, after it
            c = beside.variance(problem, fit, var, 2 * nv).coefficients
            assert "fit_beside" not in c.info
        assert term_of(problem_of(None)).beside_fit(problem_of(None)) is None
        for unc in ({"dip_from_heldout": 0.5}, {"heldout_beside": False}):
            other = problem_of(0.02, **unc)
            assert term_of(other).beside_fit(other) is None
    with torch_threads(1):
        assert term_of(problem).beside_fit(problem) is None


def test_a_fit_worse_than_its_tv_input_shows_the_tv_image(scan):
    """``heldout_input_fallback``: a DIP fit stopped after five steps predicts the
    left-out angles far worse than its TV input; the TV image is shown, the DIP output
    kept, and the coefficients read the TV image's held-out residual."""
    from ctuq.app.batch import shown_image_note
    from ctuq.data.operators import RayTransform
    from ctuq.recon.baselines import tv_reconstruction

    def config(fallback):
        return ctuq.ReconstructionConfig(
            preset="reference-28", threads=1, dip={"iterations": 5, "net_input": "tv"},
            uncertainty={"em_steps": 1, "n_samples": 2, "predictive_samples": 16,
                         "stored_samples": 0, "predcp": False, "preconditioner_rank": 8,
                         "cg_max_iter": 40, "model_error": "heldout", "heldout_every": 4,
                         "heldout_input_fallback": fallback})

    on, off = (ctuq.reconstruct(scan, config(f)) for f in (True, False))
    fallback = on.config["model_error"]["info"]["input_fallback"]
    assert fallback["used"] and fallback["t"] > fallback["t_min"]
    assert fallback["heldout_misfit"]["input"] < fallback["heldout_misfit"]["fit"]
    tv = tv_reconstruction(torch.as_tensor(scan.data), RayTransform(scan.geometry),
                           noise_std=scan.meta["noise_std"]).numpy()
    np.testing.assert_allclose(on.reconstruction, tv, rtol=0, atol=1e-3 * np.abs(tv).max())
    # the same fit underneath, kept in the result; without the fallback it is the image
    np.testing.assert_allclose(on.dip, off.dip, rtol=0, atol=1e-6)
    np.testing.assert_allclose(off.reconstruction, off.dip, rtol=0, atol=1e-6)
    assert "input_fallback" not in off.config["model_error"]["info"]
    truth = scan.ground_truth
    assert np.sqrt(np.mean((on.reconstruction - truth) ** 2)) < np.sqrt(
        np.mean((off.reconstruction - truth) ** 2))
    # the model error is the TV image's: a smaller held-out residual, a narrower std
    assert on.model_error_std.mean() < off.model_error_std.mean()
    assert shown_image_note(on.config).startswith("the network's input, the TV image")
    assert shown_image_note(off.config) is None
