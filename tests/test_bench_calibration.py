"""ctuq.bench.calibration and ctuq.bench.tuning: planning, carried methods and the tuning rules."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ctuq.bench import calibration as bench_calibration
from ctuq.bench import tuning
from ctuq.bench.cases import CONDITIONS, calibration_cases, case_spec
from ctuq.bench.runner import clean, read_case_file
from ctuq.data.phantoms import ellipses
from ctuq.recon import model_error as me

ROOT = Path(__file__).resolve().parents[1]


def _summary(cov_mean, cov_worst, ll, edges_worst=0.9):
    return {"coverage_2_mean": cov_mean, "coverage_2_worst": cov_worst,
            "pixel_log_likelihood_mean": ll, "coverage_2_edges_worst": edges_worst}


def test_width_rule_takes_the_best_ll_among_widths_meeting_the_targets():
    s = {"0.5": _summary(0.97, 0.90, 2.0), "1.0": _summary(0.96, 0.86, 2.5),
         "inf": _summary(0.95, 0.70, 3.0)}  # best LL, worst image below 85 %
    assert tuning.choose_width(s)[0] == "1.0"
    s["1.0"] = _summary(0.995, 0.95, 2.5)  # mean above 99 %: over-wide
    assert tuning.choose_width(s)[0] == "0.5"
    none = {"0.5": _summary(0.8, 0.6, 1.0), "inf": _summary(0.7, 0.5, 2.0)}
    chosen, rule = tuning.choose_width(none)
    assert chosen == "0.5" and "no width" in rule


def test_width_rule_refuses_a_prior_that_costs_the_worst_case_coverage():
    s = {"0.1": _summary(0.97, 0.87, 3.8),  # best LL, but a worse worst image than the MLE
         "0.25": _summary(0.97, 0.92, 3.5, edges_worst=0.80),  # worse worst edges
         "1.0": _summary(0.97, 0.92, 3.4), "inf": _summary(0.97, 0.92, 3.3)}
    assert tuning.choose_width(s)[0] == "1.0"


def test_split_rule_takes_the_best_worst_image_unless_it_costs_log_likelihood():
    s = {"6_prior": _summary(0.97, 0.90, 3.6), "6_mle": _summary(0.97, 0.95, 3.0),
         "4_prior": _summary(0.98, 0.93, 3.55),  # better worst image, LL within 0.1
         "3_prior": _summary(0.99, 0.96, 3.2)}  # best worst image, but 0.4 nats worse
    assert tuning.choose_split(s) == "4_prior"  # an MLE variant is never chosen
    s["4_prior"] = _summary(0.98, 0.93, 3.45)
    assert tuning.choose_split(s) == "6_prior"


def test_cases_from_a_document_or_a_partial_file(tmp_path):
    row = {"id": "test/digits/1/64/30/5", "split": "test", "family": "digits", "index": 1,
           "size": 64, "n_angles": 30, "noise": 0.05, "condition": "30 angles, 5% noise",
           "methods": {"heldout": {}}}
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"cases": [row]}))
    part = tmp_path / "part.jsonl"
    part.write_text(json.dumps(row) + "\n")
    for path in (doc, part):
        (spec,) = [case_spec(r) for r in read_case_file(path)]
        assert spec == {k: v for k, v in row.items() if k != "methods"}


def _store_case(folder, lik, truth, x_hat, var_post, **row):
    """A kept case as ``bench_calibration.py --arrays`` leaves it: its arrays and its row."""
    np.savez(folder / "validation_ellipses_0_16_20_5.npz", truth=truth, x_hat=x_hat,
             var_post=var_post, **{f"heldout_{k}": v for k, v in lik.arrays().items()})
    (folder / "cases.jsonl").write_text(json.dumps(
        {"id": "validation/ellipses/0/16/20/5", "condition": "c", "family": "ellipses",
         **row}) + "\n")


def _store_blind_case(folder, seed: int, **row):
    """A stored 16² case whose held-out projections see nothing (tiny residuals, huge
    noise), with a truth 0.03 off the reconstruction: the maximum-likelihood fit drops
    the model error, a prior keeps it."""
    gen = np.random.default_rng(seed)
    size, m = 16, 40
    x_hat = ellipses(size, seed=3).astype(np.float64)
    var_post = np.full((size, size), 1e-4)
    truth = x_hat + gen.standard_normal(x_hat.shape) * 0.03
    B = gen.uniform(0, 1, (m, size * size))
    e2 = me.edge_strength(x_hat).square().reshape(-1).numpy()
    lik = me.HeldoutLikelihood(gen.standard_normal(m) * 1e-3, (B * 1e-4) @ B.T,
                               (B * 1e-4) @ B.T, (B * e2) @ B.T, 1e4, 3)
    _store_case(folder, lik, truth, x_hat, var_post, **row)


def test_tune_script_refits_stored_likelihoods_for_every_width(tmp_path):
    # a stored case whose held-out projections see nothing (tiny r, huge noise):
    # the maximum-likelihood fit drops the model error, a prior keeps it
    _store_blind_case(tmp_path, seed=0)
    cal = me.ModelErrorCoefficients(30.0, 0.05, "calibrated").save(tmp_path / "cal.json")
    res = subprocess.run([sys.executable, "scripts/tune_heldout_prior.py", "--partial",
                          str(tmp_path / "cases.jsonl"), "--arrays", str(tmp_path),
                          "--calibration", str(cal), "--widths", "0.5,inf"], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True, check=True, timeout=120)
    out = json.loads(res.stdout)
    row = {"id": "validation/ellipses/0/16/20/5", "condition": "c", "family": "ellipses"}
    direct = clean(tuning.tune_prior_width([row], tmp_path, cal, [0.5, math.inf]))
    assert direct["summary"] == out["summary"] and direct["chosen"] == out["chosen"]
    (case,) = out["cases"]
    assert case["inf"]["t0"] < 1e-3  # nothing seen: maximum likelihood drops it
    assert abs(math.log(case["0.5"]["t0"] / 30.0)) < 0.1  # the prior keeps it
    assert out["summary"]["0.5"]["coverage_2_mean"] > out["summary"]["inf"]["coverage_2_mean"]
    assert out["chosen"] in ("0.5", "inf") and out["summary"]["inf"]["images"] == 1
    # ±1σ beside the rule's scores: the prior that keeps the term covers more at ±1σ too
    assert out["summary"]["0.5"]["coverage_1_mean"] > out["summary"]["inf"]["coverage_1_mean"]
    bad = subprocess.run([sys.executable, "scripts/tune_heldout_prior.py"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert bad.returncode == 2 and "--partial" in bad.stderr  # argparse: required options


def test_tune_prior_width_skips_a_case_kept_without_a_heldout_likelihood(tmp_path):
    # a run with another model-error term keeps its arrays but no held-out likelihood:
    # such a case is not scored (it has nothing to refit), the others are
    coefficients = {"heldout": {"fit_excess": 0.5}}
    _store_blind_case(tmp_path, seed=2, coefficients=coefficients)
    x_hat = ellipses(16, seed=4).astype(np.float64)
    np.savez(tmp_path / "validation_ellipses_1_16_20_5.npz", truth=x_hat, x_hat=x_hat,
             var_post=np.full(x_hat.shape, 1e-4))
    rows = [{"id": f"validation/ellipses/{i}/16/20/5", "condition": "c", "family": "ellipses",
             "coefficients": coefficients} for i in (0, 1)]
    cal = me.ModelErrorCoefficients(30.0, 0.05, "calibrated").save(tmp_path / "cal.json")
    tuned = tuning.tune_prior_width(rows, tmp_path, cal, [0.5], checked=True)
    assert [c["id"] for c in tuned["cases"]] == ["validation/ellipses/0/16/20/5"]
    assert tuned["summary"]["0.5"]["images"] == 1


def test_t0_shrink_study_scales_the_checked_fit_and_skips_cases_without_arrays(tmp_path):
    # an excess below 1: 'checked' does not floor, t0 is the prior-held fit's
    coefficients = {"heldout": {"fit_excess": 0.5}}
    _store_blind_case(tmp_path, seed=1, coefficients=coefficients)
    other = {"id": "validation/ellipses/1/16/20/5", "condition": "c", "family": "ellipses",
             "coefficients": coefficients}  # no arrays kept: skipped
    with open(tmp_path / "cases.jsonl", "a") as f:
        f.write(json.dumps(other) + "\n")
    cal = me.ModelErrorCoefficients(30.0, 0.05, "calibrated").save(tmp_path / "cal.json")
    res = subprocess.run([sys.executable, "scripts/study_heldout_t0_shrink.py", "--partial",
                          str(tmp_path / "cases.jsonl"), "--arrays", str(tmp_path),
                          "--calibration", str(cal), "--width", "0.5", "--factors", "0,1"],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True, timeout=120)
    out = json.loads(res.stdout)
    (case,) = out["cases"]
    row = {"id": case["id"], "condition": "c", "family": "ellipses",
           "coefficients": coefficients}
    tuned = clean(tuning.tune_prior_width([row], tmp_path, cal, [0.5], checked=True))
    (direct,) = tuned["cases"]
    # factor 1 is the rule as it stands; factor 0 holds t0 at zero and is narrower
    assert case["t0"] == pytest.approx(direct["0.5 checked"]["t0"]) and case["t0"] > 1
    assert case["1"]["pixel_log_likelihood"] == pytest.approx(
        direct["0.5 checked"]["pixel_log_likelihood"])
    assert case["0"]["coverage_2"] < case["1"]["coverage_2"]
    assert out["summary"]["0"]["images"] == 1


def test_correlation_tuning_script_skips_scans_kept_without_their_image(tmp_path):
    # a likelihood stored before the held-out image was kept cannot be rebuilt: listed, skipped
    gen = np.random.default_rng(1)
    size, m = 16, 12
    x_hat = ellipses(size, seed=3).astype(np.float64)
    B = gen.uniform(0, 1, (m, size * size))
    lik = me.HeldoutLikelihood(gen.standard_normal(m), B @ B.T, B @ B.T, B @ B.T, 1.0, 3)
    _store_case(tmp_path, lik, x_hat, x_hat, np.full((size, size), 1e-4), size=size,
                n_angles=20)
    res = subprocess.run([sys.executable, "scripts/tune_heldout_correlation.py", "--partial",
                          str(tmp_path / "cases.jsonl"), "--arrays", str(tmp_path),
                          "--lengths", "0,1"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         check=True, timeout=120)
    out = json.loads(res.stdout)
    assert out["skipped"] == ["validation/ellipses/0/16/20/5"] and out["cases"] == []
    assert out["chosen"] is None and out["lengths"] == ["0.0", "1.0"]
    bad = subprocess.run([sys.executable, "scripts/tune_heldout_correlation.py"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert bad.returncode == 2 and "--partial" in bad.stderr


def test_variants_study_recovers_a_posterior_scale_and_scores_as_the_library(tmp_path):
    # held-out residuals drawn with 3x the posterior's projected variance, no model error
    gen = np.random.default_rng(4)
    size, m, p_true = 16, 400, 3.0
    x_hat = ellipses(size, seed=3).astype(np.float64)
    var_post = gen.uniform(0.5, 1.5, (size, size)) * 1e-4
    B = gen.uniform(0, 1, (m, size * size)) * (gen.uniform(size=(m, size * size)) < 0.1)
    M_post = (B * var_post.reshape(-1)) @ B.T
    e2 = me.edge_strength(x_hat).square().reshape(-1).numpy()
    noise = 1e-5
    r = np.linalg.cholesky(p_true * M_post + noise * np.eye(m)) @ gen.standard_normal(m)
    lik = me.HeldoutLikelihood(r, M_post, (B * var_post.mean()) @ B.T, (B * e2) @ B.T, noise, 3)
    truth = x_hat + gen.standard_normal(x_hat.shape) * np.sqrt(var_post)
    _store_case(tmp_path, lik, truth, x_hat, var_post)
    cal = me.ModelErrorCoefficients(0.0, 0.05, "calibrated").save(tmp_path / "cal.json")
    res = subprocess.run([sys.executable, "scripts/study_heldout_variants.py", "--partial",
                          str(tmp_path / "cases.jsonl"), "--arrays", str(tmp_path),
                          "--calibration", str(cal), "--taus", "0.5,inf", "--scales", "1"],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True, timeout=300)
    (case,) = json.loads(res.stdout)["cases"]
    fitted = case["posterior_scale heldout"]
    assert fitted["p"] == pytest.approx(p_true, rel=0.3)  # the scale the residuals carry
    assert fitted["t0"] < 0.5 and fitted["s1"] < 0.05
    # the truth-side grid is the library's total variance at t0 = 0 and the calibrated s1
    want = tuning.score_total(truth, torch.as_tensor(x_hat), torch.as_tensor(var_post),
                              me.ModelErrorCoefficients(0.0, 0.05, "heldout"))
    got = case["posterior_scale 1.0 s1x1.0"]
    for k in ("coverage_1", "coverage_2", "pixel_log_likelihood", "std_over_rmse"):
        assert got[k] == pytest.approx(want[k], rel=1e-9), k
    for tau in ("0.5", "inf"):  # the floor under s1
        assert case[f"half_normal {tau}"]["s1"] >= 0.05
    bad = subprocess.run([sys.executable, "scripts/study_heldout_variants.py"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert bad.returncode == 2 and "--partial" in bad.stderr


def test_carried_methods_are_copied_labelled_and_counted_per_method(tmp_path):
    earlier = tmp_path / "earlier.json"
    old = [{"id": i, "methods": {"fbp": {"c": 0}, "mc_dropout": {"c": 1}, "ivon": {"c": 2}},
            "times_s": {"mc_dropout": 5.0}, "coefficients": {}} for i in ("a", "b")]
    earlier.write_text(json.dumps({"cases": old}))
    new = [{"id": "a", "methods": {"fbp": {"c": 9}}, "times_s": {}, "coefficients": {}},
           {"id": "b", "methods": {"fbp": {"c": 9}, "ivon": {"c": 7}}, "times_s": {},
            "coefficients": {}}]
    bench_calibration.carry_methods(new, earlier)
    assert new[0]["methods"]["fbp"] == {"c": 9}  # what this run measured stays
    assert new[0]["methods"]["mc_dropout"] == {"c": 1} and new[0]["times_s"]["mc_dropout"] == 5
    assert new[1]["methods"]["ivon"] == {"c": 7} and new[1]["carried"]["methods"] == ["mc_dropout"]
    note = bench_calibration.carried_note(new)
    assert "`ivon` on 1 images" in note and "`mc_dropout` on 2 images" in note
    assert bench_calibration.carried_note([{"id": "c"}]) is None


def test_case_list_covers_every_family_and_condition_before_a_second_image():
    from ctuq.data.splits import FAMILIES

    cs = calibration_cases("test", [64], 2, None)
    n = len(FAMILIES["test"]) * len(CONDITIONS[64])
    first = cs[:n]
    assert {(c["family"], c["n_angles"], c["noise"]) for c in first} == {
        (f, a, z) for f in FAMILIES["test"] for a, z in CONDITIONS[64]}
    assert len({c["id"] for c in cs}) == len(cs) == 2 * n
    # a subset of conditions keeps the ids (and images) of the full list
    sub = calibration_cases("test", [64], 2, [(60, 0.05)])
    assert {c["id"] for c in sub} <= {c["id"] for c in cs}
    assert {(c["n_angles"], c["noise"]) for c in sub} == {(60, 0.05)}


def test_total_variance_is_the_model_error_terms_rule():
    """calibrated: posterior + the calibration's term; conformal: the posterior × q²."""
    import torch

    x_hat = torch.as_tensor(ellipses(16, seed=1))
    var_post = torch.full((16, 16), 1e-4, dtype=torch.float64) + x_hat.double() * 1e-4
    co = me.ModelErrorCoefficients(2.0, 0.1, "calibrated", conformal=1.5)
    cal = bench_calibration.total_variance("calibrated", x_hat, var_post, co)
    assert torch.allclose(cal, var_post + co.variance(x_hat, var_post), rtol=1e-12, atol=0)
    conf = bench_calibration.total_variance("conformal", x_hat, var_post, co)
    assert torch.allclose(conf, 1.5**2 * var_post, rtol=1e-12, atol=0)
    # a multiplier below 1 never narrows the posterior's interval
    low = me.ModelErrorCoefficients(2.0, 0.1, "calibrated", conformal=0.5)
    assert torch.equal(bench_calibration.total_variance("conformal", x_hat, var_post, low),
                       var_post)
    assert torch.equal(bench_calibration.total_variance("none", x_hat, var_post, co), var_post)
    with pytest.raises(ValueError):
        bench_calibration.total_variance("no-such-term", x_hat, var_post, co)


