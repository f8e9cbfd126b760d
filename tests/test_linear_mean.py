"""``uncertainty.laplace.mean = 'linear'``: the linearised model's posterior mean as the image.

Checked against the dense float64 posterior (one 28² digit, a small U-net
fitted briefly, so that the DIP under-fits and the step matters), and
through the pipeline: the same posterior draws, another centre.
"""

import numpy as np
import pytest
import torch

import ctuq
from ctuq.errors import InputError
from ctuq.recon.config import ReconstructionConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_linear_mean_is_the_dense_posterior_mean_of_the_linear_model():
    from conftest import small_dip_problem

    from ctuq.posterior import ExactPosterior
    from ctuq.recon.evidence import fit_posterior, initial_prior, uncertainty_options
    from ctuq.recon.methods.laplace import (LaplaceSettings, linear_step_of_fit,
                                            linear_mean_shift)

    p = small_dip_problem(80)
    op, y, sigma, lin, lik = p.op, p.y, p.sigma, p.lin, p.lik
    opts = uncertainty_options(LaplaceSettings(n_samples=4, em_steps=2, cg_tol=1e-6,
                                               cg_max_iter=2000),
                               learn_noise=False, seed=0)
    post = fit_posterior(lin, op, y, sigma**2, **opts, likelihood=lik)
    shift = linear_mean_shift(lin, post)
    assert shift.shape == (28, 28)

    exact = ExactPosterior(lik, post.prior, post.noise_var)
    with torch.no_grad():
        expected = (exact.J @ (exact.theta_star() - lin.theta_hat.double())).reshape(28, 28)
    err = float((shift.double() - expected).norm() / expected.norm())
    assert err < 1e-3
    # the step is not negligible on an under-fitted DIP, and it moves the image
    # towards the data: the linear model's residual is what its mean explains
    x_lin = (lin.x_hat + shift).double()
    A = exact.A
    res_dip = float((A @ lin.x_hat.double().reshape(-1) - y.double().reshape(-1)).norm())
    res_lin = float((A @ x_lin.reshape(-1) - y.double().reshape(-1)).norm())
    assert float(shift.norm()) > 0.05 * float(lin.x_hat.norm())
    assert res_lin < res_dip

    # the same image for another fit (the held-out model error's): applied to this fit
    # and its rows, the fresh solve under the fitted prior gives the same mean
    again = linear_step_of_fit(post)(p.dip, op, y)
    err = float((again.double() - expected).norm() / expected.norm())
    assert err < 1e-3

    # another fit of the same scan (fewer iterations, other weights): the dense posterior
    # mean of its own linear model under the fitted g, the g-prior's scales its own
    # (the first fit's would differ: g-prior scales follow the Jacobian's columns)
    other = small_dip_problem(30)
    x_other = other.dip.reconstruction + linear_step_of_fit(post)(other.dip, op, y)
    prior_other = initial_prior(other.lik, "gprior", init_variance=1.0,
                                generator=torch.Generator().manual_seed(0))
    prior_other.set_hyperparameters(variances=post.prior.variances.detach())
    assert not torch.allclose(prior_other.scale, post.prior.scale, rtol=0.05)
    exact_other = ExactPosterior(other.lik, prior_other, post.noise_var)
    with torch.no_grad():
        expected_other = other.dip.reconstruction.double() + (exact_other.J @ (
            exact_other.theta_star() - other.lin.theta_hat.double())).reshape(28, 28)
    err = float((x_other.double() - expected_other).norm()
                / (expected_other - other.dip.reconstruction.double()).norm())
    assert err < 1e-2, err
    # and its step explains its data better than its output does
    res_other = float((A @ other.dip.reconstruction.double().reshape(-1)
                       - y.double().reshape(-1)).norm())
    res_step = float((A @ x_other.double().reshape(-1) - y.double().reshape(-1)).norm())
    assert res_step < 0.9 * res_other, (res_step, res_other)


@pytest.fixture(scope="module")
def runs():
    from conftest import digit_sinogram

    sino = digit_sinogram()
    base = dict(seed=0, device="cpu", threads=1, dip={"iterations": 60})
    unc = {"predictive_samples": 8, "laplace": {"em_steps": 2, "n_samples": 4}}
    dip = ctuq.reconstruct(sino, ReconstructionConfig(**base, uncertainty=unc))
    lin = ctuq.reconstruct(sino, ReconstructionConfig(
        **base, uncertainty={**unc, "laplace": {**unc["laplace"], "mean": "linear"}}))
    held = ctuq.reconstruct(sino, ReconstructionConfig(
        **base, uncertainty={**unc, "laplace": {**unc["laplace"], "mean": "linear-heldout"}}))
    return dip, lin, held


