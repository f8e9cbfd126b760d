"""``[uncertainty] method = "ivon"``: the pipeline's IVON method from
a TOML file into a valid result file, the model-error term on top of IVON's variance, progress
and cancel, and the settings' errors."""

from __future__ import annotations

import numpy as np
import pytest

import ctuq
from ctuq.data.io import read_result, write_sinogram
from ctuq.errors import Cancelled, InputError
from ctuq.recon import ivon_dip
from ctuq.recon.config import LAPLACE_ONLY, ReconstructionConfig

from conftest import digit_sinogram

pytestmark = pytest.mark.usefixtures("one_thread")

TOML = """
preset = "reference-28"
threads = 1
[dip]
iterations = 30
[uncertainty]
method = "ivon"
predictive_samples = 6
stored_samples = 2
model_error = "none"
prior = "matern"        # a Laplace setting (older flat form): not IVON's, not recorded
[uncertainty.ivon]
iterations = 20
"""

IVON_STEPS = 20


@pytest.fixture(scope="module")
def scan():
    return digit_sinogram(20)


def test_ivon_from_toml_end_to_end(tmp_path, scan):
    src = tmp_path / "scan.h5"
    write_sinogram(src, scan)
    cfg_path = tmp_path / "ivon.toml"
    cfg_path.write_text(TOML)
    cfg = ReconstructionConfig.from_toml(cfg_path)
    out = tmp_path / "scan_recon.h5"
    stages = []
    mem = ctuq.reconstruct_file(src, out, cfg,
                                progress=lambda **kw: stages.append(kw["stage"]))
    assert {"dip", "ivon_dip", "ivon_samples", "model error"} <= set(stages)
    assert "em" not in stages and "predictive" not in stages
    res = read_result(out)
    std = np.asarray(res.std)
    assert std.shape == (28, 28) and np.isfinite(std).all() and (std > 0).all()
    # model_error = none: the total std is IVON's
    np.testing.assert_allclose(std, res.posterior_std, rtol=1e-6)
    assert np.all(np.asarray(res.model_error_std) == 0)
    # the effective config says what ran: IVON and its settings, not the Laplace ones
    unc = res.config["uncertainty"]
    assert unc["method"] == "ivon" and unc["predictive_samples"] == 6
    assert not set(LAPLACE_ONLY) & set(unc) and "laplace" not in unc
    assert unc["ivon"]["iterations"] == IVON_STEPS and unc["ivon"]["hess_init"] == 1000.0
    assert "evidence" not in res.config
    ivon = res.config["ivon"]
    assert ivon["method"] == "ivon-dip" and ivon["config"]["iterations"] == IVON_STEPS
    assert ivon["config"]["n_samples"] == 6 and ivon["ivon"]["ess"] == pytest.approx(8.0)
    assert res.provenance["request"]["uncertainty"]["method"] == "ivon"
    assert res.em_trace == []
    hyper = res.hyperparameters
    assert hyper["method"] == "ivon" and hyper["sigma2"] == pytest.approx(scan.noise_std ** 2)
    assert hyper["temperature"] == pytest.approx(scan.data.size / 8.0)
    # IVON moved the mean away from the Adam fit, which is kept as `dip`
    assert not np.allclose(res.reconstruction, res.dip)
    assert np.asarray(res.samples).shape == (2, 28, 28)
    assert {"psnr", "psnr_dip", "coverage_2sigma", "pixel_log_likelihood"} <= set(res.metrics)
    # the in-memory posterior draws fresh weight samples
    post = mem.posterior
    # the posterior of the normalised problem, in data units (ctuq.recon.scaling)
    assert isinstance(post.inner, ivon_dip.IVONPosterior) and post.scale > 0
    draws = post.sample(4, seed=3)
    assert draws.shape == (4, 28, 28) and np.isfinite(draws).all()
    assert np.array_equal(draws, post.sample(4, seed=3))
    assert post.region_std((slice(8, 20), slice(8, 20)), n=4) > 0
    assert np.allclose(post.zero_mean_samples(4, seed=3).mean(0), 0, atol=1e-6)


def test_model_error_adds_to_ivon_variance_and_cancel(scan):
    cfg = ReconstructionConfig(preset="reference-28", threads=1, dip={"iterations": 30},
                               uncertainty={"method": "ivon", "predictive_samples": 4,
                                            "stored_samples": 0, "model_error": "heldout",
                                            "heldout_every": 4,
                                            "ivon": {"iterations": IVON_STEPS}})
    res = ctuq.reconstruct(scan, cfg)
    total, post, me = (np.asarray(a, dtype=np.float64)
                       for a in (res.std, res.posterior_std, res.model_error_std))
    np.testing.assert_allclose(total ** 2, post ** 2 + me ** 2, rtol=1e-4, atol=1e-10)
    assert (me > 0).any() and (total >= post * (1 - 1e-6)).all()
    assert res.config["model_error"]["t0"] >= 0 and res.samples is None

    def cancel_in_ivon():
        return "ivon_dip" in seen

    seen = []
    with pytest.raises(Cancelled):
        ctuq.reconstruct(scan, cfg, progress=lambda **kw: seen.append(kw["stage"]),
                         cancel=cancel_in_ivon)
    assert "ivon_samples" not in seen and "model error" not in seen


@pytest.mark.parametrize("text, field", [
    ("method = 'variational'", "uncertainty.method"),
    ("method = 'ivon'\npredictive_samples = 1", "uncertainty.predictive_samples"),
    ("method = 'ivon'\nmodel_error = 'calibrated'", "uncertainty.model_error_file"),
    ("method = 'ivon'\n[uncertainty.ivon]\nlr = -1", "uncertainty.ivon.lr"),
    ("method = 'ivon'\n[uncertainty.ivon]\nsteps = 3", "uncertainty.ivon.steps"),
    ("[uncertainty.laplace]\nn_samples = 0", "uncertainty.laplace.n_samples"),
    ("n_samples = 3\n[uncertainty.laplace]\nn_samples = 4", "uncertainty.n_samples"),
])
def test_bad_ivon_settings_name_the_key(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(f"[uncertainty]\n{text}\n")
    with pytest.raises(InputError) as err:
        ReconstructionConfig.from_toml(path)
    assert err.value.field == field and err.value.file == str(path)


def test_laplace_is_the_default():
    _, unc = ReconstructionConfig().resolve((28, 28))
    assert unc.method == "laplace"