def test_realistic_cases_hide_the_noise_level_and_the_centre_and_never_share_an_image():
    """The realistic condition: no noise level and the nominal geometry go to ctuq, the
    truth only to the scores; its images are not those of the Gaussian conditions."""
    from ctuq.bench.cases import (REALISTIC_CONDITIONS, realistic_cases, simulate,
                                  sinogram)
    from ctuq.data.splits import FAMILIES

    cs = realistic_cases("test", [64], 2)
    assert len({c["id"] for c in cs}) == len(cs) == 2 * len(FAMILIES["test"]) * len(
        REALISTIC_CONDITIONS[64])
    gaussian = {(c["family"], c["index"]) for c in calibration_cases("test", [64, 128], 10)}
    assert not gaussian & {(c["family"], c["index"]) for c in cs}
    assert [case_spec(c) for c in cs] == cs  # I0 survives a round trip through a row
    case = realistic_cases("validation", [28], 1)[0]
    scan = simulate(case)
    sino = sinogram(scan, with_truth=False)
    assert "noise_std" not in sino.meta and sino.ground_truth is None
    assert sino.geometry.center_offset == 0.0 and scan.hidden["center_offset"] != 0.0
    assert 0.0 < abs(scan.hidden["center_offset"]) <= 0.5
    # the benchmark's baselines get the noise level a user would have: the estimate
    assert scan.sigma > 0 and scan.sigma != scan.hidden.get("noise_std_rms")


