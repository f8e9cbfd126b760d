"""A calibration-benchmark case scores exactly what the product writes for the same scan.

The benchmark (ctuq.bench.calibration.run_case) reconstructs in memory with
``ctuq.reconstruct``; here the same simulated scan goes through the product's
file path instead: written as a sinogram file, reconstructed by
``ctuq.reconstruct_file``, read back with ``ctuq.read_result`` and scored by the
same function. Every score of every method derived from the result must agree.
"""

import numpy as np
import pytest

import ctuq
from ctuq.bench import calibration as cal
from ctuq.bench.cases import calibration_cases, simulate, sinogram
from ctuq.bench.runner import clean
from ctuq.bench.scores import score
from ctuq.data.io.npz_file import write_sinogram_npz
from ctuq.recon.model_error import ModelErrorCoefficients

pytestmark = pytest.mark.usefixtures("one_thread")


def _quick_case(tmp_path, family: str, prior: bool = False, **run_settings):
    """A 28² test case run quickly with arrays kept: ``(case, preset, calibration, run, row)``.

    ctuq ships no calibration for the 28² preset: a made-up one, for calibrated/conformal
    and, with ``prior``, as the held-out fit's prior too (``model_error_file``).
    """
    case = next(c for c in calibration_cases("test", [28], 1) if c["family"] == family)
    config = cal.reconstruction_config(case, cal.CalibrationRun())
    preset = config.preset_for((case["size"], case["size"]))
    calibration = ModelErrorCoefficients(1.5, 0.05, "calibrated", conformal=1.3)
    (tmp_path / "cal").mkdir()
    calibration.save(tmp_path / "cal" / f"{preset}.json")
    run = cal.CalibrationRun(quick=True, quick_iterations=40, predcp_variants=(False,),
                             calibration=str(tmp_path / "cal"), mc_dropout=False,
                             arrays=str(tmp_path / "arrays"),
                             uncertainty={"n_samples": 2, "predictive_samples": 16,
                                          **({"model_error_file": str(
                                              tmp_path / "cal" / f"{preset}.json")}
                                             if prior else {})},
                             **run_settings)
    return case, preset, calibration, run, cal.run_case(case, run)


def test_benchmark_case_equals_the_scores_of_the_products_result_file(tmp_path):
    case, preset, calibration, run, row = _quick_case(tmp_path, "digits", prior=True)

    scan = simulate(case)
    write_sinogram_npz(tmp_path / "scan.npz", sinogram(scan, with_truth=False))
    config = cal.reconstruction_config(case, run)
    ctuq.reconstruct_file(tmp_path / "scan.npz", tmp_path / "scan.ctuq.h5", config)
    result = ctuq.read_result(tmp_path / "scan.ctuq.h5")
    from_file = clean(cal.result_methods(result, scan.truth, calibration))

    names = {"posterior", "heldout", "heldout_mle", "calibrated", "conformal"}
    assert set(from_file["methods"]) == names
    assert from_file["methods"] == {k: row["methods"][k] for k in names}
    assert from_file["coefficients"] == {k: row["coefficients"][k] for k in
                                         ("heldout", "heldout_mle")}
    # the figures are of the product's own std: the file's total std scores as `heldout`
    assert row["methods"]["heldout"] == clean(score(scan.truth, result.reconstruction,
                                                    result.std))
    # and the row says how the EM's solves ended, as the file's trace does
    from ctuq.recon.pipeline import solver_outcome

    untimed = {k: v for k, v in row["solver"]["default"].items() if k != "em_s"}
    assert untimed == {k: v for k, v in solver_outcome(result.em_trace).items() if k != "em_s"}
    assert row["solver"]["default"]["em_steps"] == len(result.em_trace) > 0
    # with the EM's own cost, which the method's seconds (DIP included) hide
    assert row["solver"]["default"]["solver_iterations"] > 0
    assert 0 < row["solver"]["default"]["em_s"] <= result.config["timings_s"]["em"]
    # and the summary averages them over the reconstructions (here two rows, one each)
    other = {**row, "solver": {"default": {**row["solver"]["default"], "em_s": 0.0}}}
    (block,) = cal.summarize([row, other], "heldout").values()
    assert block["solver"]["em_s_mean"] == pytest.approx(row["solver"]["default"]["em_s"] / 2)
    assert block["solver"]["em_steps_mean"] == row["solver"]["default"]["em_steps"]

    # the kept arrays rescore a row scored before its calibration existed, to the same figures
    bare = {**row, "methods": {k: v for k, v in row["methods"].items()
                               if k not in ("calibrated", "conformal")},
            "times_s": dict(row["times_s"])}
    cal.rescore([bare], run)
    assert {k: bare["methods"][k] for k in ("calibrated", "conformal")} == \
        {k: row["methods"][k] for k in ("calibrated", "conformal")}
    # and hold the held-out likelihood that the tuning refits: its MLE is the row's
    from ctuq.bench.tuning import tune_prior_width

    cal_file = tmp_path / "cal" / f"{preset}.json"
    tuned = tune_prior_width([row], tmp_path / "arrays", cal_file, [float("inf"), 0.5],
                             calibration_floor=True, excess_thresholds=[0.0, 1e9],
                             noise_rules=["residual", "given"])
    (fit,) = tuned["cases"]
    assert fit["inf"]["t0"] == pytest.approx(row["coefficients"]["heldout_mle"]["t0"], abs=1e-6)
    assert fit["inf"]["s1"] == pytest.approx(row["coefficients"]["heldout_mle"]["s1"], abs=1e-6)
    # the calibration as a lower bound: a candidate of the rule beside the widths
    assert tuned["candidates"] == ["inf", "0.5", "0.5 floor", "0.5 auto 0", "0.5 auto 1e+09",
                                   "0.5 residual", "0.5 given", "0.5 auto 0 residual",
                                   "0.5 auto 1e+09 residual", "0.5 auto 0 given",
                                   "0.5 auto 1e+09 given"]
    # the noise rules: σ² scaled by the excess of a fit the check accepts (the run's own
    # rule, 'residual', so the same as the kept likelihood as it is), or the run's σ²
    from ctuq.recon.model_error.terms import heldout_noise_scale

    scale = heldout_noise_scale("residual", {"chi2_dof": fit["fit_excess"],
                                             "verdict": fit["verdict"]})
    assert row["coefficients"]["heldout"]["noise_scale"] == pytest.approx(scale, rel=1e-4)
    assert all(fit["0.5 residual"][k] == fit["0.5"][k] for k in ("t0", "s1"))
    same = [fit["0.5 given"][k] == fit["0.5"][k] for k in ("t0", "s1")]
    assert all(same) if scale == 1.0 else not all(same)
    # the run's recorded excess is the one measured again on the scan simulated anew
    from ctuq.bench.tuning import row_fit_excess

    recorded = row["coefficients"]["heldout"]["fit_excess"]
    bare = {**row, "coefficients": {"heldout": {"t0": 0.0, "s1": 0.0}}}
    x_hat = np.load(next((tmp_path / "arrays").glob("*.npz")))["x_hat"]
    assert fit["fit_excess"] == recorded
    assert row_fit_excess(bare, x_hat) == pytest.approx(recorded, rel=1e-4)
    # floored above the threshold, free below it
    for k in ("t0", "s1"):
        assert fit["0.5 auto 0"][k] == fit["0.5 floor"][k]
        assert fit["0.5 auto 1e+09"][k] == fit["0.5"][k]
    prior = ModelErrorCoefficients.load(cal_file)
    for k in ("t0", "s1"):
        got, bound = fit["0.5 floor"][k], getattr(prior, k)
        assert (got == 0.0) if bound < 1e-3 else (got >= bound)
    # rebuilt on the benchmark's geometry at the run's own correlation length, the same fit
    from ctuq.bench.tuning import tune_correlation_length

    rebuilt = tune_correlation_length([row], tmp_path / "arrays", [0.0, 2.0])
    (fit,) = rebuilt["cases"]
    for k in ("t0", "s1"):
        assert fit["0.0"][k] == pytest.approx(row["coefficients"]["heldout_mle"][k], abs=1e-6)
    assert set(rebuilt["summary"]) == {"0.0", "2.0"} and rebuilt["chosen"] in rebuilt["summary"]


