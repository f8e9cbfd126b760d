"""TV-PredCP: the reparameterised estimator of κ_b and its derivatives (docs/method.md §7)."""

import math

import pytest
import torch

from ctuq.models.unet import build_unet
from ctuq.posterior import BlockPrior, GPrior, Linearization
from ctuq.recon.dip import total_variation
from ctuq.recon.predcp import TVPredCP, hyperparameter_tensors, predcp_weight, tv_gradient

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lin():
    torch.manual_seed(0)
    net = build_unet("reference-28", channels=(4, 4, 4), seed=3)
    inp = torch.rand(1, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    return Linearization(net, inp)


def _prior(lin):
    # a_b small enough that the draws perturb x̂ (kinks of TV are crossed), ℓ_b = 0.7
    return BlockPrior(lin, "matern", variance=0.05, lengthscale=0.7)


def test_tv_gradient_is_the_subgradient_of_total_variation():
    x = torch.randn(3, 9, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    g = tv_gradient(x)
    # TV is positively 1-homogeneous: <x, ∇TV(x)> = TV(x) (Euler), per image
    assert torch.allclose((x * g).sum((-2, -1)), total_variation(x), rtol=1e-12)
    # and a finite difference along a random direction matches (no ties in x)
    v = torch.randn_like(x)
    h = 1e-7
    fd = (total_variation(x + h * v) - total_variation(x - h * v)) / (2 * h)
    assert torch.allclose(fd, (g * v).sum((-2, -1)), rtol=1e-5, atol=1e-6)


def test_predcp_weight_is_scale_times_sum_convention_gamma():
    # reference: scale · d_y · γ_ref with γ_ref = γ / d_y
    d_y, gamma = 800, 0.45
    assert predcp_weight(2.0, gamma) == pytest.approx(2.0 * d_y * (gamma / d_y))


def test_hyperparameters_of_psi(lin):
    names = [n for n, _, _ in hyperparameter_tensors(_prior(lin))]
    assert names == ["log_a", "log_l"]
    assert [n for n, _, _ in hyperparameter_tensors(BlockPrior(lin, "iso"))] == ["log_a"]
    g = GPrior(torch.ones(lin.num_params))
    assert [n for n, _, _ in hyperparameter_tensors(g)] == ["log_g"]


def test_dkappa_dlog_a_is_half_kappa_tilde(lin):
    # L_b ∝ √a_b, so ∂κ̃_b/∂log a_b = κ̃_b / 2 exactly
    prior = _prior(lin)
    pc = TVPredCP(lin, prior, 1.0, 8, torch.Generator().manual_seed(0))
    state = pc.prepare()
    terms = pc.terms(state)
    kt = pc.kappa_tilde(state).detach().cpu()
    assert torch.allclose(terms.dkappa["log_a"], kt / 2, rtol=1e-10)
    # and κ̃_b ≤ κ_b − TV(x̂) ... in expectation; here: ⟨J_b w, g⟩ = TV(x) − ⟨x̂, g⟩ exactly
    assert torch.isfinite(terms.log_prior)


def test_kappa_gradient_agrees_with_finite_difference_of_large_sample_kappa(lin):
    """The reparameterised ∂κ_b/∂ψ (64 draws) vs a central difference of κ with 512 draws.

    Tolerance: 4 standard errors of the estimator (from its per-draw values)
    combined with 4 of the finite difference (per-draw differences with
    common random numbers).
    """
    prior = _prior(lin)
    pc = TVPredCP(lin, prior, 1.0, 64, torch.Generator().manual_seed(11))
    state = pc.prepare()
    per = pc.dkappa_samples(state)  # name -> [N, B]
    big = TVPredCP(lin, prior, 1.0, 512, torch.Generator().manual_seed(12))
    h = 0.05
    checked = 0
    for name, param in (("log_a", prior.log_a), ("log_l", prior.log_l)):
        for b in (0, 1, 4):  # inc, down_0, up_0: 3×3 blocks
            with torch.no_grad():
                param[b] += h
            prior.clear_cache()
            kp = big.kappa_samples(blocks=[b])[b]
            with torch.no_grad():
                param[b] -= 2 * h
            prior.clear_cache()
            km = big.kappa_samples(blocks=[b])[b]
            with torch.no_grad():
                param[b] += h
            prior.clear_cache()
            fd_each = (kp - km) / (2 * h)
            fd, fd_se = float(fd_each.mean()), float(fd_each.std() / math.sqrt(fd_each.numel()))
            est = float(per[name][:, b].mean())
            est_se = float(per[name][:, b].std() / math.sqrt(per[name].shape[0]))
            tol = 4 * math.hypot(est_se, fd_se) + 1e-3 * abs(fd)
            assert abs(est - fd) <= tol, (name, b, est, fd, tol)
            assert abs(fd) > 4 * fd_se  # the check is not vacuous
            checked += 1
    assert checked == 6


def test_log_jacobian_gradient_by_double_backprop_matches_finite_difference(lin):
    # with the network part (∇TV at the draws) fixed, log|∂κ̃/∂ψ| is a smooth
    # function of ψ: its autograd gradient must match central differences
    prior = _prior(lin)
    pc = TVPredCP(lin, prior, 1.0, 16, torch.Generator().manual_seed(5))
    state = pc.prepare()
    for p in prior.parameters():
        p.grad = None
    lp = pc.terms(state).log_prior
    lp.backward()
    g_auto = prior.log_l.grad.clone()
    h = 1e-5
    for b in (0, 4):
        vals = []
        for sgn in (1, -1):
            with torch.no_grad():
                prior.log_l[b] += sgn * h
            prior.clear_cache()
            vals.append(float(pc.terms(state).log_prior.detach()))
            with torch.no_grad():
                prior.log_l[b] -= sgn * h
            prior.clear_cache()
        fd = (vals[0] - vals[1]) / (2 * h)
        assert fd == pytest.approx(float(g_auto[b]), rel=1e-4, abs=1e-6)


def test_only_selected_blocks_and_lengthscales(lin):
    prior = _prior(lin)
    pc = TVPredCP(lin, prior, 1.0, 4, torch.Generator().manual_seed(0), blocks=["inc"],
                  lengthscales=False)
    terms = pc.evaluate()
    assert set(terms.dkappa) == {"log_a"}
    assert torch.isfinite(terms.kappa[0]) and torch.isnan(terms.kappa[1:]).all()
    lp = terms.log_prior
    lp.backward()
    assert prior.log_a.grad[1:].abs().max() == 0 and prior.log_a.grad[0] != 0


def test_rejects_zero_samples(lin):
    from ctuq.errors import InputError

    with pytest.raises(InputError):
        TVPredCP(lin, _prior(lin), 1.0, 0)


def test_the_engine_hyperprior_interface_log_prob_and_per_block_gradient(lin):
    """What the M-step may ask (issue 21's MAP-II): log p(ψ) and ∂ log p/∂ψ_b per block."""
    from ctuq.posterior import Hyperprior

    prior = _prior(lin)
    pc = TVPredCP(lin, prior, 2.0, 8, torch.Generator().manual_seed(0))
    assert isinstance(pc, Hyperprior)
    assert [n for n, _ in pc.named_parameters()] == ["log_a", "log_l"]
    state = pc.prepare()
    grad = pc.gradient(state)
    assert set(grad) == {"log_a", "log_l"} and grad["log_a"].shape == (prior.num_blocks,)
    # central differences of log_prob (network products held at `state`) per block
    h = 1e-5
    for name, param in pc.named_parameters():
        for b in range(prior.num_blocks):
            if name == "log_l" and not prior.matern_blocks[b]:
                assert grad[name][b] == 0.0     # a 1×1 block does not depend on ℓ_b
                continue
            vals = []
            for sign in (1, -1):
                with torch.no_grad():
                    param[b] += sign * h
                prior.clear_cache()
                vals.append(float(pc.log_prob(state).detach()))
                with torch.no_grad():
                    param[b] -= sign * h
                prior.clear_cache()
            fd = (vals[0] - vals[1]) / (2 * h)
            assert fd == pytest.approx(float(grad[name][b]), rel=1e-4, abs=1e-6), (name, b)
    rep = pc.report(state)
    assert len(rep["kappa"]) == prior.num_blocks and all(k > 0 for k in rep["kappa"])