def test_variant_settings_reach_the_reconstruction_config():
    run = bench_calibration.CalibrationRun(quick=True, quick_iterations=7)
    case = calibration_cases("validation", [28], 1)[0]
    cfg = bench_calibration.reconstruction_config(
        case, run, {"dip": {"tv_weight_factor": 3.0}, "uncertainty": {"em_steps": 1},
                    "noise_std": 0.2}, predcp=False)
    dip, unc = cfg.resolve((28, 28))
    assert (dip.iterations, dip.tv_weight_factor, unc.em_steps) == (7, 3.0, 1)
    assert cfg.noise_std == 0.2 and cfg.seed == case["index"]
    name, settings = bench_calibration.parse_variant(
        "plain:noise_model=gaussian,dip.iterations=500,uncertainty.predcp=true")
    assert name == "_plain"
    assert settings == {"noise_model": "gaussian", "dip": {"iterations": 500},
                        "uncertainty": {"predcp": True}}
    # a list or inline table is one value: its commas do not split the pairs
    _, settings = bench_calibration.parse_variant(
        'net:dip.unet={scales = 4, channels = [16, 16, 16, 16]},dip.iterations=9,'
        'name="a,b"')
    assert settings == {"dip": {"unet": {"scales": 4, "channels": [16, 16, 16, 16]},
                                "iterations": 9}, "name": "a,b"}