def test_kept_likelihood_is_the_one_the_run_judged_its_stepped_image_with(tmp_path):
    """With mean = 'linear-heldout' the held-out term judges the held-out fit's own stepped
    image; the arrays a benchmark keeps for tuning are that very likelihood, so refitting
    them reproduces the run's coefficients (a refit of the held-out DIP alone would judge
    its unstepped output and miss them)."""
    from ctuq.bench.tuning import tune_prior_width

    _, preset, _, _, row = _quick_case(
        tmp_path, "ellipses", settings={"uncertainty": {"laplace": {"mean": "linear-heldout"}}})
    tuned = tune_prior_width([row], tmp_path / "arrays", tmp_path / "cal" / f"{preset}.json",
                             [float("inf")])
    (fit,) = tuned["cases"]
    for k in ("t0", "s1"):
        assert fit["inf"][k] == pytest.approx(row["coefficients"]["heldout_mle"][k], abs=1e-6)


def test_a_variant_keeps_its_own_image_and_likelihood_for_the_tuning(tmp_path):
    """A variant that fits another DIP (here fewer iterations) keeps its own image beside
    the default's; tuning the variant refits its likelihood with its image and
    reproduces its maximum-likelihood coefficients, the default's stay the default's."""
    from ctuq.bench.tuning import tune_prior_width

    _, preset, _, _, row = _quick_case(tmp_path, "ellipses",
                                       variants=(("_short", {"dip": {"iterations": 25}}),))
    kept = np.load(next((tmp_path / "arrays").glob("*.npz")))
    assert np.abs(kept["x_hat"] - kept["x_hat_short"]).max() > 0
    for suffix in ("", "_short"):
        tuned = tune_prior_width([row], tmp_path / "arrays",
                                 tmp_path / "cal" / f"{preset}.json", [float("inf")],
                                 suffix=suffix)
        (fit,) = tuned["cases"]
        for k in ("t0", "s1"):
            assert fit["inf"][k] == pytest.approx(
                row["coefficients"]["heldout_mle" + suffix][k], abs=1e-6)
        # scored with the variant's own image: the MLE's scores are the row's
        for k in ("coverage_2", "pixel_log_likelihood"):
            assert fit["inf"][k] == pytest.approx(row["methods"]["heldout_mle" + suffix][k],
                                                  abs=1e-4)
