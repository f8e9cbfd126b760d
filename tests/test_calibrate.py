"""ctuq calibrate: coefficients from simulated scans of the tuning split."""

from pathlib import Path

import numpy as np
import pytest

from ctuq.app.cli import main
from ctuq.data.splits import DIGIT_RANGES
from ctuq.recon.calibrate import calibration_scans
from ctuq.recon.model_error import ModelErrorCoefficients

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = """
preset = "reference-28"
threads = 1
[dip]
iterations = 40
[uncertainty]
em_steps = 1
n_samples = 2
predictive_samples = 8
predcp = false
preconditioner_rank = 8
cg_max_iter = 40
"""


def test_scans_come_from_the_tuning_split_with_one_noise_draw_per_condition():
    scans = list(calibration_scans(28, families=["digits", "ellipses"], n_per_family=1,
                                   angles=(10, 20), noise_levels=(0.01, 0.05)))
    assert len(scans) == 8
    for case, _, _, sino in scans:
        assert case.split == "tuning" and sino.ground_truth is not None
        if case.family == "digits":
            assert DIGIT_RANGES["tuning"][0] <= case.phantom_seed < DIGIT_RANGES["tuning"][1]
    # the same image at two noise levels: different draws, not a rescaled copy
    a, b = [s for c, n_ang, _, s in scans if c.family == "digits" and n_ang == 20]
    ratio = a.data / np.where(b.data == 0, 1, b.data)
    assert np.ptp(ratio[np.abs(b.data) > 1e-3]) > 0.1