def test_run_settings_reach_every_reconstruction_under_the_variants_own():
    run = bench_calibration.CalibrationRun(settings={
        "uncertainty": {"laplace": {"mean": "linear", "em_steps": 3}}, "dip": {"lr": 2e-3}})
    case = calibration_cases("validation", [28], 1)[0]
    plain = bench_calibration.reconstruction_config(case, run)
    _, unc = plain.resolve((28, 28))
    assert unc.laplace.mean == "linear" and unc.laplace.em_steps == 3
    assert plain.resolve((28, 28))[0].lr == 2e-3
    variant = bench_calibration.reconstruction_config(
        case, run, {"uncertainty": {"laplace": {"em_steps": 1}}})
    dip, unc = variant.resolve((28, 28))
    assert (unc.laplace.mean, unc.laplace.em_steps, dip.lr) == ("linear", 1, 2e-3)


def test_calibrate_from_bench_recovers_the_edge_term_of_kept_realistic_arrays(tmp_path):
    # truths drawn from exactly the calibrated model (s1 = 0.3, no constant term): the
    # script fits what ctuq calibrate fits, from a benchmark run's kept arrays
    gen = np.random.default_rng(4)
    rows = []
    for i in range(6):
        x_hat = ellipses(32, seed=200 + i).astype(np.float64)
        vp = gen.uniform(0.5, 1.5, x_hat.shape) * 1e-4
        var = vp + me.model_error_variance(x_hat, vp, 0.0, 0.3).numpy()
        truth = x_hat + gen.standard_normal(x_hat.shape) * np.sqrt(var)
        case = f"tuning/ellipses/{i}/32/60/I1e4"
        np.savez(tmp_path / (case.replace("/", "_") + ".npz"), truth=truth, x_hat=x_hat,
                 var_post=vp)
        rows.append({"id": case, "split": "tuning", "family": "ellipses", "size": 32,
                     "n_angles": 60, "I0": 1e4, "preset": "dip-64"})
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cal.json"
    cmd = [sys.executable, "scripts/calibrate_from_bench.py", "--partial",
           str(tmp_path / "rows.jsonl"), "--arrays", str(tmp_path), "--out", str(out),
           "--condition", "realistic"]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=120, stdout=subprocess.PIPE)
    co = me.ModelErrorCoefficients.load(out)
    assert abs(co.s1 - 0.3) < 0.03 and co.t0 < 0.1 and co.method == "calibrated"
    assert co.info["split"] == "tuning" and co.info["condition"] == "realistic"
    assert co.info["n_images"] == 6 and co.info["I0"] == [1e4]
    # a validation row is refused: a calibration is fitted on the tuning split only
    rows[0]["split"] = "validation"
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "tuning split only" in bad.stderr
    assert me.ModelErrorCoefficients.load(out) == co  # the earlier file is left as it was


