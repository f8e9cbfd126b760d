"""The gradient-based evidence fit: a matrix-free cross-check of the EM (docs/method.md §6.4).

Adam on ``−log p(ỹ)`` with the gradient of ``log|K|`` from Hutchinson probes
and CG solves (the first reference code's path). Slower and noisier than the
sample-based EM of :mod:`ctuq.posterior.em`; kept to check it.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import torch

from ctuq.errors import InputError
from ctuq.posterior.em import prior_lists
from ctuq.posterior.preconditioner import NystromPreconditioner, hyper_vector
from ctuq.posterior.priors import BlockPrior, GaussianPrior
from ctuq.posterior.samples import max_residual
from ctuq.posterior.sampling_cg import CGOptions, ObservationKernel, batched_cg
from ctuq.progress import check_cancel, emit_progress

log = logging.getLogger(__name__)

__all__ = ["fit_evidence_gradient"]


def fit_evidence_gradient(likelihood, prior: GaussianPrior, noise_var: float, *,
                          learn_noise: bool = True, learn_lengthscales: bool = False,
                          cg: CGOptions | None = None, steps: int = 100, lr: float = 0.1,
                          probes: int = 8, generator: torch.Generator | None = None,
                          progress: Callable | None = None,
                          cancel: Callable[[], bool] | None = None) -> dict:
    """Adam on ``−log p(ỹ)`` with stochastic ``∂ log|K|`` (the first reference code's path).

    Per step, one batched CG solve ``K [α, β_1..β_P] = [ỹ, ε_1..ε_P]`` (Gaussian
    probes, Nyström-preconditioned, ``α`` warm-started) and the surrogate

        s(ψ) = −½ αᵀ K(ψ) α + ½ mean_p β_pᵀ K(ψ) ε_p

    whose gradient is an unbiased estimate of ``∂(−log p)/∂ψ``; ``uᵀK(ψ)v =
    (Φᵀu)ᵀ Σ(ψ) (Φᵀv) + σ² uᵀv`` is differentiated through the prior only.
    The learning rate decays linearly to 10 %; the last 25 % of the iterates
    are averaged (in log space).

    Parameters
    ----------
    likelihood : Likelihood
        With a data target.
    prior : GaussianPrior
        The starting point (modified in place).
    noise_var : float
        Initial (or fixed) ``σ²``.
    learn_noise, learn_lengthscales : bool, optional
        Also fit ``log σ²`` (default True) / the Matérn ``log ℓ_b`` (default False).
    cg : CGOptions, optional
        ``tol``, ``max_iter`` and ``precond_rank`` of the solves are used.
        Default: tol 1e-3, 200 iterations, rank 100.
    steps, lr, probes : int, float, int
        Adam steps, peak learning rate, Hutchinson probes per step.
    generator : torch.Generator, optional
        CPU generator of the probes and sketches. Default seeded with 11.

    Returns
    -------
    dict
        ``prior`` (the fitted module), ``noise_var``, ``trace`` (per step:
        ``a_b``, ``sigma2``, ``cg_iterations``), ``seconds``.
    """
    cg = cg if cg is not None else CGOptions(max_iter=200, precond_rank=100)
    t_start = time.perf_counter()
    if likelihood.target is None:
        raise InputError("the evidence needs a likelihood with data", field="likelihood")
    gen = generator if generator is not None else torch.Generator().manual_seed(11)
    d_y = likelihood.d_obs
    obs_shape = likelihood.obs_shape
    y_tilde = likelihood.target.reshape(1, d_y)
    learn_l = learn_lengthscales and isinstance(prior, BlockPrior)
    params = [prior.log_a if isinstance(prior, BlockPrior) else prior.log_g]
    if learn_l:
        params.append(prior.log_l)
    log_noise = torch.tensor(math.log(noise_var), dtype=torch.float64,
                             requires_grad=bool(learn_noise))
    if learn_noise:
        params.append(log_noise)
    for p in prior.parameters():
        p.requires_grad_(any(p is q for q in params))
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 1.0 - 0.9 * min(i, steps) / max(1, steps))
    precond, x_alpha = None, None
    avg, n_avg = None, 0
    trace = []
    for it in range(steps):
        check_cancel(cancel, "evidence gradient fit")
        s2 = float(log_noise.detach().exp())
        kern = ObservationKernel(likelihood, prior, s2)
        hyper = hyper_vector(prior)
        if cg.precond_rank > 0 and (precond is None or
                                    float((precond.hyper - hyper).abs().max()) > 1.0):
            precond = NystromPreconditioner.build(kern.P, d_y, cg.precond_rank,
                                                  generator=gen, device=likelihood.device,
                                                  hyper=hyper)
        eps = torch.randn(probes, d_y, generator=gen).to(likelihood.device)
        B = torch.cat([y_tilde, eps])
        X0 = None
        if x_alpha is not None:
            X0 = torch.zeros_like(B)
            X0[0] = x_alpha
        X, solve = batched_cg(kern, B, X0=X0, tol=cg.tol, max_iter=cg.max_iter,
                              precond=(lambda R: precond(R, s2)) if precond is not None
                              else None)
        if not solve["converged"]:
            log.warning("CG did not reach tol %.1e in %d iterations (max residual %.2e)",
                        cg.tol, solve["iterations"], max_residual(solve))
        x_alpha = X[0].clone()
        with torch.no_grad():
            g = likelihood.phi_t(torch.cat([X, eps]).view(-1, *obs_shape)).double()
        g_alpha, g_beta, g_eps = g[0], g[1:probes + 1], g[probes + 1:]
        Xd, epsd = X.double(), eps.double()
        opt.zero_grad(set_to_none=True)
        with torch.enable_grad():
            s2_t = log_noise.exp()
            quad_alpha = (g_alpha * prior.cov(g_alpha.unsqueeze(0))[0]).sum() \
                + s2_t * Xd[0].square().sum()
            quad_probe = (g_beta * prior.cov(g_eps)).sum(1).mean() \
                + s2_t * (Xd[1:] * epsd).sum(1).mean()
            surrogate = (-0.5 * quad_alpha + 0.5 * quad_probe) / d_y
            surrogate.backward()
        opt.step()
        sched.step()
        prior.clear_cache()
        vec = torch.cat([p.detach().double().reshape(-1).cpu() for p in params])
        if it >= int(0.75 * steps):
            n_avg += 1
            avg = vec.clone() if avg is None else avg + (vec - avg) / n_avg
        a, _ = prior_lists(prior)
        trace.append({"step": it, "a_b": a, "sigma2": float(log_noise.detach().exp()),
                      "cg_iterations": int(solve["iterations"])})
        emit_progress(progress, "evidence_gradient", it + 1, steps,
                      f"step {it + 1}: CG {solve['iterations']} iterations")
    if avg is not None:  # Polyak average of the log-hyperparameters
        with torch.no_grad():
            i = 0
            for p in params:
                n = p.numel()
                p.copy_(avg[i:i + n].reshape(p.shape).to(p.device, p.dtype))
                i += n
    for p in prior.parameters():
        p.requires_grad_(True)
    prior.clear_cache()
    return {"prior": prior, "noise_var": float(log_noise.detach().exp()), "trace": trace,
            "seconds": time.perf_counter() - t_start}
