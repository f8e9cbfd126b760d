"""IVON core (ctuq.models.ivon): the learned posterior against exact Bayesian linear regression."""

import math

import pytest
import torch

from ctuq.errors import InputError
from ctuq.models.ivon import (
    DiagonalGaussian,
    IVONSettings,
    evaluate_under_samples,
    make_ivon,
    posterior_of,
    train_ivon,
    weights_set_to,
)

pytestmark = pytest.mark.usefixtures("one_thread")

N, D, SIGMA, ALPHA = 256, 4, 1.0, 1.0
W_TRUE = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)


def regression(correlated: bool):
    """Design with per-example curvature 0.5…4, exact posterior precision Λ and mean."""
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(N, D, generator=g, dtype=torch.float64))
    x = q * (N * torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64)).sqrt()
    if correlated:  # features with pairwise correlation 0.5: a non-diagonal posterior
        mix = torch.linalg.cholesky(0.5 * torch.eye(D, dtype=torch.float64)
                                    + 0.5 * torch.ones(D, D, dtype=torch.float64)).T
        x = x @ mix
    y = x @ W_TRUE + SIGMA * torch.randn(N, generator=g, dtype=torch.float64)
    lam = x.T @ x / SIGMA**2 + ALPHA * torch.eye(D, dtype=torch.float64)
    mean = torch.linalg.solve(lam, x.T @ y / SIGMA**2)
    return x, y, lam, mean


def fit_regression(x, y, steps=3000, temperature=1.0):
    net = torch.nn.Linear(D, 1, bias=False).double()
    with torch.no_grad():
        net.weight.zero_()
    # ℓ̄ = mean NLL per example; ess = N/T and weight_decay = αT/N give p(w | D) (T = 1)
    s = IVONSettings.for_posterior(N, ALPHA, temperature, lr=0.1, mc_samples=4,
                                   beta2=0.998)  # h settles in 3000 steps (<= 5 % off, 6 seeds)
    assert math.isclose(s.ess, N / temperature) and math.isclose(s.prior_precision, ALPHA)
    fit = train_ivon(net, lambda i: (net(x)[:, 0] - y).square().sum() / (2 * SIGMA**2) / N,
                     s, steps, seed=0)
    return net, fit


def test_linear_regression_matches_exact_posterior():
    # orthogonal features: the exact posterior is diagonal, so mean field is exact
    x, y, lam, mean = regression(correlated=False)
    var = torch.diagonal(torch.linalg.inv(lam))
    net, fit = fit_regression(x, y)
    q = fit.posterior
    assert torch.allclose(q.mean, mean, rtol=0.10, atol=0)
    assert torch.allclose(q.variance, var, rtol=0.10, atol=0)
    # the mean is also within 5 % of a posterior std, and the model holds it
    assert ((q.mean - mean).abs() / var.sqrt()).max() < 0.05
    assert torch.equal(net.weight.detach().reshape(-1), q.mean)


def test_correlated_regression_mean_exact_variance_mean_field():
    # correlated features: the mean-field optimum has the exact mean and the variance
    # 1/Λ_ii, which is *below* the exact marginal (Λ⁻¹)_ii (the known mean-field gap)
    x, y, lam, mean = regression(correlated=True)
    var_mf = 1.0 / torch.diagonal(lam)
    var_exact = torch.diagonal(torch.linalg.inv(lam))
    assert (var_mf < 0.9 * var_exact).all()  # the gap is real in this design
    _, fit = fit_regression(x, y)
    q = fit.posterior
    assert torch.allclose(q.mean, mean, rtol=0.10, atol=0)
    assert torch.allclose(q.variance, var_mf, rtol=0.10, atol=0)
    assert (q.variance < var_exact).all()