def test_pipeline_shows_the_linear_mean_with_the_same_posterior(runs):
    dip, lin, _ = runs
    # the same fit, EM and draws: the posterior std is the same, the centre is not
    np.testing.assert_array_equal(dip.posterior_std, lin.posterior_std)
    np.testing.assert_array_equal(dip.dip, lin.dip)
    assert not np.allclose(dip.reconstruction, lin.reconstruction)
    assert lin.metrics["psnr_dip"] == pytest.approx(dip.metrics["psnr"])
    # the shown image is the in-memory posterior's linear model at θ*, in data units
    handle = lin.posterior
    inner = getattr(handle, "inner", handle)
    scale = float(getattr(handle, "scale", 1.0))
    with torch.no_grad():
        x_lin = inner.linearization.linear_model(inner.fitted.theta_star).cpu().numpy()
    np.testing.assert_allclose(lin.reconstruction, scale * x_lin, rtol=1e-4,
                               atol=1e-5 * float(np.abs(lin.reconstruction).max()))
    # its samples are centred on it
    np.testing.assert_allclose(handle.mean, lin.reconstruction, rtol=1e-6, atol=1e-7)
    assert lin.config["uncertainty"]["laplace"]["mean"] == "linear"


def test_pipeline_takes_the_step_at_the_held_out_length(runs):
    dip, lin, held = runs
    np.testing.assert_array_equal(dip.posterior_std, held.posterior_std)
    a = held.config["model_error"]["info"]["step_length"]
    assert 0.0 <= a <= 1.0
    assert lin.config["model_error"]["info"]["step_length"] == 1.0
    # the DIP output plus the step at that length, in data units; samples centred on it
    np.testing.assert_allclose(held.reconstruction, dip.dip + a * (lin.reconstruction - lin.dip),
                               rtol=1e-4, atol=1e-5 * float(np.abs(held.reconstruction).max()))
    np.testing.assert_allclose(held.posterior.mean, held.reconstruction, rtol=1e-6, atol=1e-7)
    if held.samples is not None and len(held.samples):
        np.testing.assert_allclose(held.samples - held.reconstruction,
                                   lin.samples - lin.reconstruction, rtol=1e-4, atol=1e-6)
    assert "psnr_dip" in held.metrics


def test_heldout_model_error_judges_the_held_out_fit_with_its_own_step():
    """The held-out term scores the held-out fit plus its own step on the left-out rows
    (a step far off gives a far larger model error than none); with an open length it
    chooses the length that fits the left-out rows and returns the image it judged."""
    from conftest import digit_sinogram

    from ctuq.recon.methods.base import MeanStep
    from ctuq.recon.model_error import make_model_error
    from ctuq.recon.model_error.heldout import heldout_step_length, kept_rows
    from ctuq.recon.problem import ReconstructionProblem

    cfg = ReconstructionConfig(seed=0, device="cpu", threads=1, dip={"iterations": 40},
                               uncertainty={"model_error": "heldout",
                                            "heldout_prior_width": 0})
    problem = ReconstructionProblem.from_sinogram(digit_sinogram(), cfg)
    term = make_model_error("heldout", problem.uncertainty, problem.preset).prepare()
    calls = []

    def far_off(dip, op, y, ray_variance=None):
        calls.append((tuple(y.shape), op.geometry.n_angles))
        return torch.full_like(dip.reconstruction, 0.5)

    fit = term.fit_first(problem)
    var = torch.full(fit.reconstruction.shape, 1e-4, dtype=torch.float64)
    nv = problem.noise.variance
    plain = term.variance(problem, fit, var, nv)
    assert plain.reconstruction is None
    step = torch.full_like(fit.reconstruction, 0.5)
    moved = term.variance(problem, fit, var, nv, mean_step=MeanStep(step, far_off, 1.0))
    n_out = plain.coefficients.info["heldout_angles"]
    n_in = problem.op.geometry.n_angles - n_out
    assert calls == [((n_in, problem.op.range_shape[1]), n_in)]
    assert float(moved.variance.mean()) > 10 * float(plain.variance.mean())
    assert moved.coefficients.info["step_length"] == 1.0
    torch.testing.assert_close(moved.reconstruction, fit.reconstruction + step)

    # open length: a step towards the truth of the left-out rows is taken, one away is not
    from ctuq.recon.model_error.heldout import heldout_split

    mask = heldout_split(problem.op.geometry.n_angles, problem.uncertainty.heldout_every,
                         problem.uncertainty.heldout_min_out)
    x_in = term.shared_fit().reconstruction.detach()
    truth = torch.as_tensor(digit_sinogram().ground_truth, dtype=torch.float32) / problem.scale
    toward = 0.6 * (truth - x_in)
    assert 0.3 < heldout_step_length(problem.op, problem.y, mask, x_in, toward) <= 1.0
    assert heldout_step_length(problem.op, problem.y, mask, x_in, -toward) == 0.0
    chosen = term.variance(problem, fit, var, nv, mean_step=MeanStep(
        toward, lambda dip, *rows: toward, None))
    a = chosen.coefficients.info["step_length"]
    assert 0.3 < a <= 1.0
    torch.testing.assert_close(chosen.reconstruction, fit.reconstruction + a * toward)
    _, y_in, _ = kept_rows(problem.op, problem.y, mask)
    assert y_in.shape[0] == n_in


def test_an_open_step_length_needs_the_heldout_term():
    with pytest.raises(InputError, match="model_error"):
        ReconstructionConfig(uncertainty={"model_error": "calibrated",
                                          "laplace": {"mean": "linear-heldout"}})


def test_an_unknown_mean_is_refused_with_its_field():
    with pytest.raises(InputError, match="mean"):
        ReconstructionConfig(uncertainty={"laplace": {"mean": "posterior"}})