def test_the_realistic_fbp_baseline_uses_the_centre_the_default_estimates():
    """A realistic scan's FBP baseline is the FBP a user of the default gets, on the
    estimated centre: a 2-px centre error does not cost it the image; rows scored at
    offset 0 (no ``fbp_center_offset``) are scored again, others left as they are."""
    import dataclasses

    from ctuq.bench.cases import (auto_center_record, realistic_cases, reconstruction_op,
                                  simulate)
    from ctuq.bench.scores import score
    from ctuq.data.realistic import realistic_case
    from ctuq.recon.baselines import fbp_variance

    case = realistic_cases("validation", [64], 1)[-1]
    assert case["I0"] == 1e5
    sino, truth, hidden = realistic_case(case["split"], case["family"], case["index"], 64,
                                         case["n_angles"], I0=case["I0"], center_offset=2.0)
    scan = dataclasses.replace(simulate(case), y=torch.as_tensor(np.asarray(sino.data)),
                               sinogram=sino, hidden=hidden)
    center = auto_center_record(scan)
    assert abs(center["used"] - 2.0) < 0.3
    x0, v0, _ = fbp_variance(scan.y, scan.op, scan.sigma, seed=scan.noise_seed)
    at_zero = score(truth, x0, v0.sqrt())
    ours = bench_calibration.fbp_scores(scan, center)
    assert ours["rmse"] < 0.7 * at_zero["rmse"]
    # the refits' operator (MC dropout, the held-out split study) is on that centre too;
    # a scan made the way ctuq models one keeps its own
    assert reconstruction_op(scan, center).geometry.center_offset == center["used"]
    assert reconstruction_op(scan).geometry.center_offset == pytest.approx(center["used"])
    standard = simulate({**case, "I0": None, "noise": 0.05})
    assert reconstruction_op(standard) is standard.op

    old = {**case, "realistic": {"default": {}}, "methods": {"fbp": at_zero}}
    kept = {**old, "methods": {"fbp": at_zero}, "fbp_center_offset": 0.0}
    assert bench_calibration.refresh_fbp([old, kept]) == 1
    fresh = simulate(case)
    c = auto_center_record(fresh)
    assert old["fbp_center_offset"] == c["used"]
    assert old["methods"]["fbp"]["rmse"] == pytest.approx(
        bench_calibration.fbp_scores(fresh, c)["rmse"], rel=1e-6)
    assert kept["methods"]["fbp"] is at_zero


