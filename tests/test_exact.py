"""The dense float64 oracle against independent parameter-space formulas."""

import math

import pytest
import torch

from ctuq.errors import InputError
from ctuq.posterior import BlockPrior, ExactPosterior

D64 = torch.float64

# torch registers its forward-mode decompositions through torch.jit.script on first use
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")]


@pytest.fixture(scope="module")
def exact(problem, lin, lik):
    nb = len(lin.blocks)
    prior = BlockPrior(lin, variance=[0.3 + 0.2 * i for i in range(nb)], lengthscale=0.8)
    return ExactPosterior(lik, prior, problem.noise_std**2)


@pytest.fixture(scope="module")
def dense(exact):
    """Parameter-space H, H⁻¹ (d_θ = 1,512 here, so this is cheap)."""
    with torch.no_grad():
        H = exact.precision_params()
        return H, torch.linalg.inv(H)


def test_shapes(exact, lin, problem):
    assert exact.J.shape == (784, lin.num_params)
    assert exact.A.shape == (math.prod(problem.op.range_shape), 784)
    assert exact.J.dtype == D64 and exact.Phi.dtype == D64


def test_image_covariance_equals_j_hinv_jt(exact, dense):
    _, Hinv = dense
    with torch.no_grad():
        ref = exact.J @ Hinv @ exact.J.t()
        cov = exact.posterior_cov_image()
        var = exact.posterior_var_image()
    scale = ref.diagonal().max()
    assert (cov - ref).abs().max() < 1e-8 * scale
    assert torch.allclose(var.reshape(-1), ref.diagonal(), atol=1e-8 * scale)
    # the posterior never exceeds the prior, and variances are non-negative
    prior_var = exact.prior_image_cov().diagonal()
    assert torch.all(var.reshape(-1) <= prior_var + 1e-10 * scale)
    assert var.min() >= -1e-10 * scale
    assert torch.allclose(exact.posterior_std_image(), var.clamp_min(0).sqrt())
    # matches the dense parameter-space inverse too
    assert (exact.posterior_cov_params() - Hinv).abs().max() < 1e-8 * Hinv.abs().max()


def test_theta_star_equals_the_parameter_space_solve(exact, dense):
    H, _ = dense
    with torch.no_grad():
        rhs = exact.Phi.t() @ exact.y_tilde / exact._sigma2()
        ref = torch.linalg.solve(H, rhs)
        ts = exact.theta_star()
    assert float((ts - ref).norm() / ref.norm()) < 1e-8


def test_log_evidence_equals_the_parameter_space_formula(exact, dense):
    # log p(y) = −½ (‖ỹ − Φθ*‖²/σ² + θ*ᵀΣ⁻¹θ*) − ½ log|H| − ½ log|Σ| − (d_y/2) log 2πσ²
    H, _ = dense
    with torch.no_grad():
        s2 = exact._sigma2()
        ts = exact.theta_star()
        fit = (exact.y_tilde - exact.Phi @ ts).square().sum() / s2
        reg = exact.prior.quadratic(ts)
        ref = (-0.5 * (fit + reg) - 0.5 * torch.linalg.slogdet(H)[1]
               - 0.5 * exact.prior.logdet() - 0.5 * exact.d_y * torch.log(2 * math.pi * s2))
        val = exact.log_evidence()
    assert val.item() == pytest.approx(ref.item(), rel=1e-9, abs=1e-6)


def test_log_evidence_is_differentiable(problem, lin, lik):
    prior = BlockPrior(lin, variance=0.5, lengthscale=0.5)
    log_noise = torch.tensor(math.log(problem.noise_std**2), dtype=D64, requires_grad=True)
    ex = ExactPosterior(lik, prior, log_noise.exp())
    val = ex.log_evidence(log_noise.exp())
    ga, gl, gn = torch.autograd.grad(val, (prior.log_a, prior.log_l, log_noise))
    h = 1e-5
    with torch.no_grad():
        for i, param, grad in ((0, prior.log_a, ga), (3, prior.log_l, gl)):
            param[i] += h
            up = ex.log_evidence(log_noise.exp()).item()
            param[i] -= 2 * h
            down = ex.log_evidence(log_noise.exp()).item()
            param[i] += h
            assert grad[i].item() == pytest.approx((up - down) / (2 * h), rel=1e-4, abs=1e-4)
        up = ex.log_evidence(math.exp(log_noise.item() + h)).item()
        down = ex.log_evidence(math.exp(log_noise.item() - h)).item()
    assert gn.item() == pytest.approx((up - down) / (2 * h), rel=1e-4, abs=1e-4)


def test_gamma_blocks(exact, dense):
    _, Hinv = dense
    with torch.no_grad():
        gamma = exact.gamma_blocks()
        # γ_b = d_b − Tr(Σ_b⁻¹ H⁻¹_bb)
        ref = []
        for b, sl in exact.prior.block_slices.items():
            H_bb = Hinv[sl, sl]
            full = torch.zeros(H_bb.shape[0], exact.d_theta, dtype=D64)
            full[:, sl] = H_bb
            ref.append((sl.stop - sl.start) - torch.trace(exact.prior.precision(full)[:, sl]))
        ref = torch.stack(ref)
        total = torch.trace(Hinv @ exact.Phi.t() @ exact.Phi) / exact._sigma2()
    assert torch.allclose(gamma, ref, rtol=1e-6, atol=1e-6)
    assert gamma.sum().item() == pytest.approx(total.item(), rel=1e-8)
    assert torch.all(gamma >= -1e-9) and torch.all(gamma <= exact.prior.block_dims + 1e-9)
    eq = exact.expected_block_quadratics()
    assert torch.allclose(eq, exact.prior.variances.detach() * (exact.prior.block_dims - gamma))


def test_exact_samples_have_covariance_hinv(exact, dense):
    # per-pixel variance of J z from n exact draws: relative error ~ sqrt(2/n) per pixel;
    # the median over pixels of |v̂/v − 1| is ≈ 0.6745 sqrt(2/n) (allow ×1.5)
    n = 2000
    z = exact.sample(n, torch.Generator().manual_seed(0))
    v_hat = (z @ exact.J.t()).square().mean(0)
    v = exact.posterior_var_image().reshape(-1)
    mask = v > 1e-10 * v.max()
    med = (v_hat[mask] / v[mask] - 1).abs().median().item()
    assert med < 1.5 * 0.6745 * math.sqrt(2 / n)


def test_needs_a_sinogram_for_the_mean(problem, lin):
    from ctuq.recon.evidence import ct_likelihood

    ex = ExactPosterior(ct_likelihood(lin, problem.op, None), BlockPrior(lin), 1.0)
    with pytest.raises(InputError):
        ex.theta_star()
