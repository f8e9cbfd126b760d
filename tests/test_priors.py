"""Block priors: Σ, Σ^½, Σ⁻¹, log-determinants, draws and gradients in the hyperparameters."""

import math

import pytest
import torch

from ctuq.errors import InputError
from ctuq.posterior import (BlockPrior, GPrior, build_prior, dense_matrix, kernel_positions,
                            matern_half_kernel)

from conftest import requires_cuda

# torch registers its forward-mode decompositions through torch.jit.script on first use
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")]

D64 = torch.float64


def _eye(n):
    return torch.eye(n, dtype=D64)


def _prior(lin, **kw):
    # distinct a_b and a long length-scale so that the Matérn structure matters
    nb = len(lin.blocks)
    kw.setdefault("variance", [0.5 + 0.25 * i for i in range(nb)])
    kw.setdefault("lengthscale", [0.7 + 0.1 * i for i in range(nb)])
    return BlockPrior(lin, **kw)


def test_matern_kernel_entries():
    pos = kernel_positions(3, 3)
    assert pos.shape == (9, 2) and pos[4].tolist() == [1.0, 1.0]
    M = matern_half_kernel(torch.tensor(2.0, dtype=D64), jitter=0.0)
    # taps 0 = (0,0) and 8 = (2,2) are 2√2 apart, 0 and 1 one apart
    assert M[0, 8].item() == pytest.approx(math.exp(-2 * math.sqrt(2) / 2.0))
    assert M[0, 1].item() == pytest.approx(math.exp(-0.5))
    assert torch.allclose(M.diagonal(), torch.ones(9, dtype=D64))
    # the reference ℓ = 0.1 is nearly diagonal
    M01 = matern_half_kernel(torch.tensor(0.1, dtype=D64))
    assert (M01 - torch.diag(M01.diagonal())).abs().max() < 5e-5


@pytest.mark.parametrize("kind", ["matern", "iso"])
def test_dense_operators_are_consistent(lin, kind):
    prior = _prior(lin, kind=kind)
    d = lin.num_params
    S = prior.to_dense()
    assert torch.allclose(S, S.t())
    assert torch.linalg.eigvalsh(S).min() > 0
    L = prior.cov_sqrt(_eye(d)).t()  # columns L e_i
    Lt = prior.cov_sqrt(_eye(d), transpose=True).t()
    assert torch.allclose(L @ L.t(), S, atol=1e-12)
    assert torch.allclose(Lt, L.t(), atol=1e-14)
    assert torch.allclose(prior.precision(S), _eye(d), atol=1e-8)
    assert prior.logdet().item() == pytest.approx(torch.linalg.slogdet(S)[1].item(), rel=1e-10)
    v = torch.randn(3, d, dtype=D64, generator=torch.Generator().manual_seed(0))
    q = torch.einsum("kd,de,ke->k", v, torch.linalg.inv(S), v)
    assert torch.allclose(prior.quadratic(v), q, rtol=1e-8)
    # ‖v_b‖²_{C_b⁻¹} = a_b ‖v_b‖²_{Σ_b⁻¹}; their a-weighted sum is the full quadratic
    bq = prior.block_quadratics(v)
    assert torch.allclose((bq / prior.variances).sum(-1), q, rtol=1e-8)
    assert torch.allclose(prior.block_quadratic(v, "out"), bq[:, -1])
    # the blocks are independent: Σ is block-diagonal
    for b, sl in prior.block_slices.items():
        mask = torch.zeros(d, dtype=torch.bool)
        mask[sl] = True
        assert S[mask][:, ~mask].abs().max() == 0


def test_matern_structure_is_per_filter(lin):
    prior = _prior(lin)
    S = prior.to_dense()
    sl = lin.block_slices["down_0"]  # 3×3 kernels
    a = prior.variances[1].item()
    M = matern_half_kernel(prior.lengthscales[1].detach())
    assert torch.allclose(S[sl.start:sl.start + 9, sl.start:sl.start + 9], a * M)
    assert S[sl.start, sl.start + 9].item() == 0  # different filters are independent
    out = lin.block_slices["out"]  # 1×1 conv: identity
    a_out = prior.variances[-1].item()
    assert torch.allclose(S[out, out], a_out * _eye(out.stop - out.start))
    assert prior.matern_blocks == [blk.kernel_size != (1, 1) for blk in lin.blocks.values()]