def test_tempered_likelihood_scales_variance():
    # ess = N/T: the data precision drops by T, the prior precision stays α
    x, y, lam, _ = regression(correlated=False)
    t = 4.0
    lam_t = (lam - ALPHA * torch.eye(D, dtype=torch.float64)) / t \
        + ALPHA * torch.eye(D, dtype=torch.float64)
    _, fit = fit_regression(x, y, temperature=t)
    assert torch.allclose(fit.posterior.variance, 1 / torch.diagonal(lam_t), rtol=0.10)


def test_posterior_readout_matches_the_library_sampler():
    # the variance formula 1/(ess (hess + δ)) against ivon-opt's own sampled_params()
    net = torch.nn.Linear(3, 2).double()
    s = IVONSettings(ess=50.0, hess_init=0.7, weight_decay=0.02)
    opt = make_ivon(net.parameters(), s)
    with torch.no_grad():  # a non-uniform Hessian buffer
        opt.param_groups[0]["hess"].copy_(torch.linspace(0.1, 3.0, 8, dtype=torch.float64))
    q = posterior_of(opt)
    assert torch.allclose(q.variance, 1 / (50.0 * (torch.linspace(0.1, 3.0, 8,
                                                                   dtype=torch.float64) + 0.02)))
    torch.manual_seed(1)
    draws = []
    for _ in range(4000):
        with opt.sampled_params():
            draws.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
    draws = torch.stack(draws)
    assert torch.allclose(draws.mean(0), q.mean, atol=4 * q.std.max() / math.sqrt(4000))
    assert torch.allclose(draws.std(0), q.std, rtol=0.06)
    # the mean is back in the model after sampling
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in net.parameters()]), q.mean)


def test_initial_variance_is_hess_init():
    net = torch.nn.Linear(2, 1)
    opt = make_ivon(net.parameters(), IVONSettings(ess=10.0, hess_init=0.5, weight_decay=0.1))
    assert torch.allclose(posterior_of(opt).variance, torch.full((3,), 1 / (10 * 0.6)))


def test_evaluate_under_samples_moments_and_restore():
    net = torch.nn.Linear(3, 1, bias=False).double()
    q = DiagonalGaussian(torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64),
                         torch.tensor([0.04, 0.01, 0.09], dtype=torch.float64))
    x = torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64)
    before = net.weight.detach().clone()
    out = evaluate_under_samples(net, q, lambda m: m(x)[0, 0], 4000, seed=3)
    assert out.shape == (4000,)
    exact_mean, exact_var = float(x[0] @ q.mean), float(x[0].square() @ q.variance)
    assert abs(float(out.mean()) - exact_mean) < 4 * math.sqrt(exact_var / 4000)
    assert abs(float(out.var()) / exact_var - 1) < 0.08
    assert torch.equal(net.weight, before)
    again = evaluate_under_samples(net, q, lambda m: m(x)[0, 0], 4000, seed=3)
    assert torch.equal(out, again)  # seeded


def test_weights_set_to_restores_on_error_and_checks_length():
    net = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(RuntimeError):
        with weights_set_to(list(net.parameters()), torch.zeros(3)):
            assert float(net.weight.detach().abs().sum()) == 0
            raise RuntimeError("boom")
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
    with pytest.raises(InputError):
        with weights_set_to(list(net.parameters()), torch.zeros(5)):
            pass


@pytest.mark.parametrize("field, value", [("ess", 0.0), ("hess_init", -1.0), ("lr", 0.0),
                                          ("beta2", 1.0), ("mc_samples", 0),
                                          ("hess_approx", "exact")])
def test_settings_refuse_bad_values(field, value):
    with pytest.raises(InputError) as err:
        IVONSettings(**{"ess": 1.0, field: value})
    assert err.value.field == field


def test_training_is_seeded():
    x, y, _, _ = regression(correlated=False)
    _, a = fit_regression(x, y, steps=50)
    _, b = fit_regression(x, y, steps=50)
    assert torch.equal(a.posterior.mean, b.posterior.mean)
    assert torch.equal(a.posterior.variance, b.posterior.variance)
