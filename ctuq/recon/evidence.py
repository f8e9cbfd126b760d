"""The CT client of the posterior engine: settings, prior, TV-PredCP, one EM call (docs/method.md §6–7).

:func:`uncertainty_options` is the one translation of the user's
:class:`~ctuq.recon.methods.laplace.LaplaceSettings` into the engine's option
objects (:class:`~ctuq.posterior.em.EMOptions`, a sampler object, the prior
kind, :class:`~ctuq.recon.predcp.PredCPOptions`); :func:`fit_posterior`
takes exactly those. It builds the Gaussian likelihood of the sinogram
through the ray transform (``Φ = A J``, mini-batched over projection
angles), the initial prior (:func:`initial_prior`: the g-prior starts on the
data's scale), the TV-PredCP hyperprior, and runs
:func:`ctuq.posterior.em.fit_hyperparameters`.

Measured (``docs/evidence.md``): with the reference 28² U-net the
per-block priors (``'matern'``, ``'ard'``) reach the exact evidence optimum,
but that optimum switches most blocks off and its error bars are too narrow;
the g-prior's optimum is calibrated.

Example
-------
>>> # doctest: +SKIP
>>> opts = uncertainty_options(UncertaintyConfig(), learn_noise=False, seed=0)
>>> post = fit_posterior(lin, op, y, sigma**2, **opts, tv_weight=dip.tv_weight)
>>> post.hyperparameters()["a_b"], post.trace[-1]["gamma_total"]
>>> z = post.draw(64)          # [64, d_θ] fresh zero-mean posterior samples
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable

import torch

from ctuq.errors import InputError
from ctuq.posterior import (CGOptions, CGSampler, EMOptions, FittedPosterior,
                            GaussianPrior, Linearization, LinearGaussianLikelihood, STOOptions,
                            STOSampler, build_prior, fit_hyperparameters)
from ctuq.posterior.prior_kinds import prior_kind
from ctuq.recon.predcp import PredCPOptions, TVPredCP, predcp_weight

__all__ = ["uncertainty_options", "options_summary", "ct_likelihood", "initial_prior",
           "fit_posterior", "PIPELINE_STO_ITERATIONS"]

log = logging.getLogger(__name__)

#: Most sample-then-optimise steps per solve in the pipeline (full-batch runs stop
#: early at their tolerance, 5–15 steps at 28² with the preconditioner).
PIPELINE_STO_ITERATIONS = 1000


def uncertainty_options(unc, *, learn_noise: bool, seed: int = 0) -> dict:
    """The engine's options for the Laplace settings.

    Parameters
    ----------
    unc : LaplaceSettings or UncertaintyConfig
        :class:`~ctuq.recon.methods.laplace.LaplaceSettings` (an
        :class:`~ctuq.recon.config.UncertaintyConfig` reads as its ``laplace``)
    learn_noise : bool
        Update ``σ²`` in the M-step (the pipeline decides from whether the
        noise level is known).
    seed : int
        Seed of the EM draws (the PredCP draws use ``seed + 3``).

    Returns
    -------
    dict
        The keyword arguments ``prior`` (kind), ``em`` (EMOptions),
        ``sampler`` (CGSampler with ``cg_tol``, ``cg_max_iter``, ``cg_refine``,
        ``preconditioner_rank``, adaptive up to ``preconditioner_max_rank``
        on ``preconditioner_max_ratio`` and ``preconditioner_grow_after``;
        or STOSampler with ``sto_iterations`` steps
        (default :data:`PIPELINE_STO_ITERATIONS`) over mini-batches of
        ``sto_batch_size`` projection angles (None: all) and the other defaults
        of :class:`~ctuq.posterior.sampling_sto.STOOptions`) and ``predcp``
        (PredCPOptions, or None when off) of :func:`fit_posterior`. Matérn
        lengthscales are learned exactly when TV-PredCP is on.
    """
    em = EMOptions(n_samples=int(unc.n_samples), em_steps=int(unc.em_steps),
                   em_tol=float(unc.em_tol), update=unc.update,
                   initial_scale=str(unc.initial_scale), initial_noise=str(unc.initial_noise),
                   acceleration=str(unc.em_acceleration),
                   learn_noise=bool(learn_noise),
                   learn_lengthscales=prior_kind(unc.prior).has_lengthscale
                   and bool(unc.predcp),
                   seed=int(seed))
    if unc.sampler == "cg":
        sampler = CGSampler(CGOptions(tol=float(unc.cg_tol), max_iter=int(unc.cg_max_iter),
                                      refine=refine_rounds(unc, "em"),
                                      precond_rank=int(unc.preconditioner_rank),
                                      precond_max_rank=unc.preconditioner_max_rank,
                                      precond_max_ratio=(
                                          None if unc.preconditioner_max_ratio is None
                                          else float(unc.preconditioner_max_ratio)),
                                      precond_grow_after=unc.preconditioner_grow_after))
    else:
        sampler = STOSampler(STOOptions(iterations=int(unc.sto_iterations),
                                        batch_size=unc.sto_batch_size))
    predcp = PredCPOptions(scale=float(unc.predcp_scale), samples=int(unc.predcp_samples)) \
        if unc.predcp else None
    return {"prior": unc.prior, "em": em, "sampler": sampler, "predcp": predcp}


def refine_rounds(unc, stage: str) -> int:
    """The float64 refinement rounds of ``stage``'s solves ('em' or 'predictive'):
    ``cg_refine``, or 0 for the EM's where ``cg_refine_stages`` is 'predictive'."""
    if stage == "em" and getattr(unc, "cg_refine_stages", "all") == "predictive":
        return 0
    return int(unc.cg_refine)