def test_draws_have_the_prior_covariance(lin):
    # E‖θ_b‖²_{C_b⁻¹} = a_b d_b; the mean over k draws of a_b χ²_{d_b} has relative std
    # sqrt(2 / (k d_b)); allow 4 of them
    prior = _prior(lin)
    k = 200
    theta = prior.sample(k, torch.Generator().manual_seed(0))
    assert theta.shape == (k, lin.num_params) and theta.dtype == torch.float32
    mean_q = prior.block_quadratics(theta.double()).mean(0)
    expected = prior.variances.detach() * prior.block_dims
    tol = 4 * torch.sqrt(2 / (k * prior.block_dims))
    assert torch.all(((mean_q / expected) - 1).abs() < tol)
    # seeded: the same generator seed gives the same draws
    assert torch.equal(theta, prior.sample(k, torch.Generator().manual_seed(0)))


def test_gradients_in_the_hyperparameters(lin):
    prior = _prior(lin)
    # ∂ log|Σ| / ∂ log a_b = d_b
    (g_a,) = torch.autograd.grad(prior.logdet(), prior.log_a)
    assert torch.allclose(g_a, prior.block_dims)
    # the quadratic form against finite differences in log ℓ and log a

    def quad(log_a, log_l):
        p = BlockPrior(lin, variance=log_a.exp(), lengthscale=log_l.exp())
        v = torch.ones(1, lin.num_params, dtype=D64)
        return p.quadratic(v).sum() + p.logdet()

    la = prior.log_a.detach().clone().requires_grad_(True)
    ll = prior.log_l.detach().clone().requires_grad_(True)
    out = BlockPrior(lin)
    out.log_a, out.log_l = torch.nn.Parameter(la), torch.nn.Parameter(ll)
    v = torch.ones(1, lin.num_params, dtype=D64)
    val = out.quadratic(v).sum() + out.logdet()
    ga, gl = torch.autograd.grad(val, (out.log_a, out.log_l))
    h = 1e-6
    for i in (0, 2, 5):
        e = torch.zeros_like(la)
        e[i] = h
        fd_l = (quad(la.detach(), ll.detach() + e) - quad(la.detach(), ll.detach() - e)) / (2 * h)
        fd_a = (quad(la.detach() + e, ll.detach()) - quad(la.detach() - e, ll.detach())) / (2 * h)
        assert gl[i].item() == pytest.approx(fd_l.item(), rel=1e-5, abs=1e-6)
        assert ga[i].item() == pytest.approx(fd_a.item(), rel=1e-5, abs=1e-6)


def test_cache_follows_hyperparameter_updates(lin):
    prior = _prior(lin)
    v = torch.randn(2, lin.num_params)
    with torch.no_grad():
        before = prior.cov(v)
        prior.set_hyperparameters(variances={"inc": 3.0})
        after = prior.cov(v)
    sl = lin.block_slices["inc"]
    # float32: near-zero entries need an absolute tolerance at the data's scale
    assert torch.allclose(after[:, sl], before[:, sl] * 3.0 / 0.5, rtol=1e-5,
                          atol=1e-5 * float(after[:, sl].abs().max()))
    assert torch.equal(after[:, lin.block_slices["out"]], before[:, lin.block_slices["out"]])
    opt = torch.optim.SGD(prior.parameters(), lr=0.1)
    prior.logdet().backward()
    opt.step()
    with torch.no_grad():
        moved = prior.cov(v)
    assert not torch.allclose(moved, after)


def test_defaults_and_bad_input(lin):
    prior = BlockPrior(lin)
    assert torch.allclose(prior.variances, torch.ones(len(lin.blocks), dtype=D64))
    assert torch.allclose(prior.lengthscales, torch.full((len(lin.blocks),), 0.1, dtype=D64))
    with pytest.raises(InputError):
        BlockPrior(lin, variance=-1.0)
    with pytest.raises(InputError):
        BlockPrior(lin, variance=[1.0, 2.0])
    with pytest.raises(InputError):
        BlockPrior(lin, kind="laplace")
    with pytest.raises(InputError):
        prior.cov(torch.zeros(2, 5))


