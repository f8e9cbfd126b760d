"""The TV term's curvature in the linearised posterior (:mod:`ctuq.recon.tv_curvature`).

Against an explicit dense computation on the 28² toy problem: the finite
differences and their adjoint, the stacked operator's adjointness, the exact
oracle and the CG sampler on the stacked likelihood against
``diag(J (Φ₀ᵀΦ₀/σ² + Σ⁻¹ + Jᵀ Dᵀ diag(c) D J)⁻¹ Jᵀ)`` with ``D`` built from
indices, and :func:`with_tv_curvature` on a fitted posterior.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import sample_posterior
from ctuq.errors import InputError
from ctuq.posterior import (BlockPrior, ExactPosterior, LinearGaussianLikelihood, dense_matrix)
from ctuq.recon.baselines import total_variation
from ctuq.recon.tv_curvature import (TVCurvatureOperator, differences, differences_adjoint,
                                     tv_curvature_weights, with_tv_curvature)

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")]

D64 = torch.float64


def _difference_matrix(h: int, w: int) -> torch.Tensor:
    """``D`` from indices: rows ``x[i+1,j] − x[i,j]`` (C order), then ``x[i,j+1] − x[i,j]``."""
    idx = np.arange(h * w).reshape(h, w)
    pairs = [(idx[1:, :].ravel(), idx[:-1, :].ravel()), (idx[:, 1:].ravel(), idx[:, :-1].ravel())]
    rows = []
    for plus, minus in pairs:
        block = np.zeros((len(plus), h * w))
        block[np.arange(len(plus)), plus] = 1.0
        block[np.arange(len(plus)), minus] = -1.0
        rows.append(block)
    return torch.as_tensor(np.concatenate(rows), dtype=D64)


def test_differences_are_tv_and_their_adjoint_is_exact():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 5, generator=gen, dtype=D64)
    D = _difference_matrix(7, 5)
    assert torch.allclose(differences(x), x.reshape(3, -1) @ D.t())
    assert torch.allclose(differences(x).abs().sum(-1), total_variation(x))
    d = torch.randn(3, D.shape[0], generator=gen, dtype=D64)
    assert torch.allclose(differences_adjoint(d, (7, 5)).reshape(3, -1), d @ D)


def test_stacked_operator_is_adjoint_and_keeps_the_base_rows(problem):
    gen = torch.Generator().manual_seed(1)
    n = problem.op.domain_shape
    k = (n[0] - 1) * n[1] + n[0] * (n[1] - 1)
    w = torch.rand(k, generator=gen) + 0.1
    op = TVCurvatureOperator(problem.op, w)
    x = torch.randn(2, *n, generator=gen)
    s = torch.randn(2, *op.range_shape, generator=gen)
    lhs = (op.A(x) * s).sum((1, 2)).double()
    rhs = (x * op.A_adjoint(s)).sum((1, 2)).double()
    assert torch.allclose(lhs, rhs, rtol=1e-4)
    m = op.base_size
    assert torch.equal(op.A(x)[:, :m, 0], problem.op.A(x).reshape(2, -1))
    assert torch.allclose(op.A(x)[:, m:, 0], differences(x) * w)
    with pytest.raises(InputError, match="weights"):
        TVCurvatureOperator(problem.op, w[:-1])


def test_weights_are_largest_where_the_image_is_flat():
    x = torch.zeros(4, 4, dtype=D64)
    x[:, 2:] = 1.0                                    # one vertical edge
    c = tv_curvature_weights(x, torch.full((24,), 1e-4, dtype=D64), factor=2.0,
                             tv_weight=0.5, noise_std=0.1)
    d = differences(x)
    flat, edge = c[d == 0], c[d != 0]
    # κγ/(2σ²ξ): ξ = 0.01 off the edge, √(1 + 1e-4) across it
    assert torch.allclose(flat, torch.full_like(flat, 2.0 * 0.5 / (2 * 0.01) / 0.01))
    assert torch.allclose(edge, torch.full_like(edge, 2.0 * 0.5 / (2 * 0.01) / math.sqrt(1.0001)))
    # a difference that neither the image nor the posterior separates stays finite
    c0 = tv_curvature_weights(torch.zeros(3, 3, dtype=D64),
                              torch.cat([torch.zeros(1), torch.ones(11)]).double(),
                              factor=1.0, tv_weight=1.0, noise_std=1.0)
    assert bool(torch.isfinite(c0).all()) and float(c0[0]) == float(c0[1:].max())
    with pytest.raises(InputError, match="positive"):
        tv_curvature_weights(x, torch.zeros(24), factor=0.0, tv_weight=1.0, noise_std=1.0)


@pytest.fixture(scope="module")
def prior(lin):
    return BlockPrior(lin)


@pytest.fixture(scope="module")
def curvature(problem, lin):
    """Weights ``c`` (large where the fit is flat) and ``σ²``."""
    x_hat = lin.x_hat.reshape(problem.op.domain_shape).double()
    var_d = torch.full(((x_hat.shape[0] - 1) * x_hat.shape[1] * 2,), 1e-4, dtype=D64)
    c = tv_curvature_weights(x_hat, var_d, factor=1.0, tv_weight=2.0,
                             noise_std=problem.noise_std)
    return c, problem.noise_std**2


@pytest.fixture(scope="module")
def dense(problem, lin, prior, curvature):
    """Per-pixel image variance with and without the curvature, by dense inverses."""
    c, sigma2 = curvature
    with torch.no_grad():
        A = dense_matrix(problem.op, D64)
        J = lin.dense(D64)
        D = _difference_matrix(*problem.op.domain_shape)
        Sigma = prior.cov(torch.eye(lin.num_params, dtype=D64))
        H0 = (A @ J).t() @ (A @ J) / sigma2 + torch.linalg.inv(Sigma)
        H = H0 + (D @ J).t() @ (c[:, None] * (D @ J))
        var = {}
        for name, h in (("tv", H), ("plain", H0)):
            cov = torch.linalg.inv(0.5 * (h + h.t()))
            var[name] = torch.einsum("ij,jk,ik->i", J, cov, J)
    return {"J": J, **var}


def _stacked(problem, lin, curvature):
    c, sigma2 = curvature
    op = TVCurvatureOperator(problem.op, (c * sigma2).sqrt())
    return LinearGaussianLikelihood(lin, op)


def test_exact_oracle_of_the_stacked_likelihood_is_the_dense_posterior(problem, lin, prior,
                                                                        curvature, dense):
    ex = ExactPosterior(_stacked(problem, lin, curvature), prior, curvature[1])
    with torch.no_grad():
        got = ex.posterior_var_image().reshape(-1)
    ref = dense["tv"]
    assert float((got - ref).abs().max() / ref.max()) < 1e-5
    # and the term matters: the flat pixels' variance falls by far more than that
    assert float((dense["plain"] / ref).median()) > 1.5


def test_cg_samples_of_the_stacked_likelihood_match_the_dense_variance(problem, lin, prior,
                                                                      curvature, dense):
    k = 256
    post = sample_posterior(_stacked(problem, lin, curvature), prior, curvature[1], k,
                            method="cg", generator=torch.Generator().manual_seed(3),
                            max_iter=2000)
    assert post.info["converged"]
    ref = dense["tv"]
    mask = ref > 1e-10 * ref.max()
    v_hat = (post.z.double() @ dense["J"].t()).square().mean(0)
    med = float((v_hat[mask] / ref[mask] - 1).abs().median())
    assert med <= 1.5 * 0.6745 * math.sqrt(2 / k), med
    plain = float((v_hat[mask] / dense["plain"][mask] - 1).abs().median())
    assert plain > 3 * med


def test_with_tv_curvature_adds_the_term_to_a_fitted_posterior(problem, lin, monkeypatch):
    from ctuq.posterior import EMOptions
    from ctuq.recon.evidence import fit_posterior

    post = fit_posterior(lin, problem.op, problem.y, problem.noise_std**2, prior="gprior",
                         em=EMOptions(em_steps=1, n_samples=4, seed=0))
    drawn = with_tv_curvature(post, lin, factor=3.0, tv_weight=1.0,
                              noise_std=problem.noise_std)
    # the prior, σ² and θ* are the EM's; the likelihood has the difference rows below
    assert drawn.prior is post.prior and drawn.noise_var == post.noise_var
    assert torch.equal(drawn.theta_star, post.theta_star) and drawn.sample_state is None
    with torch.no_grad():
        var_d = differences(lin.jvp(post.samples).double()).square().mean(0)
        c = tv_curvature_weights(lin.x_hat.reshape(problem.op.domain_shape), var_d,
                                 factor=3.0, tv_weight=1.0, noise_std=problem.noise_std)
        rows = dense_matrix(drawn.likelihood.operator, D64)[drawn.likelihood.operator.base_size:]
        D = _difference_matrix(*problem.op.domain_shape)
        # the engine divides by σ²: the rows are √(c σ²) D
        assert torch.allclose(rows, (c * post.noise_var).sqrt()[:, None] * D, rtol=1e-5,
                              atol=1e-6 * float(rows.abs().max()))
        before = ExactPosterior(post.likelihood, post.prior, post.noise_var).posterior_var_image()
        after = ExactPosterior(drawn.likelihood, drawn.prior,
                               drawn.noise_var).posterior_var_image()
    # more precision can only narrow the posterior, and it does where the fit is flat
    assert bool((after <= before * (1 + 1e-6)).all())
    assert float((after / before).median()) < 0.9
    import ctuq.posterior.sampling_cg as cg

    builds = []
    build = cg._nystrom
    monkeypatch.setattr(cg, "_nystrom", lambda *a, **k: builds.append(1) or build(*a, **k))
    z = drawn.draw(2, generator=torch.Generator().manual_seed(0))
    assert z.shape == (2, lin.num_params) and bool(torch.isfinite(z).all())
    # the first draw builds the preconditioner of the new kernel; later draws reuse it
    assert len(builds) == 1 and drawn.sample_state is not None
    again = drawn.draw(4, generator=torch.Generator().manual_seed(1), batch_size=2)
    assert len(builds) == 1 and again.shape == (4, lin.num_params)
