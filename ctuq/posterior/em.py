"""Prior (and noise) hyperparameters by sample-based EM / MacKay updates (docs/method.md §6).

:func:`fit_hyperparameters` alternates

E-step
    ``θ*`` (with a data target; else the likelihood's ``mode``) and ``k``
    zero-mean samples ``z ~ N(0, H⁻¹)`` for the current hyperparameters, from
    a sampler object (:class:`~ctuq.posterior.sampling_cg.CGSampler`,
    :class:`~ctuq.posterior.sampling_sto.STOSampler`, or the dense oracle's
    :class:`~ctuq.posterior.evidence_oracle.DenseSampler` that tests and
    benchmarks hand in), warm-started from the previous step with the same
    base draws;
M-step
    from the E-step's statistics (:mod:`ctuq.posterior.mstep`), by default
    :func:`~ctuq.posterior.mstep.closed_form_mstep`: MacKay / EM for ``a_b``,
    a few Adam steps on ``Q + log p(ψ)`` when a hyperprior is given or Matérn
    lengthscales are learned, then ``σ²`` (when it is learned).

The loop stops when no log-hyperparameter of an active block (``γ̂_b ≥
inactive_gamma``; ARD switches blocks off by driving ``a_b → 0``, where the
evidence is flat) moves by more than ``em_tol``, or after ``em_steps``
M-steps; a last E-step at the final hyperparameters gives the returned
mode and samples, so they always match the hyperparameters.

Example
-------
>>> # doctest: +SKIP
>>> post = fit_hyperparameters(likelihood, prior, sigma**2, CGSampler(), EMOptions())
>>> post.hyperparameters()["a_b"], post.trace[-1]["gamma_total"]
>>> z = post.draw(64)          # [64, d_θ] fresh zero-mean posterior samples
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from ctuq.errors import CtuqError, InputError
from ctuq.posterior.anderson import AndersonMixer
from ctuq.posterior.mstep import (VAR_MAX, VAR_MIN, EStepStats, Hyperprior, closed_form_mstep,
                                  estep_statistics)
from ctuq.posterior.priors import BlockPrior, GaussianPrior
from ctuq.posterior.samples import PosteriorSample, max_residual
from ctuq.progress import check_cancel, emit_progress, relay

__all__ = ["EMOptions", "FittedPosterior", "fit_hyperparameters"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EMOptions:
    """Settings of :func:`fit_hyperparameters`.

    The defaults are the CT pipeline's; a client with other needs (the
    classifiers: no noise to learn, every block counted) passes its own.

    Parameters
    ----------
    n_samples : int
        ``k``, posterior samples per E-step. Default 16.
    em_steps : int
        Maximum number of M-steps (0: one E-step at the initial values).
        Default 6.
    em_tol : float
        Stop when no counted log-hyperparameter moved by more than this (a
        relative change of the hyperparameter) for ``em_patience`` consecutive
        M-steps. Default 0.02.
    em_patience : int
        Consecutive M-steps below ``em_tol`` before the EM stops (then one
        E-step at the final values gives the samples). Default 1.
    update : {'mackay', 'em'}
        Closed-form update of ``a_b`` (and ``σ²``). Default ``'mackay'``.
    learn_noise : bool
        Update ``σ²``; False keeps the given (known) noise variance, and a
        likelihood without a noise parameter needs False. Default True.
    gamma_estimator : {'matheron', 'prior', 'phi'}
        Sample estimator of ``γ_b`` (:mod:`ctuq.posterior.mstep`). Default
        ``'matheron'``.
    redraw : bool
        Fresh base draws in every E-step (default False: the same draws,
        warm-started, as the reference).
    inactive_gamma : float
        Blocks with ``γ̂_b`` below this are switched off by the evidence (ARD
        pruning: MacKay shrinks their ``a_b`` geometrically, the evidence is
        flat in it) and do not count for convergence. Default 0.01.
    learn_lengthscales : bool
        Also learn the Matérn ``ℓ_b`` (Adam on ``Q`` in the M-step; only for a
        Matérn :class:`~ctuq.posterior.priors.BlockPrior`). Default False.
    mstep_steps : int
        Adam steps per M-step on ``Q + log p(ψ)`` (when a hyperprior is given
        or lengthscales are learned). Default 10.
    mstep_lr : float
        Their learning rate (log space). Default 0.05.
    seed : int
        Seeds the draws when no generator is given, and (``seed + 1``) the
        default generator of :meth:`FittedPosterior.draw`. Default 0.
    initial_scale : {'given', 'sketch'}
        ``'given'``: the first E-step runs at the prior as passed. ``'sketch'``
        (a sampler with ``observation_sketch``, the CG sampler, and a
        likelihood with data): the first E-step's Nyström sketch is built
        first and every prior variance is multiplied by the scale that best
        explains the data's projections on its eigenvectors
        (:meth:`~ctuq.posterior.preconditioner.NystromPreconditioner.evidence_scale`),
        at no extra products; the first, worst-conditioned solve then starts
        near the evidence's scale instead of the prior's guess. Default
        ``'given'``.
    initial_noise : {'given', 'residual'}
        ``'given'``: the first E-step runs at ``noise_var`` as passed.
        ``'residual'`` (with ``learn_noise`` and data): at MacKay's update
        with no parameter yet determined, ``‖ỹ − Φθ̃‖² / d_y``, the whitened
        residual of the fit the model is linearised at (one product): where
        that fit does not explain the data at the noise level (a real scan,
        an underfitted DIP) the first update moves ``σ²`` there anyway (a
        128² scan at I0 1e5: 18×), after a first E-step, and its sketch's
        scale, computed at the wrong ``σ²``. Taken before ``initial_scale``.
        Without a learned noise it is ignored (logged). Default ``'given'``.
    acceleration : {'none', 'anderson'}
        ``'anderson'``: the next E-step runs at the Anderson mixing (depth 2,
        :class:`~ctuq.posterior.anderson.AndersonMixer`) of the last M-steps'
        results in the counted log-hyperparameters, not at the last M-step's
        result: the plain loop converges linearly (≈ halving its change per
        step on realistic 64² scans) and rings where the map overshoots. The
        fixed point and the stopping rule are the same (a step's ``change`` is
        its own M-step's); the trace marks mixed steps (``accelerated``).
        Measured on the g-prior (the CT pipeline's); with ARD, whose pruned
        blocks never settle, a 28² test ended at another σ² (15 %) after 40
        steps. A mixed point whose E-step's solves end above their tolerance
        is rejected: that E-step is discarded (the trace marks it
        ``rejected``; ``info['acceleration_rejected']`` is its step), the next
        runs at the plain M-step's result, one E-step beyond ``em_steps``,
        and nothing is mixed after it. Default ``'none'``.
    """

    n_samples: int = 16
    em_steps: int = 6
    em_tol: float = 0.02
    em_patience: int = 1
    update: str = "mackay"
    learn_noise: bool = True
    gamma_estimator: str = "matheron"
    redraw: bool = False
    inactive_gamma: float = 0.01
    learn_lengthscales: bool = False
    mstep_steps: int = 10
    mstep_lr: float = 0.05
    seed: int = 0
    initial_scale: str = "given"
    initial_noise: str = "given"
    acceleration: str = "none"

    def __post_init__(self):
        choices = {"update": ("mackay", "em"),
                   "gamma_estimator": ("matheron", "prior", "phi"),
                   "initial_scale": ("given", "sketch"),
                   "initial_noise": ("given", "residual"),
                   "acceleration": ("none", "anderson")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise InputError(f"must be one of {', '.join(allowed)}, got "
                                 f"{getattr(self, name)!r}", field=name)
        for name, low in (("n_samples", 1), ("em_steps", 0), ("mstep_steps", 0),
                          ("em_patience", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise InputError(f"must be an integer >= {low}, got {v!r}", field=name)
        for name in ("em_tol", "mstep_lr", "inactive_gamma"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"must be a number >= 0, got {v!r}", field=name)

    def with_(self, **changes) -> "EMOptions":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------------------
# bookkeeping of the free log-hyperparameters


def _full_vector(prior: GaussianPrior, sigma2: float) -> Tensor:
    """``[log a_b (B), log ℓ_b (B, BlockPrior only), log σ²]``, float64, CPU."""
    with torch.no_grad():
        parts = [prior.variances.detach().double().cpu().log()]
        if isinstance(prior, BlockPrior):
            parts.append(prior.log_l.detach().double().cpu())
        parts.append(torch.tensor([math.log(sigma2)], dtype=torch.float64))
    return torch.cat(parts)


def _solve_record(sample: PosteriorSample) -> dict:
    """How an E-step's solves ended, as its trace entry records it (with a float64
    refinement, its correction solves' iterations counted and ``solver_data_error``:
    the samples' error seen through the data over the noise's norm, at most)."""
    refine = sample.info.get("refine") or {}
    return {"solver_iterations": int(sample.info.get("iterations", 0))
            + int(refine.get("iterations", 0)),
            "solver_converged": bool(sample.info.get("converged", True)),
            "solver_residual": max_residual(sample.info),
            "solver_data_error": refine.get("data_error"),
            "precond_rank": int(sample.info.get("precond_rank", 0))}


def _set_full_vector(prior: GaussianPrior, full: Tensor) -> float:
    """Write a :func:`_full_vector` back into ``prior``; returns ``σ²``."""
    nb = prior.num_blocks
    bounds = (math.log(VAR_MIN), math.log(VAR_MAX))
    prior.set_hyperparameters(variances=full[:nb].clamp(*bounds).exp())
    if isinstance(prior, BlockPrior):
        prior.set_hyperparameters(lengthscales=full[nb:2 * nb].exp())
    return float(full[-1].clamp(*bounds).exp())


def _free_mask(prior: GaussianPrior, learn_noise: bool, lengthscales: bool) -> Tensor:
    """Which entries of :func:`_full_vector` the M-step changes."""
    nb = prior.num_blocks
    parts = [torch.ones(nb, dtype=torch.bool)]
    if isinstance(prior, BlockPrior):
        parts.append(torch.tensor(prior.lengthscale_blocks, dtype=torch.bool) & lengthscales)
    parts.append(torch.tensor([bool(learn_noise)]))
    return torch.cat(parts)


def _counted(free: Tensor, active_blocks: Tensor) -> Tensor:
    """Free entries that count for convergence: those of active blocks, and ``σ²``."""
    nb = active_blocks.numel()
    full = torch.cat([active_blocks, active_blocks, torch.ones(1, dtype=torch.bool)]) \
        if free.numel() == 2 * nb + 1 else torch.cat([active_blocks,
                                                      torch.ones(1, dtype=torch.bool)])
    return full[free]


def prior_lists(prior: GaussianPrior) -> tuple[list[float], list[float]]:
    """``(a_b, ℓ_b)`` as lists (``ℓ_b`` empty for the g-prior)."""
    a = [float(v) for v in prior.variances.detach().cpu()]
    if isinstance(prior, BlockPrior):
        return a, [float(v) for v in prior.lengthscales.detach().cpu()]
    return a, []


def _scale_from_sketch(likelihood, prior: GaussianPrior, sigma2: float, sampler, gen, info,
                       progress, cancel):
    """``EMOptions.initial_scale = 'sketch'``: multiply every prior variance by the sketch's
    evidence scale; returns the sketch (the first E-step's preconditioner) or None."""
    sketch = getattr(sampler, "observation_sketch", None)
    if sketch is None or likelihood.target is None:
        log.warning("initial_scale 'sketch' needs the CG sampler and data; the prior's "
                    "scale is kept")
        return None
    pc = sketch(likelihood, prior, sigma2, generator=gen, progress=progress, cancel=cancel,
                stage="em")
    if pc is None:  # no preconditioner (rank 0): nothing to read the scale from
        log.warning("initial_scale 'sketch' needs preconditioner_rank > 0; the prior's "
                    "scale is kept")
        return None
    factor = pc.evidence_scale(likelihood.target, sigma2)
    a, _ = prior_lists(prior)
    prior.set_hyperparameters(variances=[v * factor for v in a])
    info["initial_scale"] = {"factor": factor, "rank": pc.rank}
    log.info("initial prior scale × %.3g from the rank-%d sketch's evidence", factor, pc.rank)
    return pc


def _noise_from_residual(likelihood, sigma2: float, info) -> float:
    """``EMOptions.initial_noise = 'residual'``: ``‖ỹ − Φθ̃‖² / d_y`` (MacKay's ``σ²`` at
    ``γ = 0``), the residual of the linearisation point itself."""
    theta = likelihood.lin.theta_hat.detach().reshape(1, -1)
    with torch.no_grad():
        resid = likelihood.target - likelihood.phi(theta)[0]
    new = float(resid.double().square().sum()) / likelihood.d_obs
    new = min(max(new, VAR_MIN), VAR_MAX)
    info["initial_noise"] = {"given": sigma2, "residual": new}
    log.info("initial noise variance %.4g (given %.4g) from the fit's residual", new, sigma2)
    return new


def _check_finite(sample: PosteriorSample, step: int) -> None:
    ok = bool(torch.isfinite(sample.z).all()) and (
        sample.theta_star is None or bool(torch.isfinite(sample.theta_star).all()))
    if not ok:
        raise CtuqError(f"the posterior sampler diverged in EM step {step} (non-finite "
                        f"samples; solver info: iterations {sample.info.get('iterations')}, "
                        f"converged {sample.info.get('converged')}); try update='em', fewer "
                        f"em_steps, or more solver iterations")


# ------------------------------------------------------------------------------
# the fitted posterior


@dataclass
class FittedPosterior:
    """The linearised posterior with fitted hyperparameters.

    Attributes
    ----------
    likelihood : Likelihood
    prior : GaussianPrior
        The fitted prior module (hyperparameters inside).
    noise_var : float
        The fitted (or fixed) ``σ²``.
    theta_star : Tensor, shape (d_θ,)
        The mode at the final hyperparameters (``θ*``; the likelihood's
        ``mode`` when it has no target).
    samples : Tensor, shape (k, d_θ)
        Zero-mean posterior samples of the last E-step (final hyperparameters).
    trace : list of dict
        One JSON-able entry per E-step: ``step``, ``a_b``, ``l_b``, ``sigma2``
        (the hyperparameters the E-step ran with), ``gamma_hat`` (per block),
        ``gamma_hat_se``, ``gamma_total``, ``gamma_total_se``,
        ``residual_norm`` (``‖ỹ − Φθ*‖``; NaN without a target),
        ``solver_iterations``, ``solver_converged``, ``seconds`` (E- and
        M-step), and, when an M-step followed, ``change`` (largest counted
        log-hyperparameter move) and the M-step's report (with a hyperprior:
        ``log_hyperprior`` and its own entries).
    options : EMOptions
    sampler
        The sampler object of the E-steps (reused by :meth:`draw`).
    info : dict
        ``converged``, ``em_steps`` (M-steps done), ``seconds``, ``initial``
        hyperparameters, ``hyperprior_weight``, the final E-step's sampler info.
    sample_state : PosteriorSample
        The last E-step's result (warm start of :meth:`draw`).
    stats : EStepStats
        The last E-step's statistics.
    reported : dict
        Client entries added to :meth:`hyperparameters` (CT: ``predcp_weight``).
    draw_info : list of dict
        The sampler info of each solver call of the latest :meth:`draw`.
    """

    likelihood: object
    prior: GaussianPrior
    noise_var: float
    theta_star: Tensor
    samples: Tensor
    trace: list
    options: EMOptions
    sampler: object
    info: dict = field(default_factory=dict)
    sample_state: PosteriorSample | None = None
    stats: EStepStats | None = None
    reported: dict = field(default_factory=dict)
    draw_info: list = field(default_factory=list)

    @property
    def lin(self):
        """The likelihood's linearisation."""
        return self.likelihood.lin

    @property
    def block_names(self) -> list[str]:
        return list(self.prior.block_names)

    def hyperparameters(self) -> dict:
        """JSON-able summary of the fitted hyperparameters.

        Keys: ``prior`` (``'matern'``, ``'ard'`` or ``'gprior'``),
        ``block_names``, ``block_sizes``, ``a_b`` (per-block variances; ``[g]``
        for the g-prior), ``l_b`` (Matérn lengthscales, one per block, ``[]``
        for the g-prior), ``matern_blocks`` (whether ``ℓ_b`` matters),
        ``sigma2``, ``noise_learned``, ``gamma_hat``, ``gamma_total``, the
        client's :attr:`reported` entries, ``em_steps``, ``converged``; with
        ``initial_scale = 'sketch'`` also ``initial_scale_factor``, the factor
        the first E-step's prior variances got; with ``initial_noise =
        'residual'`` (learned noise) ``initial_sigma2``, the ``σ²`` it started at.
        """
        a, l = prior_lists(self.prior)
        matern = list(self.prior.lengthscale_blocks)
        matern = matern if len(matern) == len(a) else [False] * len(a)
        st = self.stats
        return {
            "prior": getattr(self.prior, "name", type(self.prior).__name__),
            "block_names": self.block_names,
            "block_sizes": [int(v) for v in self.prior.block_dims],
            "a_b": a,
            "l_b": l,
            "matern_blocks": [bool(m) for m in matern],
            "sigma2": float(self.noise_var),
            "noise_learned": bool(self.options.learn_noise),
            "gamma_hat": [float(v) for v in st.gamma_hat] if st is not None else [],
            "gamma_total": float(st.gamma_total) if st is not None else float("nan"),
            **self.reported,
            "em_steps": int(self.info.get("em_steps", 0)),
            "converged": bool(self.info.get("converged", False)),
            **({"initial_scale_factor": float(self.info["initial_scale"]["factor"])}
               if "initial_scale" in self.info else {}),
            **({"initial_sigma2": float(self.info["initial_noise"]["residual"])}
               if "initial_noise" in self.info else {}),
        }

    def draw(self, k: int, generator: torch.Generator | None = None, *,
             batch_size: int | None = None, progress: Callable | None = None,
             cancel: Callable[[], bool] | None = None, stage: str = "predictive") -> Tensor:
        """``k`` fresh zero-mean posterior samples with the fitted hyperparameters, ``[k, d_θ]``.

        Reuses the last E-step's ``θ*`` solution and preconditioner.

        Parameters
        ----------
        k : int
        generator : torch.Generator, optional
            CPU generator. Default seeded with ``options.seed + 1``.
        batch_size : int, optional
            Samples per solver call; progress is reported and ``cancel``
            polled between batches (and inside each solve). Default all at
            once.
        progress : callable, optional
            ``emit_progress(progress, stage, done, k, message)`` after each batch;
            inside a batch, its solver's events with the same ``done`` and ``k``.
        cancel : callable, optional
            Raises :class:`~ctuq.errors.Cancelled` when it returns True.
        stage : str
            Progress stage name. Default ``'predictive'``.
        """
        k = int(k)
        if k < 0:
            raise InputError(f"must be >= 0, got {k}", field="k")
        gen = generator if generator is not None else \
            torch.Generator().manual_seed(self.options.seed + 1)
        if k == 0:
            return self.samples.new_zeros(0, self.likelihood.num_params)
        step = k if batch_size is None else max(1, int(batch_size))
        parts, done = [], 0
        self.draw_info = []
        while done < k:
            check_cancel(cancel, "posterior sampling")
            m = min(step, k - done)
            # fresh draws; the last E-step's θ* solution and preconditioner carry over
            res = self.sampler.sample(self.likelihood, self.prior, self.noise_var, m,
                                      generator=gen, warm_start=self.sample_state,
                                      redraw=True, cancel=cancel,
                                      progress=relay(progress, stage, done, k,
                                                     f"{done}/{k} posterior samples; "))
            parts.append(res.z)
            self.draw_info.append(res.info)
            if self.sample_state is None:
                # a posterior without an E-step of its own (ctuq.recon.tv_curvature's):
                # the first draw's preconditioner serves the later ones
                self.sample_state = res
            done += m
            emit_progress(progress, stage, done, k, f"{done}/{k} posterior samples")
        return torch.cat(parts)

    def summary(self) -> dict:
        """Hyperparameters, trace, info and options, JSON-able (result files, benchmarks)."""
        info = {k: v for k, v in self.info.items() if k != "sampler"}
        sampler_opts = getattr(self.sampler, "options", None)
        return {"hyperparameters": self.hyperparameters(), "trace": self.trace, "info": info,
                "options": {"em": dataclasses.asdict(self.options),
                            "sampler": {"method": getattr(self.sampler, "method", "?"),
                                        **(dataclasses.asdict(sampler_opts)
                                           if dataclasses.is_dataclass(sampler_opts)
                                           else {})}}}


# ------------------------------------------------------------------------------
# the loop


def fit_hyperparameters(likelihood, prior: GaussianPrior, noise_var: float, sampler,
                        options: EMOptions | None = None, *,
                        hyperprior: Hyperprior | None = None, mstep: Callable | None = None,
                        generator: torch.Generator | None = None,
                        before_estep: Callable[[GaussianPrior], None] | None = None,
                        progress: Callable | None = None,
                        cancel: Callable[[], bool] | None = None) -> FittedPosterior:
    """Fit the prior (and noise) hyperparameters by sample-based EM / MacKay updates.

    Parameters
    ----------
    likelihood : Likelihood
    prior : GaussianPrior
        The initial hyperparameters; updated in place.
    noise_var : float
        Initial ``σ²`` (kept when ``options.learn_noise`` is False; 1 for a
        likelihood without a noise parameter).
    sampler
        Any object with the ``sample`` method of
        :class:`~ctuq.posterior.samples.Sampler`.
    options : EMOptions, optional
        Default ``EMOptions()``.
    hyperprior : Hyperprior, optional
        ``log p(ψ)``, added to the M-step's objective (built by the client).
    mstep : callable, optional
        The M-step; default :func:`~ctuq.posterior.mstep.closed_form_mstep`
        (any callable with its signature).
    generator : torch.Generator, optional
        CPU generator of the E-steps' draws. Default seeded with ``options.seed``.
    before_estep : callable, optional
        ``before_estep(prior)`` before every E-step (e.g. to move the
        likelihood's mode to the linear model's MAP under the current prior).
    progress : callable, optional
        Gets ``emit_progress(progress, "em", step, total, message)`` after
        every E-/M-step, and during an E-step its Nyström sketch and CG
        iterations as ``("em", step, total, "E-step <step>: …")``.
    cancel : callable, optional
        Checked between steps and inside the solves.

    Returns
    -------
    FittedPosterior

    Raises
    ------
    InputError
        Bad noise variance or options.
    CtuqError
        The sampler diverged.
    Cancelled
        When ``cancel()`` returned True.
    """
    opts = options if options is not None else EMOptions()
    mstep = mstep if mstep is not None else closed_form_mstep
    t_start = time.perf_counter()
    sigma2 = float(noise_var)
    if not (math.isfinite(sigma2) and sigma2 > 0):
        raise InputError(f"must be a positive number, got {noise_var!r}", field="noise_var")
    if opts.learn_noise and likelihood.target is None:
        raise InputError("this likelihood has no noise variance to learn", field="learn_noise")
    gen = generator if generator is not None else torch.Generator().manual_seed(opts.seed)
    d_y = likelihood.d_obs
    learn_l = opts.learn_lengthscales and prior.learns_lengthscale
    adam_params = hyperprior.parameters() if hyperprior is not None else (
        [prior.log_l] if learn_l else [])

    a0, l0 = prior_lists(prior)
    weight = float(getattr(hyperprior, "weight", 0.0)) if hyperprior is not None else 0.0
    info = {"initial": {"a_b": a0, "l_b": l0, "sigma2": sigma2}, "hyperprior_weight": weight,
            "converged": False, "em_steps": 0}
    log.info("evidence: prior %s (%d blocks, d=%d), sampler %s, k=%d, <= %d EM steps, "
             "update %s, learn noise %s, hyperprior %s",
             getattr(prior, "name", type(prior).__name__), prior.num_blocks, prior.num_params,
             getattr(sampler, "method", type(sampler).__name__), opts.n_samples, opts.em_steps,
             opts.update, opts.learn_noise,
             f"weight {weight:.3g}" if hyperprior is not None else "off")

    if opts.initial_noise == "residual":
        if opts.learn_noise:
            sigma2 = _noise_from_residual(likelihood, sigma2, info)
        else:
            log.info("initial_noise 'residual' ignored: the noise variance is not learned")
    start_pc = None
    if opts.initial_scale == "sketch":
        start_pc = _scale_from_sketch(likelihood, prior, sigma2, sampler, gen, info,
                                      relay(progress, "em", 0, opts.em_steps + 1,
                                            "E-step 0: "), cancel)
    free = _free_mask(prior, opts.learn_noise, learn_l)
    trace: list[dict] = []
    sample: PosteriorSample | None = None
    stats: EStepStats | None = None
    total = opts.em_steps + 1
    converged = False
    calm = 0  # consecutive M-steps that moved no counted hyperparameter by em_tol
    mixer = AndersonMixer() if opts.acceleration == "anderson" else None
    mixed_mask = None  # the counted entries the mixer's history is of
    unmixed = None  # the plain M-step's point while the next E-step runs at a mixed one
    step = -1
    while step < total - 1:
        step += 1
        check_cancel(cancel, "hyperparameter fit")
        t0 = time.perf_counter()
        if before_estep is not None:
            before_estep(prior)
        # the E-step's sketch and CG iterations show as "em" events of this step
        previous = sample
        sample = sampler.sample(likelihood, prior, sigma2, opts.n_samples, generator=gen,
                                warm_start=sample, redraw=opts.redraw, cancel=cancel,
                                start_preconditioner=start_pc if step == 0 else None,
                                progress=relay(progress, "em", step, total, f"E-step {step}: "))
        if unmixed is not None and not bool(sample.info.get("converged", True)):
            # the guard: a mixed point whose solves stall is rejected; the E-step runs again
            # at the plain M-step's point (one E-step more) and the mixing stops
            a_cur, l_cur = prior_lists(prior)
            trace.append({"step": step, "a_b": a_cur, "l_b": l_cur, "sigma2": sigma2,
                          "rejected": True, "change": None, **_solve_record(sample),
                          "seconds": time.perf_counter() - t0})
            log.warning("EM step %d: the Anderson-mixed hyperparameters left the E-step's "
                        "solves above their tolerance (largest residual %.3g): rejected; "
                        "the E-step runs again at the plain update, without mixing",
                        step, trace[-1]["solver_residual"] or float("nan"))
            sigma2 = _set_full_vector(prior, unmixed)
            sample, mixer, unmixed, total = previous, None, None, total + 1
            info["acceleration_rejected"] = step
            continue
        unmixed = None
        _check_finite(sample, step)
        mode = sample.theta_star if sample.theta_star is not None else likelihood.mode
        stats = estep_statistics(likelihood, prior, sigma2, mode, sample.z,
                                 opts.gamma_estimator, sample.theta0, sample.data_residual)
        a_cur, l_cur = prior_lists(prior)
        entry = {
            "step": step, "a_b": a_cur, "l_b": l_cur, "sigma2": sigma2,
            "gamma_hat": [float(v) for v in stats.gamma_hat],
            "gamma_hat_se": [float(v) for v in stats.gamma_hat_se],
            "gamma_total": stats.gamma_total, "gamma_total_se": stats.gamma_total_se,
            "residual_norm": stats.residual_norm, **_solve_record(sample),
            "change": None, "log_hyperprior": None,
        }
        last = converged or step == total - 1
        if not last:
            check_cancel(cancel, "hyperparameter fit")
            x_old = _full_vector(prior, sigma2)[free]
            sigma2_before = sigma2
            sigma2, extra = mstep(prior, stats, mode, sample.z, sigma2, update=opts.update,
                                  learn_noise=opts.learn_noise, d_y=d_y, params=adam_params,
                                  hyperprior=hyperprior, steps=opts.mstep_steps,
                                  lr=opts.mstep_lr, cancel=cancel)
            entry.update(extra)
            if opts.learn_noise and not entry["solver_converged"] and sigma2 < sigma2_before:
                # an unconverged solve's mode can understate the misfit (a textured 64²
                # scan at I0 1e5: residual norm 0.0013 against 8.8 converged, and σ² fell
                # to its bound in one step, every later solve stalling; docs/dip.md §10):
                # it may raise σ² (a σ² too small stalls the solves), never lower it
                entry["noise_held"] = True
                log.warning("EM step %d: the solves stopped above their tolerance (largest "
                            "residual %.3g); the noise variance is kept at %.4g, not lowered "
                            "to %.4g", step, entry["solver_residual"] or float("nan"),
                            sigma2_before, sigma2)
                sigma2 = sigma2_before
            full = _full_vector(prior, sigma2)
            residual = full[free] - x_old  # fixed-point residual
            counted = _counted(free, stats.gamma_hat >= opts.inactive_gamma)
            entry["change"] = float(residual[counted].abs().max()) if bool(counted.any()) \
                else 0.0
            calm = calm + 1 if entry["change"] < opts.em_tol else 0
            converged = calm >= opts.em_patience
            info["em_steps"] = step + 1
            if mixer is not None and not converged and bool(counted.any()):
                if mixed_mask is None or not torch.equal(mixed_mask, counted):
                    mixer.reset()
                    mixed_mask = counted.clone()
                x_next = full[free]  # the M-step's result (a copy), mixed where counted
                x_next[counted] = mixer.step(x_old[counted], x_next[counted])
                if mixer.mixed:
                    unmixed = full.clone()
                    full[free] = x_next
                    sigma2 = _set_full_vector(prior, full)
                entry["accelerated"] = mixer.mixed
        entry["seconds"] = time.perf_counter() - t0
        trace.append(entry)
        gamma = stats.gamma_total if math.isfinite(stats.gamma_total) else \
            float(stats.gamma_hat.sum())
        emit_progress(progress, "em", step + 1, total,
                      f"EM step {step}: γ̂={gamma:.1f}, σ²={entry['sigma2']:.3g}"
                      + (f", ‖ỹ−Φθ*‖={stats.residual_norm:.3g}"
                         if likelihood.target is not None else "")
                      + (f", Δ={entry['change']:.3g}" if entry["change"] is not None else ""))
        log.info("EM step %d: gamma %.2f, sigma2 %.4g, residual %.4g, change %s, %.2f s",
                 step, gamma, entry["sigma2"], stats.residual_norm, entry["change"],
                 entry["seconds"])
        if last:
            break
    if len(trace) < total:  # stopped early: close the progress bar
        emit_progress(progress, "em", total, total,
                      f"converged after {info['em_steps']} EM steps")
    info["converged"] = converged
    info["seconds"] = time.perf_counter() - t_start
    info["sampler"] = {k: v for k, v in sample.info.items() if not torch.is_tensor(v)}
    mode = sample.theta_star if sample.theta_star is not None else likelihood.mode
    return FittedPosterior(likelihood=likelihood, prior=prior, noise_var=sigma2,
                           theta_star=mode.detach(), samples=sample.z.detach(), trace=trace,
                           options=opts, sampler=sampler, info=info, sample_state=sample,
                           stats=stats)
