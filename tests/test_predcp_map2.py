"""TV-PredCP as a true MAP-II: the sample-based EM lands on the exact optimum of
evidence + log hyperprior, computed independently on the dense oracle."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from ctuq.posterior import EMOptions
from ctuq.posterior.evidence_oracle import EvidenceOracle
from ctuq.recon.evidence import ct_likelihood, fit_posterior, initial_prior
from ctuq.recon.predcp import PredCPOptions, TVPredCP, predcp_weight

pytestmark = pytest.mark.usefixtures("one_thread")

TV_WEIGHT = 0.5      # the toy fit's γ
N_PREDCP = 32
SEED = 0


@pytest.fixture(scope="module")
def setup(problem, lin):
    lik = ct_likelihood(lin, problem.op, problem.y)
    prior = initial_prior(lik, "gprior", generator=torch.Generator().manual_seed(SEED))
    return lik, prior, EvidenceOracle(lik, prior)


def _hyperprior(lin, prior, scale):
    # the same draws as fit_posterior's (seed + 3): common random numbers
    return TVPredCP(lin, prior, predcp_weight(scale, TV_WEIGHT), N_PREDCP,
                    torch.Generator().manual_seed(SEED + 3))


def _map2_objective(lin, prior, oracle, s2, scale):
    """F(log g) = exact log evidence + log p_PredCP(g), its κ by plain Monte Carlo."""
    work = prior.__class__(prior.scale, g=1.0)
    hp = _hyperprior(lin, work, scale)

    def F(log_g):
        work.set_hyperparameters(variances=[math.exp(log_g)])
        work.clear_cache()
        ev = float(oracle.log_evidence(torch.tensor([math.exp(log_g)], dtype=torch.float64), s2))
        return ev + (hp.log_density(hp.prepare()) if scale > 0 else 0.0)
    return F


def _exact_map2(F, center):
    grid = np.linspace(center - 2.5, center + 1.5, 17)
    vals = [F(v) for v in grid]
    i = int(np.argmax(vals))
    assert 0 < i < len(grid) - 1, "optimum on the grid's edge"
    res = minimize_scalar(lambda v: -F(v), bracket=(grid[i - 1], grid[i], grid[i + 1]),
                          options={"xtol": 1e-4})
    return float(res.x), -float(res.fun)


def _sampled_g(problem, lin, prior, s2, scale):
    em = EMOptions(n_samples=32, em_steps=25, em_tol=0.005, learn_noise=False, seed=SEED)
    post = fit_posterior(lin, problem.op, problem.y, s2, prior="gprior", em=em,
                         predcp=PredCPOptions(scale=scale, samples=N_PREDCP) if scale else None,
                         tv_weight=TV_WEIGHT)
    assert post.info["converged"]
    return float(post.prior.variances.detach()[0])


@pytest.fixture(scope="module")
def no_predcp_optimum(problem, setup):
    _, prior, oracle = setup
    return oracle.optimize(problem.noise_std**2, learn_noise=False)["a_b"][0]


def test_sampled_map2_matches_the_exact_map2(problem, lin, setup, no_predcp_optimum):
    _, prior, oracle = setup
    s2 = problem.noise_std**2
    F = _map2_objective(lin, prior, oracle, s2, 1.0)
    log_g_exact, F_exact = _exact_map2(F, math.log(no_predcp_optimum))
    g = _sampled_g(problem, lin, prior, s2, 1.0)
    assert g == pytest.approx(math.exp(log_g_exact), rel=0.10)
    assert F(math.log(g)) > F_exact - 0.5
    # and the hyperprior really moved g away from the evidence optimum
    assert abs(math.log(g / no_predcp_optimum)) > 0.2


def test_vanishing_scale_recovers_the_evidence_optimum(problem, lin, setup, no_predcp_optimum):
    _, prior, _ = setup
    g = _sampled_g(problem, lin, prior, problem.noise_std**2, 1e-6)
    assert g == pytest.approx(no_predcp_optimum, rel=0.10)


def test_larger_scale_moves_g_monotonically(problem, lin, setup, no_predcp_optimum):
    _, prior, _ = setup
    gs = [_sampled_g(problem, lin, prior, problem.noise_std**2, s) for s in (0.25, 1.0, 4.0)]
    assert no_predcp_optimum > gs[0] > gs[1] > gs[2]
