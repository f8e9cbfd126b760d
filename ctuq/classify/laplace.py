"""The classification client of the posterior engine: linearised Laplace for classifiers (docs/method.md §3, §11).

The engine of the CT pipeline (linearise, sample by optimisation, tune the
prior by MacKay / EM) applied to a classifier ``f(x, θ)`` with logits
``[N, C]`` and a categorical likelihood
(:class:`~ctuq.posterior.categorical.CategoricalLikelihood`: ``Φ = B J`` with
``Λ_n = B_nᵀ B_n`` the softmax Hessian, no noise parameter).

Model
    MAP weights ``θ̂`` (:func:`~ctuq.classify.training.train_map`). The
    posterior is the post-hoc Laplace ``N(θ̂, H⁻¹)``, ``H = G + Σ⁻¹`` with the
    GGN ``G = Σ_n J_nᵀ Λ_n J_n`` (the network is not retrained when the prior
    changes); optionally (``fit_prior(mode='linear')``) it is centred on the
    linearised model's own MAP ``θ*`` (:func:`linear_mode`), with the GGN
    taken at ``θ*``.
Prior
    :class:`~ctuq.posterior.priors.BlockPrior` ``kind='iso'`` with one block
    per layer (layer-wise ARD: weights and bias of a layer share ``a_b``), or
    the g-prior :class:`~ctuq.posterior.priors.GPrior` with
    ``s_i = (diag(G)_i / N)^{-1/2}`` (:func:`gprior_for`).
Samples (:func:`sample_sto`)
    the engine's sample-then-optimise sampler with the classifiers' settings
    :data:`CLASSIFIER_STO`, optionally mini-batched over data points.
Evidence (:func:`fit_prior`)
    the Laplace evidence at fixed ``θ̂``,
    ``log p(D) ≈ log p(D | θ̂) − ½ θ̂ᵀ Σ⁻¹ θ̂ − ½ log|Σ| − ½ log|H|``,
    is stationary in ``a_b`` where ``a_b = ‖θ̂_b‖²_{C_b⁻¹} / γ_b`` (MacKay) or
    ``a_b d_b = ‖θ̂_b‖²_{C_b⁻¹} + Tr(C_b⁻¹ H⁻¹_{bb})`` (EM): the engine's EM
    loop (:func:`ctuq.posterior.em.fit_hyperparameters`) with the traces from
    samples.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ctuq.errors import InputError
from ctuq.posterior.prior_kinds import PRIORS as PRIOR_REGISTRY
from ctuq.posterior.prior_kinds import prior_kind
from ctuq.posterior import (BlockPrior, CategoricalLikelihood, ClassifierLinearization,
                            EMOptions, FittedPosterior, GaussianPrior, GPrior, PosteriorSample,
                            STOOptions, STOSampler, fit_hyperparameters, select_parameters)

__all__ = ["PRIORS", "CLASSIFIER_STO", "last_layer_filter", "gprior_for", "build_prior",
           "sample_sto", "fit_prior", "linear_mode", "linear_logits"]

#: Priors of :func:`build_prior` (:data:`ctuq.posterior.prior_kinds.PRIORS` offered for
#: classifiers).
PRIORS = tuple(name for name, kind in PRIOR_REGISTRY.items() if kind.classifier)

#: The classifiers' sample-then-optimise settings: at most 300 steps, a rank-100
#: Nyström preconditioner reused while no log prior variance moved by more than 0.05
#: (with 0.5 the digits EM needed up to 300 instead of 15–30 steps after the first
#: update), cold starts at zero. Change fields with ``dataclasses.replace``.
CLASSIFIER_STO = STOOptions(iterations=300, precond_rank=100, reuse_tol=0.05, init="zero")


def last_layer_filter(model: nn.Module):
    """``param_filter`` selecting the parameters of the model's last prior block.

    With the classifiers of :mod:`ctuq.models.classifiers` that is the output
    layer's weight and bias (block ``'out'``): the last-layer Laplace, whose
    Jacobian is the penultimate features ``φ(x)`` (``J(x) = I_C ⊗ [φ(x)ᵀ, 1]``).

    Parameters
    ----------
    model : nn.Module

    Returns
    -------
    callable
        ``(name, parameter) -> bool`` for :class:`ClassifierLinearization`.
    """
    last = set(list(select_parameters(model, "all").values())[-1])
    return lambda name, _p: name in last


def gprior_for(clin: ClassifierLinearization, x: Tensor, probs: Tensor | None = None,
               g: float = 1.0, *, exact: bool | None = None, n_probes: int = 256,
               generator: torch.Generator | None = None, floor: float = 1e-6) -> GPrior:
    """The g-prior ``Σ = g diag(s)²`` with ``s_i = (diag(G)_i / N)^{-1/2}``.

    Parameters
    ----------
    clin, x, probs
        The classifier's linearisation, training inputs ``[N, 1, H, W]`` and
        (optional) probabilities, as for :class:`CategoricalLikelihood`.
    g : float, optional
        Initial ``g``. Default 1.
    exact : bool or None, optional
        Dense per-datum Jacobians (exact) or ``n_probes`` Rademacher probes
        (relative error ≈ ``sqrt(2 / n_probes)`` per entry). Default: exact
        when ``d_θ ≤ 20 000``.
    floor : float, optional
        Entries below ``floor · mean`` are raised to it. Default 1e-6.
    """
    if exact is None:
        exact = clin.num_params <= 20_000
    return GPrior.from_likelihood(CategoricalLikelihood(clin, x, probs), g, n_probes=n_probes,
                                  generator=generator, exact=exact, floor=floor)


def build_prior(clin: ClassifierLinearization, x: Tensor, kind: str = "ard",
                variance: float = 1.0, probs: Tensor | None = None, **kw) -> GaussianPrior:
    """Layer-wise ARD (``'ard'``: isotropic per-layer :class:`BlockPrior`) or ``'gprior'``.

    Parameters
    ----------
    clin : ClassifierLinearization
    x : Tensor
        Training inputs (g-prior scales).
    kind : {'ard', 'gprior'}, optional
        Default ``'ard'``.
    variance : float, optional
        Initial ``a_b`` (or ``g``). Default 1.
    probs : Tensor, optional
    **kw
        Passed to :func:`gprior_for`.
    """
    if kind not in PRIORS:
        raise InputError(f"must be one of {', '.join(PRIORS)}, got {kind!r}", field="prior")
    spec = prior_kind(kind)
    if not spec.uses_likelihood:  # the block layout is all it needs
        return spec.build(clin, variance)
    if kw.get("exact") is None:
        kw["exact"] = clin.num_params <= 20_000
    return spec.build(CategoricalLikelihood(clin, x, probs), variance, **kw)


def sample_sto(clin: ClassifierLinearization, x: Tensor, prior: GaussianPrior, k: int, *,
               probs: Tensor | None = None, options: STOOptions | None = None,
               generator: torch.Generator | None = None,
               warm_start: PosteriorSample | None = None, progress=None, cancel=None,
               stage: str = "sampling") -> PosteriorSample:
    """``k`` posterior samples of the linearised classifier by sample-then-optimise.

    Parameters
    ----------
    clin : ClassifierLinearization
    x : Tensor, shape (N, 1, H, W)
        Training inputs.
    prior : GaussianPrior
        ``N(0, Σ)`` over ``clin``'s parameters.
    k : int
        Number of samples (>= 1).
    probs : Tensor, shape (N, C), optional
        ``softmax f(x, θ̂)`` (computed if not given).
    options : STOOptions, optional
        Default :data:`CLASSIFIER_STO`.
    generator : torch.Generator, optional
        CPU generator of the base draws, mini-batches and sketches. Default seed 0.
    warm_start : PosteriorSample, optional
        A previous result with the same ``k``: its base draws and whitened
        solutions are reused (EM steps), and its preconditioner while the
        prior moved little.
    progress, cancel : callable, optional

    Returns
    -------
    PosteriorSample
        ``z`` (``[k, d_θ]``), ``theta0``, ``info``; ``theta_star`` is None (the
        posterior is centred on ``θ̂``); ``state.anchor`` holds the whitened
        anchors ``wⁿ = u − Lᵀ Jᵀ Bᵀ e``.
    """
    lik = CategoricalLikelihood(clin, x, probs)
    sampler = STOSampler(options if options is not None else CLASSIFIER_STO)
    return sampler.sample(lik, prior, 1.0, k, generator=generator, warm_start=warm_start,
                          progress=progress, cancel=cancel, stage=stage)


def linear_mode(clin: ClassifierLinearization, x: Tensor, y: Tensor, prior: GaussianPrior, *,
                init: Tensor | None = None, max_iter: int = 300, tol: float = 1e-7) -> Tensor:
    """``θ*``: the MAP of the linearised model under ``prior`` (docs/method.md §5).

    Minimises ``Σ_n CE(y_n, f(x_n, θ̂) + J_n (θ − θ̂)) + ½ ‖θ‖²_{Σ⁻¹}`` (convex) by
    L-BFGS in whitened coordinates ``θ = L w``; each evaluation is one JVP and
    one VJP over the training set.

    Parameters
    ----------
    clin : ClassifierLinearization
    x : Tensor, shape (N, 1, H, W)
    y : Tensor, shape (N,)
    prior : GaussianPrior
    init : Tensor, shape (d_θ,), optional
        Starting point (default ``θ̂``).
    max_iter : int, optional
        L-BFGS iterations. Default 300.
    tol : float, optional
        Gradient tolerance (whitened gradient of the objective per data point). Default 1e-7.

    Returns
    -------
    Tensor, shape (d_θ,)
    """
    x = x.to(clin.device)
    f0 = clin.logits(x)
    start = clin.theta_hat if init is None else init.to(clin.device).float()
    with torch.no_grad():
        w0 = prior.cov_sqrt(prior.precision(start.reshape(1, -1)), transpose=True)[0]
    w = w0.clone().requires_grad_(True)
    n = x.shape[0]
    onehot = torch.nn.functional.one_hot(y.to(clin.device), f0.shape[-1]).float()
    opt = torch.optim.LBFGS([w], lr=1, max_iter=max_iter, tolerance_grad=tol,
                            tolerance_change=1e-12, history_size=20,
                            line_search_fn="strong_wolfe")

    def closure():
        with torch.no_grad():
            theta = prior.cov_sqrt(w.detach().reshape(1, -1))
            h = f0 + clin.jvp_at(theta - clin.theta_hat, x)[0]
            logp = torch.log_softmax(h, -1)
            value = -(onehot * logp).sum() + 0.5 * w.detach().square().sum()
            g = clin.vjp_at((logp.exp() - onehot).unsqueeze(0), x)
            grad = prior.cov_sqrt(g, transpose=True)[0] + w.detach()
        w.grad = grad / n
        return value / n

    opt.step(closure)
    with torch.no_grad():
        return prior.cov_sqrt(w.detach().reshape(1, -1))[0]


def linear_logits(clin: ClassifierLinearization, theta: Tensor, x: Tensor) -> Tensor:
    """``f(x, θ̂) + J(x)(θ − θ̂)``, ``[n, C]``."""
    x = x.to(clin.device)
    return torch.cat([clin.logits(x[i:i + clin.data_chunk]) + clin.jvp_at(
        (theta - clin.theta_hat).reshape(1, -1), x[i:i + clin.data_chunk])[0]
        for i in range(0, x.shape[0], clin.data_chunk)])



def fit_prior(clin: ClassifierLinearization, x: Tensor, prior: GaussianPrior, *,
              em_steps: int = 10, k: int = 8, update: str = "mackay",
              probs: Tensor | None = None, options: STOOptions | None = None,
              generator: torch.Generator | None = None, tol: float = 1e-3,
              mode: str = "map", y: Tensor | None = None,
              progress=None, cancel=None) -> FittedPosterior:
    """Tune the prior variances by MacKay / EM updates driven by STO samples.

    The engine's loop (:func:`ctuq.posterior.em.fit_hyperparameters`) on the
    categorical likelihood: E-step ``k`` samples (warm-started with the same
    base draws); statistics ``‖θ̂_b‖²_{C_b⁻¹}``, ``S_b = mean_k
    ‖z_{k,b}‖²_{C_b⁻¹}`` and ``γ̂_b = mean_k ‖θ⁰_{k,b} − z_{k,b}‖²_{Σ_b⁻¹}``;
    M-step MacKay (``a_b ← ‖θ̂_b‖²/γ̂_b``) or EM (``a_b ← (‖θ̂_b‖² + S_b)/d_b``).
    Every block counts for convergence.

    Parameters
    ----------
    clin : ClassifierLinearization
    x : Tensor, shape (N, 1, H, W)
    prior : GaussianPrior
        Updated in place.
    em_steps : int, optional
        Most M-steps. Default 10 (reference).
    k : int, optional
        Samples per E-step. Default 8 (reference).
    update : {'mackay', 'em'}, optional
        Default ``'mackay'``.
    tol : float, optional
        Stop when no ``log a_b`` moves by more than this. Default 1e-3.
    mode : {'map', 'linear'}, optional
        ``'map'`` (default): the mode is the network's ``θ̂`` (post-hoc
        Laplace; the fixed point is the optimum of
        :meth:`~ctuq.classify.exact.ExactLLA.log_evidence`). ``'linear'``:
        every E-step first finds the linearised model's own mode ``θ*`` under
        the current prior (:func:`linear_mode`, warm-started), uses
        ``‖θ*_b‖²`` in the update and the GGN at ``θ*`` (``p_n`` of the
        linearised logits) for the samples.
    y : Tensor, shape (N,), optional
        Training labels (``mode='linear'`` only).
    options, generator, probs, progress, cancel
        As for :func:`sample_sto`.

    Returns
    -------
    FittedPosterior
        ``theta_star`` is the mode (``θ̂``, or ``θ*`` with ``mode='linear'``),
        ``likelihood.probs`` the GGN's ``p_n``, ``samples`` the last E-step's.
    """
    if update not in ("mackay", "em"):
        raise InputError(f"must be 'mackay' or 'em', got {update!r}", field="update")
    if mode not in ("map", "linear"):
        raise InputError(f"must be 'map' or 'linear', got {mode!r}", field="mode")
    if mode == "linear" and y is None:
        raise InputError("mode='linear' needs the training labels", field="y")
    em = EMOptions(n_samples=int(k), em_steps=int(em_steps), em_tol=float(tol), update=update,
                   learn_noise=False, inactive_gamma=0.0)
    lik = CategoricalLikelihood(clin, x, probs)
    found: list[Tensor] = []

    def refresh_mode(prior_: GaussianPrior) -> None:
        # the linear model's MAP under the current prior (warm-started), the GGN there
        theta = linear_mode(clin, x, y, prior_, init=found[-1] if found else None)
        found.append(theta)
        lik.set_mode(theta, torch.softmax(linear_logits(clin, theta, x), -1))

    sampler = STOSampler(options if options is not None else CLASSIFIER_STO)
    return fit_hyperparameters(lik, prior, 1.0, sampler, em, generator=generator,
                               before_estep=refresh_mode if mode == "linear" else None,
                               progress=progress, cancel=cancel)
