"""The engine's likelihood interface: Φ, Φᵀ, the normal product, mini-batches, both kinds."""

import pytest
import torch

from ctuq.models.classifiers import build_classifier
from ctuq.posterior import (CategoricalLikelihood, ClassifierLinearization, b_mul_jacobian,
                            dense_matrix)

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")]

D64 = torch.float64


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------------------------ Gaussian (CT)


def test_gaussian_phi_and_phi_t_are_adjoint_and_equal_dense_aj(problem, lin, lik):
    gen = torch.Generator().manual_seed(2)
    v = torch.randn(3, lin.num_params, generator=gen)
    u = torch.randn(3, *problem.op.range_shape, generator=gen)
    lhs = (lik.phi(v) * u).sum((1, 2)).double()
    rhs = (v * lik.phi_t(u)).sum(1).double()
    assert torch.allclose(lhs, rhs, rtol=1e-4)
    A = dense_matrix(problem.op)
    J = lin.dense(D64)
    Phi = A @ J
    assert _rel(lik.phi(v).double().reshape(3, -1), v.double() @ Phi.t()) < 1e-5
    # the linear model's target ỹ = y − A f(θ̃) + Φ θ̃, and diag(ΦᵀΦ) exactly
    yt = problem.y.double().reshape(-1) - A @ lin.x_hat.double().reshape(-1) \
        + Phi @ lin.theta_hat.double()
    assert _rel(lik.target.double().reshape(-1), yt) < 1e-5
    assert torch.allclose(lik.diag_normal(exact=True), Phi.square().sum(0), rtol=1e-10)
    assert lik.num_observations == Phi.shape[0] and lik.batch_size_max == 20


def test_gaussian_batches_are_sorted_random_angle_subsets(lik):
    gen = torch.Generator().manual_seed(0)
    it = lik.batches(gen, 5)
    seen = [next(it) for _ in range(4)]
    for idx in seen:
        assert idx.numel() == 5 and torch.equal(idx, idx.sort().values)
        assert idx.unique().numel() == 5 and int(idx.max()) < 20
    assert not all(torch.equal(seen[0], s) for s in seen[1:])   # independent draws


# ------------------------------------------------------------------------------ categorical


@pytest.fixture(scope="module")
def cat():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, 1, 4, 4, generator=g)
    net = build_classifier("mlp", (1, 4, 4), 3, hidden=(5,), seed=0)
    clin = ClassifierLinearization(net, x, data_chunk=7)   # several data chunks
    return x, clin, CategoricalLikelihood(clin, x)


def test_categorical_products_match_the_dense_ggn(cat):
    x, clin, lik = cat
    J = clin.jacobian(x, D64)                                   # [N, C, d]
    p = clin.probs(x).double()
    BJ = b_mul_jacobian(p, J).reshape(-1, clin.num_params)      # Φ = B J, [N·C, d]
    G = BJ.t() @ BJ
    lam = torch.diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1)
    # Λ = BᵀB up to the float32 rounding of Σ_c p_c = 1
    assert _rel(G, torch.einsum("ncd,nce,nef->df", J, lam, J)) < 1e-6
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(2, clin.num_params, generator=gen)
    u = torch.randn(2, 30, 3, generator=gen)
    assert _rel(lik.phi(v).double().reshape(2, -1), v.double() @ BJ.t()) < 1e-5
    assert _rel(lik.phi_t(u).double(), u.double().reshape(2, -1) @ BJ) < 1e-5
    assert _rel(lik.normal(v).double(), v.double() @ G) < 1e-5
    # a mini-batch of data points: the GGN of those points only
    idx = torch.tensor([3, 11, 17, 29])
    BJs = b_mul_jacobian(p[idx], J[idx]).reshape(-1, clin.num_params)
    assert _rel(lik.normal(v, idx).double(), v.double() @ (BJs.t() @ BJs)) < 1e-5
    assert torch.allclose(lik.diag_normal(exact=True), G.diagonal(), rtol=1e-8)
    assert lik.target is None and lik.num_observations == 30
    assert torch.equal(lik.mode, clin.theta_hat)


def test_categorical_batches_are_epochs_of_a_permutation(cat):
    _, _, lik = cat
    it = lik.batches(torch.Generator().manual_seed(0), 7)
    epoch = torch.cat([next(it) for _ in range(4)])              # 28 of 30: one epoch
    assert epoch.unique().numel() == 28
    nxt = next(it)                                               # the remainder is skipped
    assert nxt.numel() == 7
    with torch.no_grad():
        theta = lik.mode + 0.1
    lik2 = CategoricalLikelihood(lik.lin, lik.x)
    lik2.set_mode(theta, torch.full((30, 3), 1 / 3))
    assert torch.equal(lik2.mode, theta) and float(lik2.probs[0, 0]) == pytest.approx(1 / 3)
