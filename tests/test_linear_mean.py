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
    from ctuq.recon.evidence import fit_posterior, uncertainty_options
    from ctuq.recon.methods.laplace import LaplaceSettings, linear_mean_shift

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


@pytest.fixture(scope="module")
def runs():
    from conftest import digit_sinogram

    sino = digit_sinogram()
    base = dict(seed=0, device="cpu", threads=1, dip={"iterations": 60})
    unc = {"predictive_samples": 8, "laplace": {"em_steps": 2, "n_samples": 4}}
    dip = ctuq.reconstruct(sino, ReconstructionConfig(**base, uncertainty=unc))
    lin = ctuq.reconstruct(sino, ReconstructionConfig(
        **base, uncertainty={**unc, "laplace": {**unc["laplace"], "mean": "linear"}}))
    return dip, lin


def test_pipeline_shows_the_linear_mean_with_the_same_posterior(runs):
    dip, lin = runs
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


def test_an_unknown_mean_is_refused_with_its_field():
    with pytest.raises(InputError, match="mean"):
        ReconstructionConfig(uncertainty={"laplace": {"mean": "posterior"}})
