"""Variational learning with IVON: train a network, read and sample its weight posterior.

IVON (improved variational online Newton; Shen et al., ICML 2024) learns a
diagonal Gaussian ``q(θ) = N(m, diag(v))`` over the weights at about Adam's
cost. We use its authors' implementation, ``ivon-opt`` (``ivon.IVON``); this
module holds the task-independent pieces that the classifier
(:mod:`ctuq.classify.ivon`) and the CT reconstruction (:mod:`ctuq.recon.ivon_dip`)
share. docs/ivon.md derives the statements below from ``ivon-opt`` 0.1.3's code.

What IVON optimises
    With a loss ``ℓ̄(θ)`` that is a **mean over N data points** (e.g. the mean
    negative log-likelihood per example), ``ess = λ`` and ``weight_decay = δ``,
    IVON seeks the stationary point of

        E_q[ℓ̄(θ)] + λ⁻¹ KL(q ‖ N(0, (λδ)⁻¹ I)),

    i.e. ``q`` is the mean-field Gaussian (variational) approximation of

        p(θ | D) ∝ exp(−λ ℓ̄(θ)) · N(θ; 0, (λδ)⁻¹ I).

    Its fixed points are ``E_q[∇ℓ̄] + δ m = 0`` (the mean) and
    ``h = E_q[diag ∇²ℓ̄]`` (the ``hess`` buffer, estimated by Price's theorem
    from ``(θ − m) · ∇ℓ̄(θ)``), and the variance is

        v = 1 / (λ (h + δ)).

    So ``ess = N`` with ``ℓ̄ = Σ_i nll_i / N`` is the Bayesian posterior with
    prior precision ``α = λ δ`` (``δ = α / N``); ``ess = N / T`` tempers the
    likelihood by ``1/T`` (``δ = α T / N`` keeps the prior). See
    :meth:`IVONSettings.for_posterior`.
Other settings (``ivon.IVON`` arguments)
    ``hess_init`` ``h₀``: the initial ``h``, hence the initial variance
    ``1/(λ(h₀+δ))``; with ``rescale_lr`` (always on here) the step is
    ``lr (h₀+δ) (m̂ + δ m)/(h + δ)``, so ``lr`` is an SGD step size while
    ``h ≈ h₀`` and a fraction ``lr·h₀`` of a Newton step once ``h`` is the
    curvature. ``beta1``: momentum of the gradient (debiased). ``beta2``:
    exponential averaging of the Hessian estimate (time constant
    ``1/(1−β₂)`` steps; the library default 0.99999 suits long training, a
    few-thousand-step fit needs ~0.999). ``mc_samples``: weight samples (and
    loss/gradient evaluations) per step. ``clip_radius``: element-wise clip
    of the preconditioned step ``(m̂ + δ m)/(h + δ)`` (default ∞).

Examples
--------
>>> import torch
>>> net = torch.nn.Linear(3, 1)
>>> x, y = torch.randn(64, 3), torch.randn(64, 1)
>>> s = IVONSettings.for_posterior(n_data=64, prior_precision=1.0, lr=0.05)
>>> fit = train_ivon(net, lambda step: (net(x) - y).square().mean() / 2, s, steps=20)
>>> fit.posterior.mean.shape, bool((fit.posterior.variance > 0).all())
(torch.Size([4]), True)
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable

import torch
from torch import Tensor, nn

from ctuq.errors import Cancelled, InputError

__all__ = ["IVONSettings", "DiagonalGaussian", "IVONFit", "make_ivon", "train_ivon",
           "posterior_of", "weights_set_to", "evaluate_under_samples", "lr_factor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IVONSettings:
    """Hyperparameters of ``ivon.IVON`` (names and meaning as in ``ivon-opt``).

    Parameters
    ----------
    ess : float
        Effective sample size ``λ`` (> 0): the loss is a mean over data points
        and ``λ`` multiplies it in the posterior (module docstring).
    lr : float
        Peak learning rate (rescaled by ``hess_init + weight_decay`` inside
        IVON). Default 0.1.
    hess_init : float
        Initial Hessian estimate ``h₀`` (> 0), in units of the mean loss's
        curvature. Default 1.
    weight_decay : float
        ``δ`` (>= 0); the prior precision is ``ess · weight_decay``. Default 1e-4.
    beta1 : float
        Gradient momentum. Default 0.9.
    beta2 : float
        Hessian averaging. Default 0.999 (library default 0.99999 is for
        long training runs).
    mc_samples : int
        Weight samples per step. Default 1.
    clip_radius : float
        Element-wise clip of the preconditioned step. Default ``inf``.
    hess_approx : {'price', 'gradsq'}
        Hessian estimator (``'price'``: the reparametrisation estimator of
        the paper; ``'gradsq'``: squared gradients). Default ``'price'``.
    """

    ess: float
    lr: float = 0.1
    hess_init: float = 1.0
    weight_decay: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.999
    mc_samples: int = 1
    clip_radius: float = math.inf
    hess_approx: str = "price"

    def __post_init__(self):
        checks = {
            "ess": math.isfinite(self.ess) and self.ess > 0,
            "lr": math.isfinite(self.lr) and self.lr > 0,
            "hess_init": math.isfinite(self.hess_init) and self.hess_init > 0,
            "weight_decay": math.isfinite(self.weight_decay) and self.weight_decay >= 0,
            "beta1": 0.0 <= self.beta1 < 1.0,
            "beta2": 0.0 <= self.beta2 < 1.0,
            "mc_samples": int(self.mc_samples) == self.mc_samples and self.mc_samples >= 1,
            "clip_radius": self.clip_radius > 0,
            "hess_approx": self.hess_approx in ("price", "gradsq"),
        }
        for name, ok in checks.items():
            if not ok:
                raise InputError(f"invalid value {getattr(self, name)!r}", field=name)

    @classmethod
    def for_posterior(cls, n_data: float, prior_precision: float, temperature: float = 1.0,
                      **changes) -> "IVONSettings":
        """Settings whose ``q`` approximates ``exp(−(N/T) ℓ̄) · N(0, α⁻¹ I)``.

        Parameters
        ----------
        n_data : float
            ``N``, the number of terms the mean loss ``ℓ̄`` averages over.
        prior_precision : float
            ``α`` (> 0) of the isotropic Gaussian prior on the weights.
        temperature : float
            ``T`` (> 0) of the data term: ``ess = N / T``; the prior is not
            tempered (``weight_decay = α T / N``). Default 1 (the Bayesian
            posterior).
        **changes
            Any other field (``lr``, ``hess_init``, ...).
        """
        if not (n_data > 0 and prior_precision > 0 and temperature > 0):
            raise InputError("n_data, prior_precision and temperature must be > 0",
                             field="temperature")
        ess = float(n_data) / float(temperature)
        return cls(ess=ess, weight_decay=float(prior_precision) / ess, **changes)

    @property
    def prior_precision(self) -> float:
        """``α = ess · weight_decay``."""
        return self.ess * self.weight_decay

    def with_(self, **changes) -> "IVONSettings":
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain dict (``clip_radius = inf`` as the string ``'inf'``, JSON-safe)."""
        d = asdict(self)
        if math.isinf(d["clip_radius"]):
            d["clip_radius"] = "inf"
        d["prior_precision"] = self.prior_precision
        return d