def test_edge_feature_study_recovers_the_feature_and_scale_the_errors_were_drawn_with(tmp_path):
    """Errors drawn with variance ``var_post + s1² e(x̂)²`` (today's feature, s1 = 0.3):
    the study's oracle calibrates them (±1σ, ±2σ near nominal), prefers that feature by
    likelihood, and its one-for-all fit recovers ``s1``."""
    gen = np.random.default_rng(7)
    lines = []
    for k, seed in enumerate((3, 5)):
        x_hat = ellipses(32, seed=seed).astype(np.float64)
        var_post = gen.uniform(0.5, 1.5, x_hat.shape) * 1e-4
        e2 = me.edge_strength(x_hat).square().numpy()
        truth = x_hat + gen.standard_normal(x_hat.shape) * np.sqrt(var_post + 0.09 * e2)
        case_id = f"validation/ellipses/{k}/32/20/5"
        np.savez(tmp_path / (case_id.replace("/", "_") + ".npz"), truth=truth, x_hat=x_hat,
                 var_post=var_post)
        lines.append(json.dumps({"id": case_id}) + "\n")
    (tmp_path / "cases.jsonl").write_text("".join(lines))
    res = subprocess.run([sys.executable, "scripts/study_edge_features.py", "--partial",
                          str(tmp_path / "cases.jsonl"), "--arrays", str(tmp_path)],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True, timeout=300)
    out = json.loads(res.stdout)
    assert len(out["cases"]) == 2
    f = out["features"]
    today = f["max3"]
    assert abs(today["oracle"]["coverage_1_mean"] - 0.683) < 0.05
    assert abs(today["oracle"]["coverage_2_mean"] - 0.954) < 0.03
    assert today["global"]["s1"] == pytest.approx(0.3, rel=0.2)
    assert all(today["global"]["pixel_log_likelihood_mean"] >
               v["global"]["pixel_log_likelihood_mean"]
               for k, v in f.items() if k != "max3")
    bad = subprocess.run([sys.executable, "scripts/study_edge_features.py"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert bad.returncode == 2 and "--partial" in bad.stderr


def test_realistic_row_records_the_centre_its_reconstruction_used():
    """A realistic row says which centre the reconstruction used: the estimate where
    ``center_offset = 'auto'`` applied (the result's ``diagnostics['center']``), else the
    sinogram's own (nominal 0); the held-out refits rebuild on it."""
    from types import SimpleNamespace

    from ctuq.bench.cases import realistic_cases, realistic_record, simulate

    scan = simulate(realistic_cases("validation", [64], 1)[0])
    center = {"estimate": 0.31, "used": 0.31, "std": 0.02}
    auto = SimpleNamespace(config={"noise_std": 0.1},
                           diagnostics={"center": center, "verdict": "ok"})
    assert realistic_record(scan, auto, center)["center_offset_used"] == 0.31
    stated = SimpleNamespace(config={"noise_std": 0.1}, diagnostics={"verdict": "ok"})
    assert realistic_record(scan, stated, center)["center_offset_used"] == \
        scan.sinogram.geometry.center_offset == 0.0
