"""Per-ray noise variances in the Gaussian likelihood: ``η ~ N(0, σ² diag(v))``.

Against the exact dense computation on the 28² toy problem: ``Φ = V^{-1/2} A J``,
the posterior ``(Φ₀ᵀ Σ_y⁻¹ Φ₀ + Σ⁻¹)⁻¹`` with ``Σ_y = σ² V`` (``Φ₀ = A J``), the
samplers' per-pixel variances within Monte-Carlo error, the EM's noise statistic,
and the white-noise path reproduced by a constant ``v``.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import sample_posterior
from ctuq.errors import InputError
from ctuq.posterior import (BlockPrior, ExactPosterior, LinearGaussianLikelihood, dense_matrix,
                            estep_statistics, noise_update)

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")]

D64 = torch.float64


@pytest.fixture(scope="module")
def v(problem):
    # per-ray relative variances spanning 30×, as photon counts through a head do
    gen = torch.Generator().manual_seed(5)
    return torch.exp(torch.rand(problem.op.range_shape, generator=gen) * math.log(30.0))


@pytest.fixture(scope="module")
def wlik(problem, lin, v):
    return LinearGaussianLikelihood(lin, problem.op, problem.y, batch_axis="projection angles",
                                    ray_variance=v)


@pytest.fixture(scope="module")
def prior(lin):
    return BlockPrior(lin)


@pytest.fixture(scope="module")
def dense(problem, lin, v, prior):
    """The dense weighted posterior over θ and its per-pixel image variance."""
    with torch.no_grad():
        return _dense(problem, lin, v, prior)


def _dense(problem, lin, v, prior):
    A = dense_matrix(problem.op, D64)
    J = lin.dense(D64)
    Phi0 = A @ J
    sigma2 = problem.noise_std**2 / 4      # the common factor; Σ_y = σ² V
    Sy_inv = 1.0 / (sigma2 * v.double().reshape(-1))
    Sigma = prior.cov(torch.eye(lin.num_params, dtype=D64))
    H = Phi0.t() @ (Sy_inv[:, None] * Phi0) + torch.linalg.inv(Sigma)
    cov = torch.linalg.inv(0.5 * (H + H.t()))
    var = torch.einsum("ij,jk,ik->i", J, cov, J)
    return {"A": A, "J": J, "Phi0": Phi0, "sigma2": sigma2, "cov": cov, "var": var}


def test_phi_target_and_diag_are_the_whitened_dense_ones(wlik, problem, lin, v, dense):
    gen = torch.Generator().manual_seed(1)
    w = v.double().reshape(-1).rsqrt()
    Phi = w[:, None] * dense["Phi0"]
    x = torch.randn(3, lin.num_params, generator=gen)
    u = torch.randn(3, *problem.op.range_shape, generator=gen)
    assert torch.allclose(wlik.phi(x).double().reshape(3, -1), x.double() @ Phi.t(),
                          rtol=1e-4, atol=1e-5 * float(Phi.abs().max()))
    assert torch.allclose(wlik.phi_t(u).double(), u.double().reshape(3, -1) @ Phi,
                          rtol=1e-4, atol=1e-4 * float(Phi.abs().max()))
    # mini-batches of angles stay adjoint
    idx = torch.tensor([2, 7, 11])
    lhs = (wlik.phi(x, idx) * u[:, idx]).sum((1, 2)).double()
    rhs = (x * wlik.phi_t(u[:, idx], idx)).sum(1).double()
    assert torch.allclose(lhs, rhs, rtol=1e-4)
    yt = w * (problem.y.double().reshape(-1) - dense["A"] @ lin.x_hat.double().reshape(-1)) \
        + Phi @ lin.theta_hat.double()
    assert float((wlik.target.double().reshape(-1) - yt).norm() / yt.norm()) < 1e-5
    assert torch.allclose(wlik.diag_normal(exact=True), Phi.square().sum(0), rtol=1e-6)  # float32 V^{-1/2}
    assert wlik.log_det_variance == pytest.approx(float(v.double().log().sum()))
    assert torch.equal(wlik.y, problem.y.reshape(wlik.obs_shape))   # data kept as given


def test_exact_oracle_equals_the_dense_weighted_posterior(wlik, prior, dense):
    ex = ExactPosterior(wlik, prior, dense["sigma2"])
    with torch.no_grad():
        got = ex.posterior_var_image().reshape(-1)
    ref = dense["var"]
    assert float((got - ref).abs().max() / ref.max()) < 1e-6


@pytest.mark.parametrize("method,k,kw", [("cg", 256, {}), ("sto", 128, {"iterations": 60})])
def test_sampler_variance_matches_dense_within_mc_error(wlik, prior, dense, method, k, kw):
    post = sample_posterior(wlik, prior, dense["sigma2"], k, method=method,
                            generator=torch.Generator().manual_seed(3), **kw)
    ref = dense["var"]
    mask = ref > 1e-10 * ref.max()
    v_hat = (post.z.double() @ dense["J"].t()).square().mean(0)
    med = float((v_hat[mask] / ref[mask] - 1).abs().median())
    assert med <= 1.5 * 0.6745 * math.sqrt(2 / k), med
    # and not the unweighted posterior: the weights matter at this tolerance
    white = ExactPosterior(LinearGaussianLikelihood(wlik.lin, wlik.raw_operator, wlik.y),
                           prior, dense["sigma2"] * float(wlik.ray_variance.mean()))
    with torch.no_grad():
        wv = white.posterior_var_image().reshape(-1)
    assert float((wv[mask] / ref[mask] - 1).abs().median()) > 3 * med


def test_theta_star_and_noise_statistic_are_the_whitened_ones(wlik, prior, dense, lin, v):
    post = sample_posterior(wlik, prior, dense["sigma2"], 2, method="cg",
                            generator=torch.Generator().manual_seed(4))
    w = v.double().reshape(-1).rsqrt()
    Phi = w[:, None] * dense["Phi0"]
    yt = wlik.target.double().reshape(-1)
    # θ* = cov Φᵀ ỹ / σ² (dense), within the solver's tolerance
    ref = dense["cov"] @ (Phi.t() @ yt) / dense["sigma2"]
    assert float((post.theta_star.double() - ref).norm() / ref.norm()) < 1e-2
    stats = estep_statistics(wlik, prior, dense["sigma2"], post.theta_star, post.z, "prior")
    resid = yt - Phi @ post.theta_star.double()
    assert stats.residual_sq == pytest.approx(float(resid.square().sum()), rel=1e-4)
    # the EM learns the common factor σ² of σ² v_i from the whitened residual
    gamma = min(max(stats.gamma_total, 0.0), wlik.d_obs - 1.0)
    assert noise_update(stats, wlik.d_obs, "mackay") == pytest.approx(
        float(resid.square().sum()) / (wlik.d_obs - gamma), rel=1e-4)


def test_constant_variance_reproduces_the_white_noise_path(problem, lin, prior, lik):
    ones = LinearGaussianLikelihood(lin, problem.op, problem.y,
                                    batch_axis="projection angles", ray_variance=1.0)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, lin.num_params, generator=gen)
    assert torch.equal(ones.phi(x), lik.phi(x)) and torch.equal(ones.target, lik.target)
    a = sample_posterior(ones, prior, problem.noise_std**2, 4, method="cg",
                         generator=torch.Generator().manual_seed(0))
    b = sample_posterior(lik, prior, problem.noise_std**2, 4, method="cg",
                         generator=torch.Generator().manual_seed(0))
    assert torch.equal(a.z, b.z) and torch.equal(a.theta_star, b.theta_star)
    # v = c with σ²/c: the same posterior to round-off
    c = 3.0
    scaled = LinearGaussianLikelihood(lin, problem.op, problem.y, ray_variance=c)
    e1 = ExactPosterior(scaled, prior, problem.noise_std**2 / c)
    e2 = ExactPosterior(lik, prior, problem.noise_std**2)
    with torch.no_grad():
        v1, v2 = e1.posterior_var_image(), e2.posterior_var_image()
    assert float((v1 - v2).abs().max() / v2.max()) < 1e-6


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), torch.ones(3, 3)])
def test_bad_ray_variance(problem, lin, bad):
    with pytest.raises(InputError) as err:
        LinearGaussianLikelihood(lin, problem.op, problem.y, ray_variance=bad)
    assert err.value.field == "ray_variance"