@dataclass
class DiagonalGaussian:
    """A diagonal Gaussian over a module's trainable parameters (flattened in ``parameters()`` order).

    Attributes
    ----------
    mean : Tensor, shape (P,)
    variance : Tensor, shape (P,)
    """

    mean: Tensor
    variance: Tensor

    @property
    def std(self) -> Tensor:
        return self.variance.sqrt()

    def sample(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """``k`` draws ``m + √v ε``, ``[k, P]`` (``generator`` on the CPU; moved to the mean's device)."""
        eps = torch.randn(int(k), self.mean.numel(), generator=generator,
                          dtype=self.mean.dtype)
        return self.mean + self.std * eps.to(self.mean.device)


@dataclass
class IVONFit:
    """Outcome of :func:`train_ivon`.

    Attributes
    ----------
    optimizer : ivon.IVON
        The optimiser (holds ``hess``; ``optimizer.sampled_params()`` draws).
    posterior : DiagonalGaussian
        ``q`` at the end of training (:func:`posterior_of`).
    loss_history : ndarray, shape (steps,)
        The sampled-weight loss of every step (mean over ``mc_samples``).
    settings : IVONSettings
    steps : int
    seconds : float
    """

    optimizer: object
    posterior: DiagonalGaussian
    loss_history: object
    settings: IVONSettings
    steps: int
    seconds: float


def _trainable(params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
    return [p for p in params if p.requires_grad]


def make_ivon(params: Iterable[nn.Parameter], settings: IVONSettings):
    """An ``ivon.IVON`` over ``params`` with ``settings`` (``rescale_lr`` and ``debias`` on)."""
    import ivon

    params = _trainable(params)
    if not params:
        raise InputError("no trainable parameters", field="model")
    return ivon.IVON(params, lr=settings.lr, ess=settings.ess, hess_init=settings.hess_init,
                     beta1=settings.beta1, beta2=settings.beta2,
                     weight_decay=settings.weight_decay, mc_samples=int(settings.mc_samples),
                     hess_approx=settings.hess_approx, clip_radius=settings.clip_radius)


def posterior_of(optimizer) -> DiagonalGaussian:
    """The current ``q`` of an ``ivon.IVON``: mean = the parameters, variance ``1/(ess (hess + δ))``.

    Call it outside ``sampled_params()`` (inside, the parameters hold a sample).
    """
    means, variances = [], []
    for group in optimizer.param_groups:
        means += [p.detach().reshape(-1) for p in group["params"] if p is not None]
        variances.append(1.0 / (group["ess"] * (group["hess"] + group["weight_decay"])))
    return DiagonalGaussian(torch.cat(means).clone(), torch.cat(variances).detach().clone())


@contextlib.contextmanager
def weights_set_to(params: list[nn.Parameter], flat: Tensor):
    """Temporarily load the flat vector ``flat`` into ``params`` (restored on exit)."""
    saved = [p.detach().clone() for p in params]
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    if offset != flat.numel():
        raise InputError(f"{flat.numel()} values for {offset} parameters", field="weights")
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


def lr_factor(steps: int, schedule: str = "cosine", min_factor: float = 0.0,
              warmup: int = 0) -> Callable[[int], float]:
    """Learning-rate multiplier per step: linear warm-up, then cosine decay to ``min_factor`` or constant."""
    if schedule not in ("cosine", "constant"):
        raise InputError(f"must be 'cosine' or 'constant', got {schedule!r}",
                         field="lr_schedule")
    n, warm = int(steps), int(warmup)

    def factor(i: int) -> float:
        if warm > 0 and i < warm:
            return (i + 1) / warm
        if schedule == "constant":
            return 1.0
        t = min(1.0, (i - warm) / max(1, n - warm))
        return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * t))

    return factor