def options_summary(options: dict) -> dict:
    """:func:`uncertainty_options`'s result as a JSON-able dict (result files)."""
    sampler = options["sampler"]
    predcp = options.get("predcp")
    return {"prior": options["prior"], "em": dataclasses.asdict(options["em"]),
            "sampler": {"method": sampler.method, **dataclasses.asdict(sampler.options)},
            "predcp": dataclasses.asdict(predcp) if predcp is not None else None}


def ct_likelihood(lin: Linearization, op, y, ray_variance=None) -> LinearGaussianLikelihood:
    """The Gaussian likelihood of sinogram ``y`` through the ray transform ``op``.

    ``ray_variance``: ``v``, the per-ray relative noise variance (the
    sinogram's shape, mean 1) of the count noise model: the noise is
    ``σ² diag(v)`` and the likelihood is whitened by ``v^{-1/2}``
    (:class:`~ctuq.posterior.likelihood.LinearGaussianLikelihood`). Default
    None: every ray alike (the operator unwrapped, bit for bit).
    """
    return LinearGaussianLikelihood(lin, op, y, batch_axis="projection angles",
                                    ray_variance=ray_variance)


def initial_prior(likelihood: LinearGaussianLikelihood, kind: str = "gprior", *,
                  init_variance: float | None = None, init_lengthscale: float = 0.1,
                  generator: torch.Generator | None = None) -> GaussianPrior:
    """The prior of kind ``kind`` at its initial hyperparameters.

    Parameters
    ----------
    likelihood : LinearGaussianLikelihood
    kind : {'matern', 'ard', 'gprior'}
    init_variance : float or None
        Initial ``a_b`` (or ``g``). None: 1 for the block priors (reference);
        for the g-prior ``mean(ỹ²) / d_θ`` (``ỹ`` the whitened data
        :attr:`~ctuq.posterior.likelihood.LinearGaussianLikelihood.y_white`,
        on the scale of ``Φ``; ``y`` itself without per-ray variances), which puts the prior predictive
        of one measurement on the data's scale (from ``g = 1`` the 64² demo's
        ``K`` has eigenvalues up to 3·10⁸ against ``σ² ≈ 0.08``, and CG with
        the rank-100 preconditioner stalled); 1 without data.
    init_lengthscale : float
        Initial Matérn ``ℓ_b``. Default 0.1 (reference).
    generator : torch.Generator, optional
        The g-prior's probes.
    """
    variance = init_variance
    if variance is None:
        y = likelihood.y_white
        variance = (float(y.double().square().mean()) / likelihood.num_params
                    if prior_kind(kind).uses_likelihood and y is not None else 1.0)
    return build_prior(likelihood, kind, variance, init_lengthscale, generator=generator)


