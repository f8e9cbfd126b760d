"""The linearised Laplace method: linearise the DIP at its fit, sample-based EM, predictive.

    DIP fit θ̃ ─▶ linearisation J ─▶ EM of the prior and noise (TV-PredCP)
              ─▶ posterior samples J z ─▶ std

The reconstruction is the DIP output, or with ``mean = 'linear'`` the
linearised model's posterior mean; docs/method.md §6–7 has the method,
docs/evidence.md the measurements behind the defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Callable

import torch

from ctuq.progress import check_cancel, emit_progress
from ctuq.recon.methods.base import MeanStep, UncertaintyMethod, UncertaintyOutcome
from ctuq.recon.methods.laplace_settings import LaplaceSettings

__all__ = ["LaplaceSettings", "LaplaceMethod", "laplace_posterior", "linear_mean_shift",
           "linear_step_of_fit", "PREDICTIVE_BATCH"]

#: Predictive samples per solver call: progress and cancel between batches.
#: The solver's work is linear in the batch; each extra call adds only the
#: linear target and the (already converged) θ* row's residual check.
PREDICTIVE_BATCH = 32


def laplace_posterior(dip, op, y: torch.Tensor, noise_std: float, settings: LaplaceSettings,
                      *, predictive_samples: int, learn_noise: bool, seed: int = 0,
                      progress: Callable | None = None, cancel: Callable[[], bool] | None = None,
                      stages=None, ray_variance=None) -> dict:
    """Linearise at the DIP fit, fit the hyperparameters by sample-based EM, draw the predictive.

    Parameters
    ----------
    dip : DIPResult
        The fitted network (its output is the predictive mean).
    op : RayTransform
    y : Tensor, shape (n_angles, n_detector)
    noise_std : float
        Known or estimated noise std of ``y`` (the initial ``σ``).
    settings : LaplaceSettings (or any object with its attributes)
    predictive_samples : int
        Image-space samples for the std map.
    learn_noise : bool
        Update ``σ²`` in the M-step.
    seed : int
        Seed of the EM draws (``seed``) and of the predictive draws (``seed + 7``).
    progress, cancel : callable, optional
    stages : StageRunner, optional
        Checkpoints of ``em`` and ``predictive`` (default: none).
    ray_variance : Tensor, optional
        ``v``, the per-ray relative noise variance of the count noise model
        (noise ``σ² v``, ``σ = noise_std``; the EM learns ``σ²`` when
        ``learn_noise``). Default None (every ray alike).

    Returns
    -------
    dict
        ``posterior`` (:class:`~ctuq.posterior.em.FittedPosterior`),
        ``linearization``, ``image_samples`` (zero-mean, ``[k, H, W]``),
        ``variance`` and ``std`` (``[H, W]``), ``timings`` (seconds of
        ``em`` and ``predictive``) and the engine ``options``
        (:func:`~ctuq.recon.evidence.uncertainty_options`).
    """
    from ctuq.posterior import FittedPosterior, Linearization
    from ctuq.recon import predictive
    from ctuq.recon.evidence import (ct_likelihood, fit_posterior, refine_rounds,
                                     uncertainty_options)
    from ctuq.recon.stages import StageRunner

    stages = stages or StageRunner(None)
    timings = {}
    lin = Linearization(dip.model, dip.net_input)
    # one likelihood, whether the EM runs or its checkpoint is loaded
    likelihood = ct_likelihood(lin, op, y, ray_variance)
    options = uncertainty_options(settings, learn_noise=bool(learn_noise), seed=seed)
    options["em"] = options["em"].with_(em_patience=int(getattr(settings, "em_patience", 1)))
    tv_weight = float(dip.config.resolve_tv_weight(y, op, noise_std))  # EM and TV curvature
    post, timings["em"] = stages.run(
        "em", lambda: fit_posterior(
            lin, op, y, noise_std**2, **options, tv_weight=tv_weight,
            likelihood=likelihood, progress=progress, cancel=cancel),
        # saved without its likelihood (the operator and network are rebuilt)
        pack=lambda p: {f.name: getattr(p, f.name) for f in fields(p) if f.name != "likelihood"},
        unpack=lambda s: FittedPosterior(likelihood=likelihood, **s),
        progress=progress)
    check_cancel(cancel, "reconstruction")
    drawn = post
    if float(getattr(settings, "tv_curvature", 0.0)) > 0:
        from ctuq.recon.tv_curvature import with_tv_curvature
        drawn = with_tv_curvature(post, lin, factor=float(settings.tv_curvature),
                                  tv_weight=tv_weight, noise_std=float(noise_std))
    k = int(predictive_samples)
    refine = refine_rounds(settings, "predictive")
    options_of = getattr(drawn.sampler, "options", None)
    if options_of is not None and getattr(options_of, "refine", refine) != refine:
        # cg_refine_stages = 'predictive': the EM solved in float32, the draws refine
        drawn = dataclasses.replace(drawn, sampler=type(drawn.sampler)(
            dataclasses.replace(options_of, refine=refine)))

    def draw():
        emit_progress(progress, "predictive", 0, k, "posterior samples")
        gen = torch.Generator().manual_seed(seed + 7)
        z = drawn.draw(k, generator=gen, batch_size=PREDICTIVE_BATCH, progress=progress,
                       cancel=cancel)
        emit_progress(progress, "predictive", k, k, "done")
        return predictive.image_samples(lin, z), drawn.draw_info  # zero-mean, [k, H, W]

    (image_samples, drawn.draw_info), timings["predictive"] = stages.run(
        "predictive", draw, progress=progress)
    variance = image_samples.pow(2).mean(0)
    return {"posterior": drawn, "linearization": lin, "image_samples": image_samples,
            "variance": variance, "std": variance.sqrt(), "timings": timings,
            "options": options}


def linear_mean_shift(lin, post) -> torch.Tensor:
    """``J (θ* − θ̃)``, shape ``(H, W)``: the linearised model's posterior mean minus the
    DIP output (``θ*`` the fitted posterior's mode, ``θ̃`` the linearisation point)."""
    return _linear_step(lin, post.theta_star)


def _linear_step(lin, theta) -> torch.Tensor:
    """``J (θ − θ̃)``, shape ``(H, W)``: the linear model at ``θ`` minus the fit's output."""
    with torch.no_grad():
        return lin.linear_model(theta.to(lin.theta_hat)) - lin.x_hat


def linear_step_of_fit(post, *, seed: int = 0) -> Callable:
    """The linear model's step ``J (θ* − θ̃)`` of another DIP fit of the scan, under ``post``'s
    fitted prior and noise: ``step(dip, op, y, ray_variance) -> Tensor (H, W)``.

    For the held-out model error of ``mean = 'linear'``
    (:class:`~ctuq.recon.methods.base.MeanStep`): the held-out fit is
    linearised at its own weights and its mode ``θ*`` solved on its own rows
    (one CG solve, its own preconditioner) with the hyperparameters and
    ``σ²`` the EM fitted on all rows. A prior built from the likelihood (the
    g-prior, whose scales are ``diag(ΦᵀΦ)``'s) is rebuilt from the other
    fit's: the first fit's scales would give weights that were dead there and
    live here a thousandfold prior variance.
    """

    def step(dip, op, y, ray_variance=None) -> torch.Tensor:
        from ctuq.posterior import Linearization
        from ctuq.posterior.prior_kinds import PRIORS
        from ctuq.recon.evidence import ct_likelihood, initial_prior

        gen = torch.Generator().manual_seed(seed)
        lin = Linearization(dip.model, dip.net_input)
        likelihood = ct_likelihood(lin, op, y, ray_variance)
        prior, kind = post.prior, PRIORS.get(getattr(post.prior, "name", ""))
        if kind is not None and kind.uses_likelihood:  # block priors do not depend on Φ
            prior = initial_prior(likelihood, kind.name, init_variance=1.0, generator=gen)
            prior.set_hyperparameters(variances=post.prior.variances.detach())
        mode = post.sampler.sample(likelihood, prior, post.noise_var, 0, generator=gen,
                                   stage="model error").theta_star
        return _linear_step(lin, mode).to(dip.reconstruction)

    return step


def _diagnostics(draw_info) -> dict:
    """Where the predictive draws were refined (``cg_refine``): their largest certified
    data-space error over the noise's norm (``predictive_data_error``)."""
    certified = [d["refine"]["data_error"] for d in draw_info or []
                 if (d.get("refine") or {}).get("data_error") is not None]
    return {"predictive_data_error": float(max(certified))} if certified else {}


class LaplaceMethod(UncertaintyMethod):
    """The linearised Laplace posterior with sample-based evidence (the default)."""

    name = "laplace"
    settings_class = LaplaceSettings
    shipped_calibration = True

    @classmethod
    def required_model_error(cls, settings):
        # the step's length is chosen on the held-out fit's left-out projections
        from ctuq.recon.model_error.names import HELDOUT

        return HELDOUT if settings.mean == "linear-heldout" else None

    def run(self, problem, dip, *, stages, progress=None, cancel=None) -> UncertaintyOutcome:
        from ctuq.recon.evidence import options_summary
        from ctuq.recon.posterior_handle import LinearisedPosterior

        s = self.settings
        learn = (not problem.noise.known) if s.learn_noise is None else s.learn_noise
        out = laplace_posterior(dip, problem.op, problem.y, problem.noise.std, s,
                                predictive_samples=problem.uncertainty.predictive_samples,
                                learn_noise=learn, seed=problem.seed, progress=progress,
                                cancel=cancel, stages=stages,
                                ray_variance=problem.noise.ray_variance)
        post = out["posterior"]
        mean = dip.reconstruction.detach()
        step = None
        if s.mean != "dip":  # 'linear': the whole step; 'linear-heldout': its length held out
            shift = linear_mean_shift(out["linearization"], post).to(mean)
            step = MeanStep(shift, linear_step_of_fit(post, seed=problem.seed),
                            length=1.0 if s.mean == "linear" else None)
            mean = mean + shift
        return UncertaintyOutcome(
            reconstruction=mean, variance=out["variance"].double().cpu(),
            samples=mean + out["image_samples"], fluctuations=out["image_samples"],
            noise_var=float(post.noise_var),
            posterior=LinearisedPosterior(post, out["linearization"], mean.cpu().numpy(),
                                          seed=problem.seed),
            hyperparameters=post.hyperparameters(), trace=post.trace,
            summary={"evidence": options_summary(out["options"])},
            diagnostics=_diagnostics(post.draw_info), timings=out["timings"],
            refit=step is not None, mean_step=step)