def train_ivon(model: nn.Module, loss_fn: Callable[[int], Tensor], settings: IVONSettings,
               steps: int, *, lr_schedule: str = "cosine", lr_min_factor: float = 0.0,
               warmup: int = 0, seed: int = 0, params: list[nn.Parameter] | None = None,
               on_step: Callable[[int, float], None] | None = None,
               cancel: Callable[[], bool] | None = None) -> IVONFit:
    """Train ``model`` in place with IVON for ``steps`` steps.

    Parameters
    ----------
    model : nn.Module
        Put in train mode for the fit (dropout, if any, active) and left in
        eval mode with the **posterior mean** weights loaded.
    loss_fn : callable
        ``loss_fn(step) -> scalar Tensor``: the mean loss ``ℓ̄`` (of a mini-batch
        chosen by ``step``, or of all the data) at the model's current
        weights; called ``mc_samples`` times per step, each time under a new
        weight sample. Any regulariser other than the Gaussian prior
        (``weight_decay``) belongs in it.
    settings : IVONSettings
    steps : int
        Optimiser steps (>= 1).
    lr_schedule, lr_min_factor, warmup
        See :func:`lr_factor`. Default: cosine decay to 0, no warm-up.
    seed : int
        Seeds the weight samples (and anything random in ``loss_fn``) through
        a forked global RNG; the caller's RNG state is restored.
    params : list of Parameter, optional
        The parameters with a posterior; default all trainable parameters.
    on_step : callable, optional
        ``on_step(step, loss)`` after every step (progress, best-iterate
        tracking); runs at the posterior-mean weights.
    cancel : callable, optional
        Checked before every step; returning True raises
        :class:`~ctuq.errors.Cancelled`.

    Returns
    -------
    IVONFit
    """
    import numpy as np

    steps = int(steps)
    if steps < 1:
        raise InputError(f"must be >= 1, got {steps}", field="iterations")
    t0 = time.perf_counter()
    params = _trainable(model.parameters()) if params is None else params
    opt = make_ivon(params, settings)
    factor = lr_factor(steps, lr_schedule, lr_min_factor, warmup)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    history = np.zeros(steps)
    dev = params[0].device
    model.train()
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(int(seed))
        for i in range(steps):
            if cancel is not None and cancel():
                raise Cancelled(f"IVON training cancelled at step {i} of {steps}")
            total = 0.0
            for _ in range(int(settings.mc_samples)):
                with opt.sampled_params(train=True):
                    opt.zero_grad(set_to_none=False)
                    loss = loss_fn(i)
                    loss.backward()
                total += float(loss.detach())
            history[i] = total / int(settings.mc_samples)
            if not math.isfinite(history[i]):
                raise InputError(f"IVON loss is not finite at step {i} (lower lr or raise "
                                 f"hess_init)", field="lr")
            opt.step()
            sched.step()
            if on_step is not None:
                on_step(i, history[i])
    model.eval()
    seconds = time.perf_counter() - t0
    log.info("IVON: %d steps in %.1f s, final loss %.5g", steps, seconds, history[-1])
    return IVONFit(optimizer=opt, posterior=posterior_of(opt), loss_history=history,
                   settings=settings, steps=steps, seconds=seconds)


