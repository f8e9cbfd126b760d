"""The uncertainty methods behind one interface (ctuq.recon.methods): MC dropout reachable
from the API and the CLI, a method registered from outside ctuq runs end to end, and
the posterior handle's samples and region stds carry the model error."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import ctuq
from ctuq.data.io import read_result, write_sinogram
from ctuq.errors import InputError
from ctuq.fields import setting, validate
from ctuq.recon.config import ReconstructionConfig
from ctuq.recon.methods import METHODS, register
from ctuq.recon.methods.base import UncertaintyMethod, UncertaintyOutcome
from ctuq.recon.model_error import ModelErrorCoefficients
from ctuq.recon.posterior_handle import PosteriorHandle

from conftest import digit_sinogram

pytestmark = pytest.mark.usefixtures("one_thread")

MC = {"method": "mc-dropout", "predictive_samples": 8, "stored_samples": 2,
      "model_error": "none"}


@pytest.fixture(scope="module")
def scan():
    return digit_sinogram(20)


def _cfg(**unc):
    return ReconstructionConfig(preset="reference-28", threads=1, dip={"iterations": 30},
                                uncertainty=unc)


def test_mc_dropout_through_the_api(scan, tmp_path):
    r = ctuq.reconstruct(scan, _cfg(**MC, mc_dropout={"dropout": 0.1}))
    assert r.std.shape == (28, 28) and np.isfinite(r.std).all() and (r.std > 0).all()
    np.testing.assert_allclose(r.std, r.posterior_std, rtol=1e-6)  # model_error none
    unc = r.config["uncertainty"]
    assert unc["method"] == "mc-dropout" and unc["mc_dropout"] == {"dropout": 0.1,
                                                                   "batch_size": 16}
    assert "laplace" not in unc and r.config["dip"]["dropout"] == 0.1
    assert r.hyperparameters["dropout"] == 0.1 and r.em_trace == []
    assert {"psnr", "psnr_dip", "coverage_2sigma"} <= set(r.metrics)
    assert np.asarray(r.samples).shape == (2, 28, 28)
    # the same result layout on disk
    back = read_result(r.save(tmp_path / "mc.h5"))
    np.testing.assert_allclose(back.std, r.std)
    assert back.config["uncertainty"]["method"] == "mc-dropout"
    draws = r.posterior.sample(4, seed=2)
    assert draws.shape == (4, 28, 28) and np.array_equal(draws, r.posterior.sample(4, seed=2))


def test_mc_dropout_through_the_cli(scan, tmp_path):
    from ctuq.app.cli import main

    src = tmp_path / "scan.h5"
    write_sinogram(src, scan)
    (tmp_path / "mc.toml").write_text(
        'preset = "reference-28"\nthreads = 1\n[dip]\niterations = 20\n'
        '[uncertainty]\nmethod = "mc-dropout"\npredictive_samples = 4\nmodel_error = "none"\n'
        '[uncertainty.mc_dropout]\ndropout = 0.05\n')
    out = tmp_path / "out"
    rc = main(["reconstruct", str(src), "--out", str(out), "--config", str(tmp_path / "mc.toml")])
    assert rc == 0
    (path,) = [p for p in out.glob("*.h5")]
    r = read_result(path)
    assert r.config["uncertainty"]["method"] == "mc-dropout" and (np.asarray(r.std) > 0).all()


def test_unknown_method_and_bad_subtable_name_the_key():
    with pytest.raises(InputError) as err:
        _cfg(method="mcmc")
    assert err.value.field == "uncertainty.method" and "mc-dropout" in err.value.message
    with pytest.raises(InputError) as err:
        _cfg(method="mc-dropout", mc_dropout={"dropout": 1.5})
    assert err.value.field == "uncertainty.mc_dropout.dropout"
    with pytest.raises(InputError) as err:
        _cfg(method="mc-dropout", predictive_samples=1)
    assert err.value.field == "uncertainty.predictive_samples"


# -- a method registered from a test: one class and one registry line --------------------


@dataclass(frozen=True)
class ConstantSettings:
    std: float = setting(0.25, kind=float, greater_than=0, maximum=1e6, doc="The std.")

    def __post_init__(self):
        validate(self, prefix="uncertainty.constant_std")


class ConstantPosterior(PosteriorHandle):
    def __init__(self, mean, std, seed):
        super().__init__(mean, seed=seed)
        self.value = std

    def fluctuations(self, n, seed):
        rng = np.random.default_rng(seed)
        return self.value * rng.standard_normal((n, *self.image_shape))


class ConstantStd(UncertaintyMethod):
    """A toy method: the DIP output with the same std everywhere."""

    name = "constant-std"
    settings_class = ConstantSettings

    def run(self, problem, dip, *, stages, progress=None, cancel=None):
        mean = dip.reconstruction.detach().cpu()
        var = torch.full(mean.shape, self.settings.std**2, dtype=torch.float64)
        post = ConstantPosterior(mean.numpy(), self.settings.std, problem.seed)
        z = torch.as_tensor(post.fluctuations(4, 0), dtype=torch.float32)
        return UncertaintyOutcome(reconstruction=mean, variance=var, samples=mean + z,
                                  fluctuations=z, noise_var=problem.noise.variance,
                                  posterior=post, hyperparameters={"std": self.settings.std})


@pytest.fixture
def constant_method():
    register(ConstantStd)
    yield ConstantStd
    del METHODS[ConstantStd.name]


def test_a_registered_method_runs_through_reconstruct(scan, constant_method, tmp_path):
    r = ctuq.reconstruct(scan, _cfg(method="constant-std", constant_std={"std": 0.125},
                                    model_error="none", stored_samples=2))
    # the method's std is in the units of the normalised data (ctuq.recon.scaling)
    s = r.config["data_scale"]
    np.testing.assert_allclose(r.posterior_std, 0.125 * s, rtol=1e-6)
    np.testing.assert_array_equal(r.reconstruction, r.dip)
    assert r.config["uncertainty"]["constant_std"] == {"std": 0.125}
    assert r.hyperparameters == {"std": 0.125, "data_scale": s} and r.em_trace == []
    assert np.asarray(r.samples).shape == (2, 28, 28)
    assert read_result(r.save(tmp_path / "c.h5")).config["uncertainty"]["method"] == \
        "constant-std"
    with pytest.raises(InputError, match="uncertainty.constant_std.std"):
        _cfg(method="constant-std", constant_std={"std": -1.0})


# -- samples and region stds include the model error ---------------------------------------


@pytest.fixture(scope="module")
def with_model_error(scan, tmp_path_factory):
    # a calibration with a large model error, so that it dominates the total
    path = ModelErrorCoefficients(3.0, 0.5, "calibrated").save(
        tmp_path_factory.mktemp("me") / "c.json")
    # CG run to convergence: the pipeline's std and the handle's fresh draws are two
    # sets of draws of one posterior only then (60 iterations left the normalised
    # problem's draws 1.6× too wide, and the two sets apart)
    return ctuq.reconstruct(scan, _cfg(em_steps=1, n_samples=2, predictive_samples=32,
                                       predcp=False, preconditioner_rank=16, cg_max_iter=300,
                                       model_error="calibrated", model_error_file=str(path)))


def test_samples_carry_the_total_variance(with_model_error):
    r = with_model_error
    post, total = r.posterior, np.asarray(r.variance, np.float64)
    me = np.asarray(r.model_error_std, np.float64) ** 2
    assert me.mean() > 2 * (np.asarray(r.posterior_std, np.float64) ** 2).mean()
    # 32 draws (each a CG solve of this network: the file's cost): on three seeds the
    # ratios below came out 0.98-1.01, far inside the bounds
    n = 32
    x = post.sample(n, seed=4).astype(np.float64)
    var = x.var(axis=0, ddof=1)
    # pixel-averaged: Monte-Carlo error ≈ √(2/n) / √(pixels) of the mean, far below 10 %
    assert var.mean() == pytest.approx(total.mean(), rel=0.1)
    # the posterior part alone is what it was (narrower)
    alone = post.sample(n, seed=4, include_model_error=False).astype(np.float64).var(0, ddof=1)
    assert alone.mean() == pytest.approx(total.mean() - me.mean(), rel=0.25)
    assert post.std(8, seed=1).mean() > post.std(8, seed=1, include_model_error=False).mean()


def test_region_std_of_one_pixel_is_that_pixels_total_std(with_model_error):
    r = with_model_error
    post = r.posterior
    me = np.asarray(r.model_error_std, np.float64) ** 2
    i, j = np.unravel_index(np.argmax(me), me.shape)
    got = post.region_std((slice(i, i + 1), slice(j, j + 1)), seed=3)
    assert got == pytest.approx(float(np.asarray(r.std)[i, j]), rel=0.1)
    # the model-error part is exact: Σ_R v / |R|² for a region
    region = (slice(5, 15), slice(8, 20))
    parts = post.region_std_parts(region, seed=3)
    # (the result keeps the std in float32)
    assert parts["model_error"] == pytest.approx(np.sqrt(me[region].sum()) / me[region].size,
                                                 rel=1e-6)
    assert parts["total"] == pytest.approx(np.hypot(parts["posterior"], parts["model_error"]))
    assert parts["posterior_relative_error"] == pytest.approx(1 / np.sqrt(64))
    assert post.region_std(region, seed=3, include_model_error=False) == \
        pytest.approx(parts["posterior"])


class CountingPosterior(ConstantPosterior):
    calls = 0

    def fluctuations(self, n, seed):
        self.calls += 1
        return super().fluctuations(n, seed)


def test_regions_of_one_explicit_seed_share_one_set_of_draws():
    post = CountingPosterior(np.zeros((6, 6), np.float32), 0.5, seed=0)
    a = post.region_std_parts((slice(0, 3), slice(0, 6)), n=8, seed=7)
    b = post.region_std_parts((slice(3, 6), slice(0, 6)), n=8, seed=7)
    again = post.region_std_parts((slice(0, 3), slice(0, 6)), n=8, seed=7)
    assert post.calls == 1 and again == a and a != b
    z = post.zero_mean_samples(8, seed=7)
    z[:] = 0.0  # a caller's edits do not reach the kept draws
    assert post.region_std_parts((slice(0, 3), slice(0, 6)), n=8, seed=7) == a
    post.region_std_parts((slice(0, 3), slice(0, 6)), n=8, seed=8)  # another seed draws
    c = post.region_std_parts((slice(0, 3), slice(0, 6)), n=4, seed=7)  # so does another n
    post.std(8)  # no seed: fresh draws every call
    post.std(8)
    assert post.calls == 5
    # seedless draws leave the kept entry alone
    assert post.region_std_parts((slice(0, 3), slice(0, 6)), n=4, seed=7) == c
    assert post.calls == 5