def test_cli_writes_a_usable_coefficients_file(tmp_path: Path, capsys):
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "me.json"
    rc = main(["calibrate", "--out", str(out), "--size", "28", "--families", "digits",
               "--n", "2", "--angles", "20", "--noise", "0.05",
               "--config", str(tmp_path / "tiny.toml")])
    assert rc == 0, capsys.readouterr().err
    c = ModelErrorCoefficients.load(out)
    assert c.method == "calibrated" and c.info["preset"] == "reference-28"
    assert c.info["split"] == "tuning" and len(c.info["scans"]) == 2
    assert np.isfinite([c.t0, c.s1, c.conformal]).all() and c.conformal > 0
    # refused a second time without --overwrite, with exit 2 and no traceback
    rc = main(["calibrate", "--out", str(out), "--size", "28", "--families", "digits",
               "--config", str(tmp_path / "tiny.toml")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "exists" in err


@pytest.mark.parametrize("args, option", [(["--families", "cats"], "famil"),
                                          (["--noise", "x"], "--noise"),
                                          (["--n", "0"], "--n")])
def test_cli_bad_values_exit_2(tmp_path: Path, capsys, args, option):
    rc = main(["calibrate", "--out", str(tmp_path / "x.json"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and option in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def _calibrate_one_scan(monkeypatch, **uncertainty):
    """``calibrate`` at 28² on one tuning scan with TINY's settings and ``uncertainty``
    merged in; returns the coefficients, what was fitted (``means``, ``variances``),
    the config and the scans."""
    import tomllib

    from ctuq.recon import calibrate as cal
    from ctuq.recon.config import ReconstructionConfig

    raw = tomllib.loads(TINY)
    raw["uncertainty"].update(uncertainty)
    config = ReconstructionConfig.from_dict(raw)
    scans = [(f"{c.name}", s) for c, _, _, s in calibration_scans(
        28, families=["ellipses"], n_per_family=1, angles=(20,), noise_levels=(0.01,))]
    seen = {}
    real_fit = cal.fit_to_truth

    def spy(truths, means, variances):
        seen["means"], seen["variances"] = means, variances
        return real_fit(truths, means, variances)

    monkeypatch.setattr(cal, "fit_to_truth", spy)
    return cal.calibrate(28, config, scans=scans), seen, config, scans


def test_calibrates_the_image_the_settings_show(monkeypatch):
    """With mean = 'linear-heldout' (which needs the held-out term) the coefficients are
    fitted to the stepped image the reconstruction shows, not to the DIP output."""
    from ctuq.recon.pipeline import reconstruct

    c, seen, config, scans = _calibrate_one_scan(monkeypatch,
                                                 laplace={"mean": "linear-heldout"})
    assert c.info["uncertainty"]["model_error"] == "heldout"
    r = reconstruct(scans[0][1], config.merged({"uncertainty": {"model_error": "heldout"}}))
    assert r.config["model_error"]["info"]["step_length"] is not None
    shown, dip = np.asarray(r.reconstruction), np.asarray(r.dip)
    assert np.abs(shown - dip).max() > 1e-4  # the step moved the image
    np.testing.assert_allclose(seen["means"][0], shown, atol=1e-5)
    np.testing.assert_allclose(seen["variances"][0], np.asarray(r.posterior_std) ** 2,
                               rtol=1e-4, atol=1e-12)


def test_calibration_from_a_benchmarks_tuning_arrays(tmp_path):
    """scripts/calibrate_from_bench.py fits what ctuq calibrate fits, to the kept images of a
    tuning-split benchmark run, and refuses cases of any other split."""
    import json
    import subprocess
    import sys

    from ctuq.data.phantoms import ellipses
    from ctuq.recon.calibrate import fit_calibration

    root = Path(__file__).resolve().parents[1]
    gen = np.random.default_rng(1)
    rows, arrays = [], []
    for i in range(2):
        truth = ellipses(16, seed=i).astype(np.float64)
        x_hat = truth + gen.standard_normal(truth.shape) * 0.05
        var_post = np.full(truth.shape, 1e-3)
        cid = f"tuning/ellipses/{i}/16/20/1"
        np.savez(tmp_path / (cid.replace("/", "_") + ".npz"), truth=truth, x_hat=x_hat,
                 var_post=var_post)
        rows.append({"id": cid, "split": "tuning", "family": "ellipses", "size": 16,
                     "n_angles": 20, "noise": 0.01, "preset": "reference-28"})
        arrays.append((truth, x_hat, var_post))
    part = tmp_path / "tune.jsonl"
    part.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cal.json"
    cmd = [sys.executable, "scripts/calibrate_from_bench.py", "--partial", str(part),
           "--arrays", str(tmp_path), "--out", str(out),
           "--settings", "uncertainty.laplace.mean=linear-heldout"]
    subprocess.run(cmd, cwd=root, check=True, capture_output=True, timeout=120)
    c = ModelErrorCoefficients.load(out)
    direct = fit_calibration(*zip(*arrays))
    assert c.t0 == pytest.approx(direct.t0) and c.s1 == pytest.approx(direct.s1)
    assert c.conformal == pytest.approx(direct.conformal) and c.t0 > 0.5  # the noise is seen
    assert c.info["split"] == "tuning" and c.info["scans"] == [r["id"] for r in rows]
    assert c.info["uncertainty"] == {"laplace": {"mean": "linear-heldout"}}
    # a validation case would leak into the figures measured on that split: refused
    part.write_text(part.read_text() + json.dumps({**rows[0], "id": "validation/x",
                                                   "split": "validation"}) + "\n")
    bad = subprocess.run(cmd[:-2] + ["--out", str(tmp_path / "bad.json")], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "validation split" in bad.stderr
    assert not (tmp_path / "bad.json").exists()


def test_calibrates_the_shared_fit_when_the_dip_continues_from_the_heldout_fit(monkeypatch):
    """With dip_from_heldout > 0 and the held-out term (dip-64's defaults) the image shown is
    the fit continued from the held-out fit: the coefficients are fitted to that image, not
    to a plain fit (what model_error = 'none' would make)."""
    from ctuq.recon import calibrate as cal
    from ctuq.recon.pipeline import reconstruct

    c, seen, config, scans = _calibrate_one_scan(monkeypatch, model_error="heldout",
                                                 dip_from_heldout=0.5)
    assert c.info["uncertainty"]["model_error"] == "heldout"
    shared = reconstruct(scans[0][1], config)
    plain = reconstruct(scans[0][1], config.merged({"uncertainty": {"model_error": "none"}}))
    assert shared.provenance["stages"]["counts"].get("dip_heldout_iterations")
    assert np.abs(np.asarray(shared.reconstruction) - np.asarray(plain.reconstruction)).max() > 1e-3
    np.testing.assert_allclose(seen["means"][0], np.asarray(shared.reconstruction), atol=1e-5)
    np.testing.assert_allclose(seen["variances"][0], np.asarray(shared.posterior_std) ** 2,
                               rtol=1e-4, atol=1e-12)
    # the plain fit's settings are calibrated without a model-error term, as before
    c = cal.calibrate(28, config.merged({"uncertainty": {"dip_from_heldout": 0.0}}), scans=scans)
    assert c.info["uncertainty"]["model_error"] == "none"


def test_default_families_are_those_of_the_shipped_calibration(monkeypatch, tmp_path):
    """Without --families a calibration remakes the shipped file's set of families (dip-64's
    has the photo crops, dip-128's not); a preset that ships none gets the four
    piecewise-constant ones; a file naming an unknown family is not trusted."""
    import json

    from ctuq.recon import calibrate as cal
    from ctuq.recon.model_error import coefficients as coef

    for size in (64, 128):
        shipped = coef.shipped_coefficients(f"dip-{size}")
        assert cal.default_families(size) == tuple(shipped.info["families"])
    assert "photos" in cal.default_families(64) and "photos" not in cal.default_families(128)
    assert coef.shipped_coefficients("reference-28") is None
    assert cal.default_families(28) == cal.CALIBRATION_FAMILIES
    # the scans follow the same default
    assert {c.family for c, *_ in cal.calibration_scans(
        12, families=None, n_per_family=1, angles=(8,), noise_levels=(0.05,))} \
        == set(cal.default_families(12))
    src = json.loads((coef.DEFAULTS_DIR / "dip-64.json").read_text())
    src["info"]["families"] = ["ellipses", "moons"]
    (tmp_path / "dip-64.json").write_text(json.dumps(src))
    monkeypatch.setattr(coef, "DEFAULTS_DIR", tmp_path)
    assert cal.default_families(64) == cal.CALIBRATION_FAMILIES