@torch.no_grad()
def evaluate_under_samples(model: nn.Module, posterior: DiagonalGaussian,
                           fn: Callable[[nn.Module], Tensor], n_samples: int, *,
                           seed: int = 0, params: list[nn.Parameter] | None = None
                           ) -> Tensor:
    """``fn(model)`` under ``n_samples`` weight draws from ``posterior``, stacked ``[n_samples, ...]``.

    Parameters
    ----------
    model : nn.Module
        Its trainable parameters (or ``params``) receive each draw in turn and
        are restored afterwards; the mode (train/eval) is left to the caller.
    posterior : DiagonalGaussian
    fn : callable
        ``fn(model) -> Tensor`` (e.g. the logits of a batch, the image).
    n_samples : int
        Number of draws (>= 1).
    seed : int
        Seed of the draws (a private CPU generator: reproducible, the global
        RNG untouched).
    params : list of Parameter, optional
        Default all trainable parameters of ``model``.
    """
    if int(n_samples) < 1:
        raise InputError(f"must be >= 1, got {n_samples}", field="n_samples")
    params = _trainable(model.parameters()) if params is None else params
    gen = torch.Generator().manual_seed(int(seed))
    outs = []
    for _ in range(int(n_samples)):
        theta = posterior.sample(1, gen)[0]
        with weights_set_to(params, theta):
            outs.append(fn(model))
    return torch.stack(outs)