def fit_posterior(lin: Linearization, op, y, noise_var: float, *,
                  prior: str | GaussianPrior = "gprior", em: EMOptions | None = None,
                  sampler=None, predcp: PredCPOptions | None = None,
                  tv_weight: float | None = None, init_variance: float | None = None,
                  init_lengthscale: float = 0.1, mstep: Callable | None = None,
                  likelihood: LinearGaussianLikelihood | None = None,
                  ray_variance=None, progress: Callable | None = None,
                  cancel: Callable[[], bool] | None = None) -> FittedPosterior:
    """Fit the prior and noise hyperparameters of the linearised DIP by sample-based EM.

    Parameters
    ----------
    lin : Linearization
        The Jacobian operator at the DIP fit.
    op : RayTransform
        On ``lin.device``.
    y : Tensor, shape (n_angles, n_det)
        The measured sinogram.
    noise_var : float
        Initial ``σ²`` (kept when ``em.learn_noise`` is False).
    prior : {'matern', 'ard', 'gprior'} or GaussianPrior, optional
        The prior kind (built by :func:`initial_prior`), or a prior to start
        from (modified in place). Default ``'gprior'``.
    em : EMOptions, optional
        Default ``EMOptions()``.
    sampler : optional
        A sampler object (CGSampler, STOSampler, or a test's DenseSampler).
        Default: the pipeline's CG sampler (:func:`uncertainty_options` of
        the default UncertaintyConfig).
    predcp : PredCPOptions, optional
        TV-PredCP on (needs ``tv_weight``); None: off. Default None.
    tv_weight : float, optional
        The DIP's TV weight ``γ`` (sum-of-squares convention);
        ``λ = predcp.scale · γ``. Without it PredCP is skipped (warned).
    init_variance, init_lengthscale : optional
        See :func:`initial_prior`.
    mstep : callable, optional
        The M-step (default :func:`ctuq.posterior.mstep.closed_form_mstep`).
    likelihood : LinearGaussianLikelihood, optional
        :func:`ct_likelihood` of ``lin``, ``op``, ``y`` when the caller has
        it already (built here otherwise, with ``ray_variance``).
    ray_variance : Tensor, optional
        ``v`` of :func:`ct_likelihood` (``noise_var`` is then ``σ²`` of
        ``σ² v``). Default None.
    progress, cancel : callable, optional
        ``emit_progress(progress, "em", step, total, message)`` after every
        E-/M-step; ``cancel`` is checked between steps and inside the solves.

    Returns
    -------
    FittedPosterior
        Its ``reported`` and ``info`` carry ``predcp_weight``; every trace
        entry has ``kappa`` (the PredCP complexities, None without it).

    Raises
    ------
    InputError
        Bad noise variance, sinogram or options.
    Cancelled
        When ``cancel()`` returned True.
    """
    em = em if em is not None else EMOptions()
    if sampler is None:
        from ctuq.recon.methods.laplace_settings import LaplaceSettings

        sampler = uncertainty_options(LaplaceSettings(), learn_noise=em.learn_noise)["sampler"]
    sigma2 = float(noise_var)
    if not (math.isfinite(sigma2) and sigma2 > 0):
        raise InputError(f"must be a positive number, got {noise_var!r}", field="noise_var")
    likelihood = likelihood if likelihood is not None else ct_likelihood(lin, op, y,
                                                                         ray_variance)
    gen = torch.Generator().manual_seed(int(em.seed))
    if not isinstance(prior, GaussianPrior):
        prior_kind(prior)  # an unknown name fails here
        prior = initial_prior(likelihood, prior, init_variance=init_variance,
                              init_lengthscale=init_lengthscale, generator=gen)
    learn_l = em.learn_lengthscales and prior.learns_lengthscale

    hyperprior, weight = None, 0.0
    if predcp is not None and predcp.scale > 0:
        if tv_weight is None or not tv_weight > 0:
            log.warning("TV-PredCP needs the DIP's TV weight; running without the hyperprior")
        else:
            weight = predcp_weight(predcp.scale, tv_weight)
            hyperprior = TVPredCP(lin, prior, weight, predcp.samples,
                                  torch.Generator().manual_seed(int(em.seed) + 3),
                                  lengthscales=learn_l)
    post = fit_hyperparameters(likelihood, prior, sigma2, sampler, em, hyperprior=hyperprior,
                               mstep=mstep, generator=gen, progress=progress, cancel=cancel)
    post.reported["predcp_weight"] = weight
    post.info.update(predcp_weight=weight,
                     tv_weight=None if tv_weight is None else float(tv_weight))
    for entry in post.trace:
        entry.setdefault("kappa", None)
    return post