def test_gprior_scale_exact_and_by_probes(problem, lin, lik):
    exact = GPrior.from_likelihood(lik, exact=True)
    A = dense_matrix(problem.op)
    Phi = A @ lin.dense(D64)
    d_y = Phi.shape[0]
    s = (Phi.square().mean(0)).rsqrt()
    assert torch.allclose(exact.scale, s, rtol=1e-10)
    # columns of Φ diag(s) have mean square 1
    assert torch.allclose((Phi * exact.scale).square().mean(0), torch.ones(lin.num_params,
                                                                          dtype=D64))
    # Rademacher probes: Var[(Φᵀε)_i²] = 2 (Σ_r Φ_ri²)² − 2 Σ_r Φ_ri⁴ ≤ 2 diag², so the
    # probe mean of n has relative std ≤ sqrt(2/n) per entry; s = diag^{-1/2} halves it
    n = 256
    probed = GPrior.from_likelihood(lik, n_probes=n, generator=torch.Generator().manual_seed(0))
    rel = (probed.scale / exact.scale - 1).abs()
    assert rel.median() < 0.6745 * 0.5 * math.sqrt(2 / n) * 1.5
    assert rel.max() < 5 * 0.5 * math.sqrt(2 / n)
    # the interface: one block, Σ = g diag(s)²
    g = GPrior(exact.scale, g=0.3)
    v = torch.randn(2, lin.num_params, dtype=D64)
    assert torch.allclose(g.cov(v), 0.3 * exact.scale**2 * v)
    assert torch.allclose(g.precision(g.cov(v)), v)
    assert torch.allclose(g.cov_sqrt(g.cov_sqrt(v, transpose=True)), g.cov(v))
    assert g.logdet().item() == pytest.approx(
        (lin.num_params * math.log(0.3) + 2 * exact.scale.log().sum()).item())
    assert torch.allclose(g.block_quadratic(v, "all"), (v / exact.scale).square().sum(1))
    g.set_hyperparameters(variances=2.0)
    assert g.variances.item() == pytest.approx(2.0)
    assert d_y == math.prod(problem.op.range_shape)


def test_build_prior_kinds(lik):
    matern = build_prior(lik, "matern")
    assert matern.name == "matern" and matern.kind == "matern"
    ard = build_prior(lik, "ard", variance=0.5, lengthscale=0.3)
    assert ard.name == "ard" and ard.kind == "iso"
    assert torch.allclose(ard.variances, torch.full((ard.num_blocks,), 0.5, dtype=D64))
    g = build_prior(lik, "gprior", variance=0.2, exact=True)
    assert g.name == "gprior" and float(g.variances) == pytest.approx(0.2)
    assert torch.allclose(g.scale, GPrior.from_likelihood(lik, exact=True).scale)
    with pytest.raises(InputError):
        build_prior(lik, "laplace")


@pytest.mark.gpu
@requires_cuda
def test_prior_on_cuda(lin, strict_fp32):
    prior = _prior(lin).cuda()
    v = torch.randn(2, lin.num_params)
    assert torch.allclose(prior.cov(v.cuda()).cpu(), _prior(lin).cov(v), rtol=1e-4, atol=1e-6)
    assert prior.sample(3, torch.Generator().manual_seed(0)).device.type == "cuda"


def test_prior_kinds_say_what_their_priors_have(lik):
    # the registry's properties are what the EM, PredCP and the clients read instead of
    # comparing names: a built prior must agree with its kind
    from ctuq.posterior.prior_kinds import PRIORS, prior_kind

    for name, kind in PRIORS.items():
        prior = kind.build(lik, 0.5, 0.2, exact=True) if kind.uses_likelihood else \
            kind.build(lik, 0.5, 0.2)
        assert prior.learns_lengthscale == kind.has_lengthscale, name
        assert len(prior.lengthscale_blocks) == prior.num_blocks, name
        assert getattr(prior, "name", name) == name
    assert PRIORS["matern"].has_lengthscale and not PRIORS["ard"].has_lengthscale
    with pytest.raises(InputError, match="must be one of matern, ard, gprior"):
        prior_kind("laplace")
