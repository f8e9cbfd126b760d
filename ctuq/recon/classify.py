"""Linearised Laplace for image classifiers, with sample-based evidence (METHOD.md §9).

The engine of the CT pipeline (linearise, sample by optimisation, tune the
prior by MacKay / EM) applied to a classifier ``f(x, θ)`` with logits
``[N, C]`` and a categorical likelihood.

Model
    MAP weights ``θ̂`` (:func:`train_map`: Adam on the mean cross-entropy plus
    ``prior_precision / (2N) ‖θ‖²``). The linearised model
    ``h(x, θ) = f(x, θ̂) + J(x)(θ − θ̂)`` (:class:`ClassifierLinearization`,
    a :class:`~ctuq.recon.linearize.Linearization` whose products take the
    input batch as an argument). Its Laplace posterior uses the
    generalised Gauss–Newton matrix of the categorical likelihood,

        H = G + Σ⁻¹,   G = Σ_n J_nᵀ Λ_n J_n,   Λ_n = diag(p_n) − p_n p_nᵀ,

    with ``p_n = softmax f(x_n, θ̂)``; ``Λ_n = B_nᵀ B_n`` with
    ``B_n = diag(√p_n) − √p_n p_nᵀ`` (because ``Σ_c p_c = 1``).
    The posterior mean is ``θ̂`` (post-hoc Laplace: the network is not
    retrained when the prior changes); zero-mean samples ``z ~ N(0, H⁻¹)``
    carry the uncertainty. Optionally (``fit_prior(mode='linear')``) the mode
    is the linearised model's own MAP ``θ*`` (:func:`linear_mode`), with the
    GGN taken at ``θ*``.
Prior
    :class:`~ctuq.recon.priors.BlockPrior` ``kind='iso'`` with one block
    per layer (layer-wise ARD: weights and bias of a layer share ``a_b``), or
    the g-prior :class:`~ctuq.recon.priors.GPrior` with
    ``s_i = (diag(G)_i / N)^{-1/2}`` (:func:`gprior_for`): the columns of the
    per-datum GGN factor normalised to unit mean square.
Samples (:func:`sample_sto`)
    sample-then-optimise with the variance-reduced objective: with base
    draws ``θ⁰ = L u`` (``Σ = L Lᵀ``) and ``ε_n ~ N(0, I_C)``, the sample is

        z = argmin ½ Σ_n ‖B_n J_n z‖² + ½ ‖z − θⁿ‖²_{Σ⁻¹},   θⁿ = θ⁰ + Σ Σ_n J_nᵀ B_nᵀ ε_n,

    i.e. ``z = H⁻¹ (Σ⁻¹ θ⁰ + Jᵀ Bᵀ ε)`` with covariance ``H⁻¹``. It is
    solved in prior-whitened coordinates ``z = L w`` (Hessian
    ``I + Lᵀ G L``) by SGD with Nesterov momentum, gradient clipping,
    linear learning-rate decay and Polyak averaging, optionally mini-batched
    over data points (the data term scaled by ``N/|S|``) and preconditioned
    by the randomised Nyström preconditioner of
    :class:`ctuq.recon.sampling.NystromPreconditioner`.
Evidence (:func:`fit_prior`)
    the Laplace evidence at fixed ``θ̂``,
    ``log p(D) ≈ log p(D | θ̂) − ½ θ̂ᵀ Σ⁻¹ θ̂ − ½ log|Σ| − ½ log|H|``,
    is stationary in ``a_b`` where ``a_b d_b = ‖θ̂_b‖²_{C_b⁻¹} + Tr(C_b⁻¹ H⁻¹_{bb})``
    (EM) or equivalently ``a_b = ‖θ̂_b‖²_{C_b⁻¹} / γ_b`` (MacKay),
    ``γ_b = d_b − Tr(C_b⁻¹ H⁻¹_{bb}) / a_b``: the updates
    :func:`ctuq.recon.evidence.mackay_update` and
    :func:`~ctuq.recon.evidence.em_update` of the CT engine, with the traces
    from samples. ``γ̂_b = mean_k ‖θ⁰_{k,b} − z_{k,b}‖²_{Σ_b⁻¹}`` (the
    'matheron' estimator: ``θ⁰ − z = Σ Φᵀ K⁻¹ r`` with ``Φ = B J``,
    ``r ~ N(0, K)``, exactly as for CT with ``σ² = 1``).
Predictive
    Monte Carlo over linearised logits ``f(x, θ̂) + J(x) z_s``
    (:func:`mc_predictive`) or the probit approximation
    ``softmax(f / sqrt(1 + π/8 · diag Σ(x)))`` (:func:`probit_predictive`),
    ``Σ(x) = J(x) H⁻¹ J(x)ᵀ``. Optionally the spread is rescaled,
    ``f + t · J(x) z_s``, with ``t`` tuned on held-out data
    (:func:`tune_predictive_scale`; covariance ``t² H⁻¹``, no new samples).
Baselines
    :class:`ExactLLA` (dense float64 full-GGN Laplace, prior by L-BFGS on the
    exact Laplace evidence; models up to a few thousand parameters; with
    :func:`tune_prior_scale` the prior precision multiplied by a ``c`` tuned on
    held-out data, the Laplace tutorials' recipe), :func:`mc_dropout_predict`,
    temperature scaling (:func:`tune_temperature`) and :func:`laplace_torch_available` /
    :func:`laplace_torch_fit` (laplace-torch, only if it imports).
"""

from __future__ import annotations

import copy
import logging
import math
import time
import warnings
from dataclasses import dataclass, field

import torch
from scipy.optimize import minimize_scalar
from torch import Tensor, nn
from torch.func import jacrev, jvp, vjp

from ctuq.errors import InputError
from ctuq.recon.evidence import em_update, mackay_update
from ctuq.recon.linearize import Linearization
from ctuq.recon.priors import BlockPrior, GaussianPrior, GPrior
from ctuq.recon.progress import check_cancel, emit_progress
from ctuq.recon.sampling import NystromPreconditioner, _nesterov_polyak, _step_curvature

__all__ = [
    "train_map", "ClassifierLinearization", "lambda_mul", "b_mul", "bt_mul", "build_prior",
    "gprior_for", "STOOptions", "ClassifierSample", "sample_sto", "EMResult", "fit_prior",
    "linear_mode", "linear_logits", "last_layer_filter",
    "mc_predictive", "scaled_mc_predictive", "scaled_predictive_nll", "tune_predictive_scale",
    "tune_temperature", "gaussian_deviations", "scaled_prior_covariance", "tune_prior_scale",
    "probit_predictive", "gaussian_mc_predictive", "function_samples",
    "sample_function_variance", "ExactLLA", "mc_dropout_predict", "laplace_torch_available",
    "laplace_torch_fit", "PRIORS",
]

log = logging.getLogger(__name__)

#: Priors of :func:`build_prior`.
PRIORS = ("ard", "gprior")


# ------------------------------------------------------------------------------
# MAP training


def train_map(model: nn.Module, x: Tensor, y: Tensor, *, epochs: int = 150,
              lr: float = 3e-3, batch_size: int = 64, prior_precision: float = 1.0,
              seed: int = 0, progress=None, cancel=None) -> dict:
    """Fit ``model`` in place by Adam on ``mean CE + prior_precision/(2N) ‖θ‖²``.

    Parameters
    ----------
    model : nn.Module
        Images ``[N, 1, H, W]`` → logits ``[N, C]``; dropout, if any, is
        active during training.
    x : Tensor, shape (N, 1, H, W)
    y : Tensor, shape (N,)
    epochs : int, optional
        Default 150.
    lr : float, optional
        Peak learning rate, cosine-decayed to 0. Default 3e-3.
    batch_size : int, optional
        Default 64.
    prior_precision : float, optional
        Isotropic Gaussian prior precision on all parameters during training
        (weight decay ``prior_precision / N`` on the mean loss). Default 1.
    seed : int, optional
        Seeds the mini-batch order and dropout masks. Default 0.
    progress, cancel : callable, optional
        Stage ``'train'``, one step per epoch.

    Returns
    -------
    dict
        ``loss`` (per-epoch mean training objective), ``seconds``.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0 or prior_precision < 0:
        raise InputError("epochs, batch_size and lr must be positive, prior_precision >= 0",
                         field="train")
    gen = torch.Generator().manual_seed(int(seed))
    n = x.shape[0]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * math.ceil(n / batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    wd = prior_precision / n
    history, t0 = [], time.perf_counter()
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        for ep in range(epochs):
            check_cancel(cancel, "training")
            perm = torch.randperm(n, generator=gen)
            total = 0.0
            for i in range(0, n, batch_size):
                idx = perm[i:i + batch_size]
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
                reg = 0.5 * wd * sum(p.square().sum() for p in model.parameters())
                opt.zero_grad()
                (loss + reg).backward()
                opt.step()
                sched.step()
                total += float((loss + reg).detach()) * idx.numel()
            history.append(total / n)
            emit_progress(progress, "train", ep + 1, epochs, f"loss {history[-1]:.4f}")
    model.eval()
    return {"loss": history, "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------
# the linearisation


class ClassifierLinearization(Linearization):
    """Jacobian products of a classifier at its MAP weights, for any input batch.

    A :class:`~ctuq.recon.linearize.Linearization` over all trainable
    parameters (default ``param_filter='all'``, one prior block per layer via
    the model's ``blocks()``) or a subset of them, whose products take the
    inputs as an argument.

    Parameters
    ----------
    model : nn.Module
        The trained classifier (put in eval mode: dropout off).
    example_input : Tensor, shape (n, 1, H, W)
        Any input batch of the right shape (only its first image is used to
        fix the layout).
    param_filter : 'all' or callable, optional
        Which parameters are linearised (the rest stay fixed at the MAP):
        ``'all'`` (default) or ``(name, parameter) -> bool``, e.g.
        :func:`last_layer_filter` for the last-layer Laplace.
    chunk_size : int or None, optional
        Most vectors per ``vmap``-ed product. Default None (all).
    data_chunk : int, optional
        Most inputs per network call in :meth:`logits`, :meth:`jacobian` and
        the full-data products of :func:`sample_sto`. Default 2048.

    Attributes
    ----------
    num_classes : int
        ``C``.
    """

    def __init__(self, model: nn.Module, example_input: Tensor, *, param_filter="all",
                 chunk_size: int | None = None, data_chunk: int = 2048):
        super().__init__(model, example_input[:1], param_filter=param_filter,
                         chunk_size=chunk_size)
        self.num_classes = int(self.out_shape[-1])
        self.data_chunk = max(1, int(data_chunk))

    def _fn(self, x: Tensor, fixed=None):
        return lambda th: self._f_raw(th, fixed, x)

    @torch.no_grad()
    def logits(self, x: Tensor) -> Tensor:
        """``f(x, θ̂)``, ``[n, C]`` (float32)."""
        x = x.to(self.device)
        return torch.cat([self._f_raw(self.theta_hat, None, x[i:i + self.data_chunk])
                          for i in range(0, x.shape[0], self.data_chunk)])

    def probs(self, x: Tensor) -> Tensor:
        """``softmax f(x, θ̂)``, ``[n, C]``."""
        return torch.softmax(self.logits(x), -1)

    def jvp_at(self, v: Tensor, x: Tensor) -> Tensor:
        """``J(x) v``: ``[k, d_θ]`` → ``[k, n, C]``."""
        f = self._fn(x.to(self.device))
        v = v.reshape(-1, self.num_params).to(self.dtype)
        one = lambda vi: jvp(f, (self.theta_hat,), (vi,))[1]  # noqa: E731
        with torch.no_grad():
            return torch.cat([self._batched(one, c) for c in self._chunks(v)])

    def vjp_at(self, u: Tensor, x: Tensor) -> Tensor:
        """``J(x)ᵀ u``: ``[k, n, C]`` → ``[k, d_θ]``."""
        _, fn = vjp(self._fn(x.to(self.device)), self.theta_hat)
        u = u.to(self.dtype)
        with torch.no_grad():
            return torch.cat([self._batched(lambda ui: fn(ui)[0], c) for c in self._chunks(u)])

    def jacobian(self, x: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
        """The dense ``J(x)``, ``[n, C, d_θ]`` (``float64`` recomputes the net in double)."""
        fixed = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self._fixed.items()}
        th = self.theta_hat.to(dtype)
        outs = []
        for i in range(0, x.shape[0], max(1, self.data_chunk // 8)):
            xi = x[i:i + max(1, self.data_chunk // 8)].to(self.device, dtype)
            outs.append(jacrev(self._fn(xi, fixed))(th).detach())
        return torch.cat(outs)


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
    from ctuq.recon.linearize import select_parameters

    last = set(list(select_parameters(model, "all").values())[-1])
    return lambda name, _p: name in last


def lambda_mul(p: Tensor, r: Tensor) -> Tensor:
    """``Λ_n r_n = p_n ⊙ r_n − p_n (p_nᵀ r_n)`` for ``p`` ``[n, C]``, ``r`` ``[..., n, C]``."""
    return p * r - p * (p * r).sum(-1, keepdim=True)


def b_mul(p: Tensor, r: Tensor) -> Tensor:
    """``B_n r_n = √p_n ⊙ r_n − √p_n (p_nᵀ r_n)`` (``Λ_n = B_nᵀ B_n``)."""
    s = p.clamp_min(0).sqrt()
    return s * r - s * (p * r).sum(-1, keepdim=True)


def bt_mul(p: Tensor, e: Tensor) -> Tensor:
    """``B_nᵀ e_n = √p_n ⊙ e_n − p_n (√p_nᵀ e_n)``."""
    s = p.clamp_min(0).sqrt()
    return s * e - p * (s * e).sum(-1, keepdim=True)


# ------------------------------------------------------------------------------
# priors


def _ggn_diag(clin: ClassifierLinearization, x: Tensor, probs: Tensor, *, exact: bool,
              n_probes: int, generator) -> Tensor:
    """``diag(G)`` exactly (dense Jacobians) or from Rademacher probes ``E[(JᵀBᵀε)²]``."""
    d = clin.num_params
    acc = torch.zeros(d, dtype=torch.float64)
    if exact:
        for i in range(0, x.shape[0], clin.data_chunk):
            J = clin.jacobian(x[i:i + clin.data_chunk], torch.float64)  # [n, C, d]
            p = probs[i:i + clin.data_chunk].double()
            BJ = _b_mul_jac(p, J)
            acc += BJ.square().sum((0, 1)).cpu()
        return acc
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    done = 0
    while done < n_probes:
        m = min(64, n_probes - done)
        eps = torch.randint(0, 2, (m, *probs.shape), generator=gen).float() * 2 - 1
        g = torch.zeros(m, d, device=clin.device)
        for i in range(0, x.shape[0], clin.data_chunk):
            sl = slice(i, i + clin.data_chunk)
            g += clin.vjp_at(bt_mul(probs[sl], eps[:, sl].to(clin.device)), x[sl])
        acc += g.double().square().sum(0).cpu()
        done += m
    return acc / n_probes


def _b_mul_jac(p: Tensor, J: Tensor) -> Tensor:
    """``B_n J_n`` for ``p`` ``[n, C]`` and ``J`` ``[n, C, d]``."""
    s = p.sqrt().unsqueeze(-1)
    return s * J - s * torch.einsum("nc,ncd->nd", p, J).unsqueeze(1)


def gprior_for(clin: ClassifierLinearization, x: Tensor, probs: Tensor | None = None,
               g: float = 1.0, *, exact: bool | None = None, n_probes: int = 256,
               generator: torch.Generator | None = None, floor: float = 1e-6) -> GPrior:
    """The g-prior ``Σ = g diag(s)²`` with ``s_i = (diag(G)_i / N)^{-1/2}``.

    Parameters
    ----------
    clin : ClassifierLinearization
    x : Tensor, shape (N, 1, H, W)
        Training inputs.
    probs : Tensor, shape (N, C), optional
        ``softmax f(x, θ̂)`` (computed if not given).
    g : float, optional
        Initial ``g``. Default 1.
    exact : bool or None, optional
        Dense per-datum Jacobians (exact) or ``n_probes`` Rademacher probes
        (relative error ≈ ``sqrt(2 / n_probes)`` per entry). Default: exact
        when ``d_θ ≤ 20 000``.
    floor : float, optional
        Entries below ``floor · mean`` are raised to it. Default 1e-6.
    """
    probs = clin.probs(x) if probs is None else probs
    if exact is None:
        exact = clin.num_params <= 20_000
    diag = _ggn_diag(clin, x, probs, exact=exact, n_probes=n_probes, generator=generator)
    diag = diag.clamp_min(floor * float(diag.mean()) + 1e-300)
    return GPrior((diag / x.shape[0]).rsqrt().to(clin.device), g=g)


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
    if kind == "ard":
        return BlockPrior(clin, kind="iso", variance=variance)
    if kind == "gprior":
        return gprior_for(clin, x, probs, g=variance, **kw)
    raise InputError(f"must be one of {', '.join(PRIORS)}, got {kind!r}", field="prior")


# ------------------------------------------------------------------------------
# sample-then-optimise


@dataclass(frozen=True)
class STOOptions:
    """Settings of :func:`sample_sto`.

    Parameters
    ----------
    iterations : int
        Most SGD steps. Default 300.
    batch_size : int or None
        Data points per mini-batch (data term scaled by ``N / batch_size``);
        None: full batch. Default None.
    lr : float or None
        Peak step in whitened coordinates; None: ``1 / λ_max`` of the
        (preconditioned) whitened Hessian by power iteration (× 1.1). Default None.
    momentum : float or None
        Nesterov momentum; None: ``(√κ − 1)/(√κ + 1)``, ``κ = λ_max`` (the
        smallest whitened eigenvalue is 1). Default None.
    lr_final_factor : float
        Linear decay of the step to ``lr · lr_final_factor``. Default 0.1.
    clip_factor : float or None
        Clip each row's gradient norm at this multiple of its first norm. Default 10.
    polyak_start : float
        Fraction of the steps after which iterates are averaged. Default 0.8.
    precond_rank : int
        Rank of the Nyström preconditioner of ``Lᵀ G L`` (0: none). Default 100.
    precond_oversample, precond_power_iters : int
        Defaults 10 and 1.
    reuse_tol : float
        A ``warm_start``'s preconditioner is reused while no log prior
        variance moved by more than this (it stays a valid preconditioner,
        only a less sharp one; with 0.5 the digits EM needed up to 300 instead
        of 15–30 steps after the first update). Default 0.05.
    power_iterations : int
        For ``λ_max``. Default 20.
    curvature_batches : int
        Mini-batched runs: also estimate ``λ_max`` of ``(N/b)·G_B + I`` on this
        many random batches and size the steps for the largest (a step sees one
        batch's curvature, not the full gram's). Default 4.
    tol : float or None
        Full-batch runs stop when every relative residual (``M⁻¹``-norm of
        the gradient over that of the right-hand side) is below ``tol / 2``
        (checked every 5 steps); ``info['converged']`` reports ``≤ tol``.
        Default 1e-3.
    progress_every : int
        Default 50.
    """

    iterations: int = 300
    batch_size: int | None = None
    lr: float | None = None
    momentum: float | None = None
    lr_final_factor: float = 0.1
    clip_factor: float | None = 10.0
    polyak_start: float = 0.8
    precond_rank: int = 100
    precond_oversample: int = 10
    precond_power_iters: int = 1
    reuse_tol: float = 0.05
    power_iterations: int = 20
    curvature_batches: int = 4
    tol: float | None = 1e-3
    progress_every: int = 50

    def __post_init__(self):
        # checked here, not at the first draw, which may come after minutes of training
        if isinstance(self.iterations, bool) or int(self.iterations) < 1:
            raise InputError(f"must be >= 1, got {self.iterations!r}", field="iterations")
        if self.batch_size is not None and (isinstance(self.batch_size, bool)
                                            or int(self.batch_size) < 1):
            raise InputError(f"must be >= 1 or None (full batch), got {self.batch_size!r}",
                             field="batch_size")


@dataclass
class ClassifierSample:
    """Result of :func:`sample_sto`.

    Attributes
    ----------
    z : Tensor, shape (k, d_θ)
        Zero-mean posterior samples ``z ~ N(0, H⁻¹)``.
    theta0 : Tensor, shape (k, d_θ)
        Their prior draws ``θ⁰ = L u``.
    u : Tensor, shape (k, d_θ)
    e : Tensor, shape (k, N, C)
        The base draws (reused by warm starts).
    w : Tensor, shape (k, d_θ)
        The whitened solutions (``z = L w``).
    anchor : Tensor, shape (k, d_θ)
        The whitened anchors ``wⁿ = u + Lᵀ Jᵀ Bᵀ ε``.
    info : dict
        ``iterations``, ``converged``, ``residuals`` (``[k]``), ``time``,
        ``lr``, ``momentum``, ``precond_rank``, ``precond_reused``.
    precond : NystromPreconditioner or None
        The preconditioner used (warm starts may reuse it).
    hyper : Tensor or None
        The prior variances it was built with.
    """

    z: Tensor
    theta0: Tensor
    u: Tensor
    e: Tensor
    w: Tensor
    anchor: Tensor
    info: dict = field(default_factory=dict)
    precond: NystromPreconditioner | None = None
    hyper: Tensor | None = None

    @property
    def k(self) -> int:
        return int(self.z.shape[0])


def _full_gram(clin, prior, x, probs):
    """``w ↦ Lᵀ G L w`` over the whole data set (chunked), ``[m, d]`` → ``[m, d]``."""
    n = x.shape[0]

    def gram(w: Tensor, idx: Tensor | None = None, scale: float = 1.0) -> Tensor:
        v = prior.cov_sqrt(w)
        out = torch.zeros_like(w)
        if idx is None:
            for i in range(0, n, clin.data_chunk):
                sl = slice(i, i + clin.data_chunk)
                out += clin.vjp_at(lambda_mul(probs[sl], clin.jvp_at(v, x[sl])), x[sl])
        else:
            xs, ps = x[idx], probs[idx]
            out += clin.vjp_at(lambda_mul(ps, clin.jvp_at(v, xs)), xs)
        return prior.cov_sqrt(out, transpose=True).mul_(scale)
    return gram


def sample_sto(clin: ClassifierLinearization, x: Tensor, prior: GaussianPrior, k: int, *,
               probs: Tensor | None = None, options: STOOptions | None = None,
               generator: torch.Generator | None = None,
               warm_start: ClassifierSample | None = None, progress=None, cancel=None,
               stage: str = "sampling") -> ClassifierSample:
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
    generator : torch.Generator, optional
        CPU generator of the base draws, mini-batches and sketches. Default seed 0.
    warm_start : ClassifierSample, optional
        A previous result with the same ``k``: its base draws ``(u, ε)`` and
        whitened solutions are reused (EM steps).
    progress, cancel : callable, optional

    Returns
    -------
    ClassifierSample
    """
    opt = options or STOOptions()
    k = int(k)
    if k < 1:
        raise InputError(f"must be >= 1, got {k}", field="k")
    if prior.num_params != clin.num_params:
        raise InputError(f"prior has {prior.num_params} parameters, the model "
                         f"{clin.num_params}", field="prior")
    n, d, dev = x.shape[0], clin.num_params, clin.device
    if opt.batch_size is not None and not 1 <= opt.batch_size <= n:
        raise InputError(f"must be between 1 and the {n} data points, got {opt.batch_size}",
                         field="batch_size")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    x = x.to(dev)
    probs = (clin.probs(x) if probs is None else probs).to(dev)
    C = probs.shape[-1]
    if warm_start is not None and warm_start.k == k and warm_start.e.shape[1:] == (n, C):
        u, e = warm_start.u, warm_start.e
    else:
        warm_start = None
        u = torch.randn(k, d, generator=gen).to(dev)
        e = torch.randn(k, n, C, generator=gen).to(dev)
    gram = _full_gram(clin, prior, x, probs)
    with torch.no_grad():
        theta0 = prior.cov_sqrt(u)
        jtbe = torch.zeros(k, d, device=dev)
        for i in range(0, n, clin.data_chunk):
            sl = slice(i, i + clin.data_chunk)
            jtbe += clin.vjp_at(bt_mul(probs[sl], e[:, sl]), x[sl])
        anchor = u + prior.cov_sqrt(jtbe, transpose=True)

        precond, reused = None, False
        hyper = prior.variances.detach().double().cpu().clone()
        if opt.precond_rank > 0 and warm_start is not None and warm_start.precond is not None \
                and warm_start.hyper is not None and warm_start.hyper.shape == hyper.shape \
                and float((warm_start.hyper.log() - hyper.log()).abs().max()) < opt.reuse_tol:
            precond, reused = warm_start.precond, True
        elif opt.precond_rank > 0:
            precond = NystromPreconditioner.build(
                gram, d, opt.precond_rank, oversample=opt.precond_oversample,
                power_iters=opt.precond_power_iters, generator=gen, device=dev)

        def apply_M(g: Tensor) -> Tensor:
            return g if precond is None else precond(g, 1.0)

        full = opt.batch_size is None or opt.batch_size == n
        if opt.lr is None or opt.momentum is None:
            # mini-batched: the steps see one batch's curvature (Fashion-MNIST, 500 of
            # 8,998 images: steps sized for the full gram diverged)
            lam = _step_curvature(
                lambda v: apply_M(gram(v) + v), d, opt.power_iterations, gen, dev,
                None if full else lambda v, idx: apply_M(gram(v, idx, n / opt.batch_size) + v),
                lambda: torch.randperm(n, generator=gen)[:opt.batch_size].to(dev),
                opt.curvature_batches)
            L_max = max(1.0, 1.1 * lam)
        else:
            L_max = float("nan")
        lr0 = opt.lr if opt.lr is not None else 1.0 / L_max
        beta = opt.momentum if opt.momentum is not None else \
            (math.sqrt(L_max) - 1) / (math.sqrt(L_max) + 1)

        def m_norm(g: Tensor) -> Tensor:
            return (g * apply_M(g)).sum(1).clamp_min(0).sqrt()

        W = warm_start.w.clone() if warm_start is not None else torch.zeros_like(anchor)
        rhs_norm = m_norm(anchor).clamp_min(1e-30)
        g_init = gram(W) + W - anchor
        clip = opt.clip_factor * g_init.norm(dim=1).clamp_min(1e-30) \
            if opt.clip_factor is not None else None
        early = opt.tol is not None and full
        n_iter = int(opt.iterations)
        if early and float((m_norm(g_init) / rhs_norm).max()) <= 0.5 * opt.tol:
            n_iter = 0  # a warm start that is already converged
        perm, pos = None, n  # mini-batches: epochs of a random permutation

        def grad(look: Tensor) -> Tensor:
            nonlocal perm, pos
            if full:
                g = gram(look)
            else:
                if pos + opt.batch_size > n:
                    perm, pos = torch.randperm(n, generator=gen).to(dev), 0
                idx = perm[pos:pos + opt.batch_size]
                pos += opt.batch_size
                g = gram(look, idx, n / opt.batch_size)
            return g.add_(look).sub_(anchor)

        W_final, stopped = _nesterov_polyak(
            grad, W, apply_M, n_iter=n_iter, lr0=lr0, beta=beta,
            lr_final_factor=opt.lr_final_factor, clip=clip, polyak_start=opt.polyak_start,
            stop=(lambda g: float((m_norm(g) / rhs_norm).max()) <= 0.5 * opt.tol)
            if early else None, cancel=cancel, progress=progress, stage=stage,
            progress_every=opt.progress_every)
        rel = (m_norm(gram(W_final) + W_final - anchor) / rhs_norm).cpu()
        z = prior.cov_sqrt(W_final)
    info = {"iterations": stopped, "residuals": rel,
            "converged": bool(opt.tol is None or (rel <= opt.tol).all()),
            "time": time.perf_counter() - t0, "lr": lr0, "momentum": beta,
            "curvature_max": L_max, "precond_rank": precond.rank if precond else 0,
            "precond_reused": reused, "batch_size": opt.batch_size}
    log.info("STO: k=%d, %d steps, max residual %.2e, %.2f s", k, stopped,
             float(rel.max()), info["time"])
    return ClassifierSample(z, theta0, u, e, W_final.clone(), anchor, info, precond,
                            hyper if precond is not None and not reused else
                            (warm_start.hyper if reused else None))


def linear_mode(clin: ClassifierLinearization, x: Tensor, y: Tensor, prior: GaussianPrior, *,
                init: Tensor | None = None, max_iter: int = 300, tol: float = 1e-7) -> Tensor:
    """``θ*``: the MAP of the linearised model under ``prior`` (METHOD.md "recommendation 1").

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


# ------------------------------------------------------------------------------
# evidence: MacKay / EM


@dataclass
class EMResult:
    """Result of :func:`fit_prior`.

    Attributes
    ----------
    prior : GaussianPrior
        The prior at the final hyperparameters (the object passed in, updated).
    sample : ClassifierSample
        Samples at the final hyperparameters (a last E-step).
    trace : list of dict
        Per EM step: ``variances`` (list, before the update), ``gamma``
        (``γ̂_b``), ``gamma_se``, ``theta_quad``, ``new_variances``, ``sto_iterations``.
    seconds : float
    theta_star : Tensor, shape (d_θ,) or None
        ``mode='linear'``: the linear-model mode at the final prior.
    probs : Tensor, shape (N, C) or None
        ``mode='linear'``: the training probabilities at ``θ*`` (the GGN's ``p_n``).
    """

    prior: GaussianPrior
    sample: ClassifierSample
    trace: list
    seconds: float
    theta_star: Tensor | None = None
    probs: Tensor | None = None

    def variances(self) -> list[float]:
        return [float(v) for v in self.prior.variances.detach().cpu()]


def fit_prior(clin: ClassifierLinearization, x: Tensor, prior: GaussianPrior, *,
              em_steps: int = 10, k: int = 8, update: str = "mackay",
              probs: Tensor | None = None, options: STOOptions | None = None,
              generator: torch.Generator | None = None, tol: float = 1e-3,
              mode: str = "map", y: Tensor | None = None,
              progress=None, cancel=None) -> EMResult:
    """Tune the prior variances by MacKay / EM updates driven by STO samples.

    E-step: ``k`` samples :func:`sample_sto` (warm-started with the same base
    draws); statistics ``‖θ̂_b‖²_{C_b⁻¹}``, ``S_b = mean_k ‖z_{k,b}‖²_{C_b⁻¹}``
    and ``γ̂_b = mean_k ‖θ⁰_{k,b} − z_{k,b}‖²_{Σ_b⁻¹}``; M-step
    :func:`ctuq.recon.evidence.mackay_update` (``a_b ← ‖θ̂_b‖²/γ̂_b``) or
    :func:`~ctuq.recon.evidence.em_update` (``a_b ← (‖θ̂_b‖² + S_b)/d_b``).

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
        Laplace; the fixed point is the optimum of :meth:`ExactLLA.log_evidence`).
        ``'linear'``: every E-step first finds the linearised model's own mode
        ``θ*`` under the current prior (:func:`linear_mode`, warm-started), uses
        ``‖θ*_b‖²`` in the update and the GGN at ``θ*`` (``p_n`` of the
        linearised logits) for the samples.
    y : Tensor, shape (N,), optional
        Training labels (``mode='linear'`` only).
    options, generator, probs, progress, cancel
        As for :func:`sample_sto`.

    Returns
    -------
    EMResult
    """
    if update not in ("mackay", "em"):
        raise InputError(f"must be 'mackay' or 'em', got {update!r}", field="update")
    if mode not in ("map", "linear"):
        raise InputError(f"must be 'map' or 'linear', got {mode!r}", field="mode")
    if mode == "linear" and y is None:
        raise InputError("mode='linear' needs the training labels", field="y")
    if em_steps < 0:
        raise InputError(f"must be >= 0, got {em_steps}", field="em_steps")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    probs = clin.probs(x) if probs is None else probs
    dims = prior.block_dims
    theta = clin.theta_hat.reshape(1, -1).double()
    theta_star = None
    trace, sample = [], None

    def refresh_mode():
        nonlocal theta_star, theta, probs
        theta_star = linear_mode(clin, x, y, prior, init=theta_star)
        theta = theta_star.reshape(1, -1).double()
        probs = torch.softmax(linear_logits(clin, theta_star, x), -1)

    for step in range(em_steps):
        check_cancel(cancel, "EM")
        if mode == "linear":
            refresh_mode()
        sample = sample_sto(clin, x, prior, k, probs=probs, options=options, generator=gen,
                            warm_start=sample, cancel=cancel)
        with torch.no_grad():
            a = prior.variances.detach().double().cpu()
            tq = prior.block_quadratics(theta)[0].cpu()
            zq = prior.block_quadratics(sample.z.double()).cpu()
            per = prior.block_quadratics(sample.theta0.double() - sample.z.double()).cpu() / a
            gamma = per.mean(0)
            gse = per.std(0) / math.sqrt(k) if k > 1 else torch.full_like(gamma, float("nan"))
            new = mackay_update(tq, gamma, dims) if update == "mackay" else \
                em_update(tq, zq.mean(0), dims)
        trace.append({"step": step, "variances": a.tolist(), "gamma": gamma.tolist(),
                      "gamma_se": gse.tolist(), "theta_quad": tq.tolist(),
                      "new_variances": new.tolist(),
                      "sto_iterations": sample.info["iterations"]})
        prior.set_hyperparameters(variances=new)
        emit_progress(progress, "em", step + 1, em_steps,
                      "a = " + ", ".join(f"{float(v):.3g}" for v in new))
        if float((new.log() - a.log()).abs().max()) < tol:
            break
    if mode == "linear":
        refresh_mode()
    sample = sample_sto(clin, x, prior, k, probs=probs, options=options, generator=gen,
                        warm_start=sample, cancel=cancel)
    return EMResult(prior, sample, trace, time.perf_counter() - t0, theta_star,
                    probs if mode == "linear" else None)


# ------------------------------------------------------------------------------
# predictive


def function_samples(clin: ClassifierLinearization, z: Tensor, x: Tensor) -> Tensor:
    """Linearised logits ``f(x, θ̂) + J(x) z_s``, ``[S, n, C]``."""
    x = x.to(clin.device)
    out = []
    for i in range(0, x.shape[0], clin.data_chunk):
        xi = x[i:i + clin.data_chunk]
        out.append(clin.logits(xi).unsqueeze(0) + clin.jvp_at(z, xi))
    return torch.cat(out, dim=1)


def mc_predictive(logit_samples: Tensor) -> Tensor:
    """``mean_s softmax(logits_s)``: ``[S, n, C]`` → ``[n, C]``."""
    return torch.softmax(logit_samples.double(), -1).mean(0)


def scaled_mc_predictive(f_mean: Tensor, deviations: Tensor, scale: float) -> Tensor:
    """``mean_s softmax(f + t · d_s)``: the MC predictive with the spread scaled by ``t``.

    Parameters
    ----------
    f_mean : Tensor, shape (n, C)
        The predictive mean logits (``f(x, θ̂)``, or the linear-model mode's).
    deviations : Tensor, shape (S, n, C)
        Zero-mean function-space draws ``J(x) z_s`` (exact Gaussian draws work too).
    scale : float
        ``t``; ``t = 1`` is :func:`mc_predictive` of ``f + d_s``, ``t = 0`` the
        plug-in softmax of ``f``.

    Returns
    -------
    Tensor, shape (n, C), float64
    """
    return mc_predictive(f_mean.double().unsqueeze(0) + float(scale) * deviations.double())


def scaled_predictive_nll(f_mean: Tensor, deviations: Tensor, y: Tensor, scale: float) -> float:
    """Mean NLL of :func:`scaled_mc_predictive` at labels ``y`` (log-sum-exp, no clipping)."""
    logp = torch.log_softmax(f_mean.double().unsqueeze(0) + float(scale) * deviations.double(),
                             -1)                                          # [S, n, C]
    idx = y.to(logp.device).long().reshape(1, -1, 1).expand(logp.shape[0], -1, 1)
    ll = torch.logsumexp(logp.gather(-1, idx)[..., 0], 0) - math.log(logp.shape[0])
    return float(-ll.mean())


def tune_predictive_scale(f_mean: Tensor, deviations: Tensor, y: Tensor, *, grid=None,
                          xatol: float = 1e-7) -> dict:
    """The scale ``t`` of the function-space spread that maximises held-out likelihood.

    Minimises ``NLL(t) = −mean_n log mean_s softmax(f_n + t · d_{s,n})_{y_n}`` on a
    validation set over ``t ≥ 0``: a grid, then a bounded Brent search between
    the neighbours of the best grid point. With ``d_s = J(x) z_s`` and
    ``z_s ~ N(0, H⁻¹)`` the tuned predictive is the linearised Laplace
    predictive with the posterior covariance ``t² H⁻¹`` (a tempered posterior,
    temperature ``t²``: likelihood and prior precision both divided by
    ``t²``), so rescaling needs no new samples and is exact for the given
    draws. The same draws must be used at test time
    (:func:`scaled_mc_predictive`).

    Parameters
    ----------
    f_mean : Tensor, shape (n, C)
        Validation mean logits.
    deviations : Tensor, shape (S, n, C)
        Validation function-space draws ``J(x) z_s``.
    y : Tensor, shape (n,)
        Validation labels.
    grid : sequence of float, optional
        Candidate scales (non-negative). Default ``0`` and 61 log-spaced
        values in ``[0.01, 10]``.
    xatol : float, optional
        Tolerance on ``t`` of the refinement (scipy's bounded Brent). Default 1e-7.

    Returns
    -------
    dict
        ``scale`` (``t``), ``nll`` (validation NLL at ``t``), ``nll_at_1``
        (the untuned predictive's), ``grid``, ``grid_nll`` (lists) and
        ``at_boundary`` (the best grid point is the largest one: widen the grid).
    """
    g = sorted({float(v) for v in (grid if grid is not None else
                                    [0.0, *torch.logspace(-2, 1, 61).tolist()])})
    if not g or g[0] < 0:
        raise InputError(f"scales must be non-negative, got {g[:3]}…", field="grid")
    nll = lambda t: scaled_predictive_nll(f_mean, deviations, y, t)  # noqa: E731
    res = _minimise_on_grid(nll, g, xatol)
    return {"scale": res["x"], "nll": res["value"], "nll_at_1": nll(1.0), "grid": g,
            "grid_nll": res["values"], "at_boundary": res["at_end"]}


def _minimise_on_grid(fn, grid: list, xatol: float, log: bool = False) -> dict:
    """Minimise ``fn`` over the sorted ``grid``, then by bounded Brent between the
    best point's neighbours (in ``log`` space if asked). ``at_end``: the best grid
    point is the largest one."""
    vals = [float(fn(t)) for t in grid]
    i = min(range(len(grid)), key=vals.__getitem__)
    best_x, best = grid[i], vals[i]
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    if hi > lo:
        tr, inv = (math.log, math.exp) if log else (float, float)
        res = minimize_scalar(lambda u: fn(inv(u)), bounds=(tr(lo), tr(hi)), method="bounded",
                              options={"xatol": float(xatol), "maxiter": 200})
        if res.fun < best:
            best_x, best = inv(float(res.x)), float(res.fun)
    return {"x": float(best_x), "value": float(best), "values": vals,
            "at_end": bool(i == len(grid) - 1 and len(grid) > 1)}


def scaled_prior_covariance(K: Tensor, lam: Tensor, c: float) -> Tensor:
    """Function-space covariances ``J(x) (G + c Σ⁻¹)⁻¹ J(x)ᵀ``, ``[n, C, C]`` float64.

    Parameters
    ----------
    K : Tensor, shape (n, C, d_θ)
        ``J(x) W`` from :meth:`ExactLLA.prior_scale_factor`.
    lam : Tensor, shape (d_θ,)
        The eigenvalues of ``Σ^{1/2} G Σ^{1/2}`` (:meth:`ExactLLA.prior_scale_basis`).
    c : float
        The prior-precision multiplier (``c > 0``; ``c = 1`` is the prior itself).
    """
    return torch.einsum("ncd,d,nkd->nck", K, 1.0 / (lam + float(c)), K)


def tune_prior_scale(f_mean: Tensor, K: Tensor, lam: Tensor, y: Tensor, *,
                     n_samples: int = 1000, generator: torch.Generator | None = None,
                     grid=None, xatol: float = 1e-4) -> dict:
    """The prior-precision multiplier ``c`` that maximises held-out likelihood (exact LLA).

    The recipe of the Laplace tutorials' benchmark tables ("prior variance tuned
    on a validation set"): the posterior ``N(θ̂, (G + c Σ⁻¹)⁻¹)`` for a scalar
    ``c > 0`` multiplying every prior precision, ``c`` minimising the validation
    NLL of the MC predictive. Unlike the scale ``t`` of
    :func:`tune_predictive_scale` (a temperature, ``t² H⁻¹``), ``c`` changes the
    shape of the posterior: it shrinks the prior-dominated directions and
    leaves the data-dominated ones; ``c → ∞`` is MAP. One set of standard
    normal draws is used for every ``c`` (common random numbers).

    Parameters
    ----------
    f_mean : Tensor, shape (n, C)
        Validation mean logits.
    K, lam : Tensor
        See :func:`scaled_prior_covariance` (validation inputs).
    y : Tensor, shape (n,)
    n_samples : int, optional
        MC draws per input. Default 1000.
    generator : torch.Generator, optional
    grid : sequence of float, optional
        Candidate ``c`` (positive). Default 43 log-spaced values in
        ``[10⁻², 10⁵]``; the refinement is a bounded Brent search in ``log c``.
    xatol : float, optional
        Tolerance on ``log c``. Default 1e-4.

    Returns
    -------
    dict
        ``scale`` (``c``), ``nll``, ``nll_at_1`` (the evidence prior's), ``grid``,
        ``grid_nll`` and ``at_boundary`` (the largest ``c`` of the grid won: the
        validation set prefers no spread, i.e. MAP).
    """
    g = sorted({float(v) for v in (grid if grid is not None else
                                    torch.logspace(-2, 5, 43).tolist())})
    if not g or g[0] <= 0:
        raise InputError(f"prior-precision multipliers must be positive, got {g[:3]}…",
                         field="grid")
    n, C_ = f_mean.shape
    eps = torch.randn(int(n_samples), n, C_, generator=generator, dtype=torch.float64)

    def nll(c):
        dev = gaussian_deviations(scaled_prior_covariance(K, lam, c), eps=eps)
        return scaled_predictive_nll(f_mean, dev, y, 1.0)

    res = _minimise_on_grid(nll, g, xatol, log=True)
    return {"scale": res["x"], "nll": res["value"], "nll_at_1": nll(1.0), "grid": g,
            "grid_nll": res["values"], "at_boundary": res["at_end"]}


def sample_function_variance(logit_samples: Tensor) -> Tensor:
    """Per-class logit variance ``mean_s (J z_s)²`` from zero-mean perturbations, ``[n, C]``.

    Parameters
    ----------
    logit_samples : Tensor, shape (S, n, C)
        ``J(x) z_s`` (i.e. :func:`function_samples` minus the mean logits).
    """
    return logit_samples.double().square().mean(0)


def probit_predictive(f_mean: Tensor, f_var: Tensor) -> Tensor:
    """The probit approximation ``softmax(f / sqrt(1 + π/8 · var))``, ``[n, C]``."""
    return torch.softmax(f_mean.double() / torch.sqrt(1 + math.pi / 8 * f_var.double()), -1)


def gaussian_mc_predictive(f_mean: Tensor, f_cov: Tensor, n_samples: int = 1000,
                           generator: torch.Generator | None = None) -> Tensor:
    """``E softmax(f)``, ``f ~ N(f_mean, f_cov)`` per input by Monte Carlo.

    Parameters
    ----------
    f_mean : Tensor, shape (n, C)
    f_cov : Tensor, shape (n, C, C)
    n_samples : int, optional
        Default 1000.
    generator : torch.Generator, optional

    Returns
    -------
    Tensor, shape (n, C), float64
    """
    return mc_predictive(f_mean.double().unsqueeze(0)
                         + gaussian_deviations(f_cov, n_samples, generator))


def gaussian_deviations(f_cov: Tensor, n_samples: int = 1000,
                        generator: torch.Generator | None = None, *,
                        eps: Tensor | None = None) -> Tensor:
    """Zero-mean draws ``L_n ε_{s,n}`` (``L_n L_nᵀ = f_cov_n``), ``[S, n, C]`` float64.

    The deviations of :func:`gaussian_mc_predictive`; with :func:`tune_predictive_scale`
    and :func:`scaled_mc_predictive` they give the exact LLA with a tuned scale.
    ``eps`` (``[S, n, C]`` standard normals) replaces the fresh draws, so that
    several covariances can share them.
    """
    n, C = f_cov.shape[:2]
    cov = f_cov.double()
    jitter = 1e-10 * cov.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-30)
    L = torch.linalg.cholesky(cov + jitter[:, None, None] * torch.eye(C, dtype=cov.dtype))
    if eps is None:
        eps = torch.randn(n_samples, n, C, generator=generator, dtype=torch.float64)
    return torch.einsum("ncd,snd->snc", L, eps)


def tune_temperature(logits: Tensor, y: Tensor, *, bounds: tuple = (0.05, 20.0),
                     xatol: float = 1e-8) -> dict:
    """Temperature scaling: ``T`` minimising the validation NLL of ``softmax(f / T)``.

    Bounded Brent search (scipy) over ``log T`` in ``bounds`` (the NLL is
    convex in ``1/T``, so unimodal).

    Parameters
    ----------
    logits : Tensor, shape (n, C)
        Validation logits.
    y : Tensor, shape (n,)
    bounds : (float, float), optional
        Default (0.05, 20).
    xatol : float, optional
        Tolerance on ``log T``. Default 1e-8.

    Returns
    -------
    dict
        ``temperature``, ``val_nll`` (at ``T``), ``val_nll_at_1``.
    """
    f = logits.double()
    y = y.to(f.device).long()
    nll = lambda lt: float(nn.functional.cross_entropy(f / math.exp(lt), y))  # noqa: E731
    res = minimize_scalar(nll, bounds=(math.log(bounds[0]), math.log(bounds[1])),
                          method="bounded", options={"xatol": float(xatol), "maxiter": 200})
    lt = float(res.x)
    return {"temperature": math.exp(lt), "val_nll": float(res.fun), "val_nll_at_1": nll(0.0)}


# ------------------------------------------------------------------------------
# the exact dense oracle


def _diagonal_structure(prior: GaussianPrior) -> tuple[Tensor, Tensor]:
    """``(c, block_index)`` with ``Σ_ii = a_{b(i)} c_i`` for diagonal priors."""
    if isinstance(prior, BlockPrior) and prior.kind != "iso":
        if any(prior.matern_blocks):
            raise InputError("the exact classifier LLA needs a diagonal prior ('ard' or "
                             "'gprior')", field="prior")
    idx = torch.zeros(prior.num_params, dtype=torch.long)
    for b, sl in enumerate(prior.block_slices.values()):
        idx[sl] = b
    with torch.no_grad():
        a = prior.variances.detach().double().cpu()
        diag = prior.cov(torch.ones(1, prior.num_params, dtype=torch.float64,
                                    device=prior._device()))[0].cpu()
    return diag / a[idx], idx


class ExactLLA:
    """Dense float64 full-GGN linearised Laplace (small classifiers: ``d_θ`` ≲ 5 000).

    Parameters
    ----------
    clin : ClassifierLinearization
    x : Tensor, shape (N, 1, H, W)
        Training inputs.
    y : Tensor, shape (N,)
        Labels (for the likelihood term of the evidence).

    Attributes
    ----------
    G : Tensor, shape (d_θ, d_θ)
        ``Σ_n J_nᵀ Λ_n J_n`` in float64.
    log_lik : float
        ``Σ_n log p(y_n | x_n, θ̂)``.
    seconds_ggn : float
    """

    def __init__(self, clin: ClassifierLinearization, x: Tensor, y: Tensor, *,
                 progress=None, cancel=None):
        t0 = time.perf_counter()
        self.clin = clin
        d = clin.num_params
        self.G = torch.zeros(d, d, dtype=torch.float64)
        log_lik = 0.0
        n, done = x.shape[0], 0
        for logits, J in self._jacobian_chunks(x, cancel):  # J: [n_i, C, d]
            BJ = _b_mul_jac(torch.softmax(logits, -1), J).reshape(-1, d)
            self.G.addmm_(BJ.t(), BJ)
            lp = torch.log_softmax(logits, -1)
            yi = y[done:done + len(lp)]
            log_lik += float(lp[torch.arange(len(lp)), yi].sum())
            done += len(lp)
            emit_progress(progress, "exact", done, n, "GGN")
        self.G = 0.5 * (self.G + self.G.t())
        self.log_lik = log_lik
        self.theta = clin.theta_hat.double().cpu()
        self.seconds_ggn = time.perf_counter() - t0
        self._chol: tuple | None = None

    def _jacobian_chunks(self, x: Tensor, cancel=None):
        """``(f(x_i, θ̂), J(x_i))`` in float64 on the CPU, per chunk of the inputs (in order)."""
        step = max(1, self.clin.data_chunk // 8)
        for i in range(0, x.shape[0], step):
            check_cancel(cancel, "exact GGN")
            xi = x[i:i + step]
            yield self._logits64(xi), self.clin.jacobian(xi, torch.float64).cpu()

    @staticmethod
    def _prior_diagonal(prior: GaussianPrior) -> tuple[Tensor, Tensor]:
        """The prior's diagonal ``Σ_ii`` ``[d_θ]`` (float64, CPU) and each entry's block."""
        c, idx = _diagonal_structure(prior)
        return prior.variances.detach().double().cpu()[idx] * c, idx

    def _logits64(self, x: Tensor) -> Tensor:
        clin = self.clin
        fixed = {k: v.double() if v.is_floating_point() else v for k, v in clin._fixed.items()}
        with torch.no_grad():
            return clin._f_raw(clin.theta_hat.double(), fixed,
                               x.to(clin.device, torch.float64)).cpu()

    # -- evidence ---------------------------------------------------------------
    def log_evidence(self, log_a: Tensor, prior: GaussianPrior) -> Tensor:
        """Laplace evidence at ``θ̂`` for block variances ``exp(log_a)`` (differentiable).

        ``log p(D|θ̂) − ½ θ̂ᵀΣ⁻¹θ̂ − ½ log|Σ| − ½ log|G + Σ⁻¹|``.
        """
        c, idx = _diagonal_structure(prior)
        var = log_a.exp()[idx] * c
        H = self.G + torch.diag(1.0 / var)
        L = torch.linalg.cholesky(H)
        return (self.log_lik - 0.5 * (self.theta.square() / var).sum() - 0.5 * var.log().sum()
                - torch.log(torch.diagonal(L)).sum())

    def optimize_prior(self, prior: GaussianPrior, *, max_iter: int = 100,
                       tol: float = 1e-7) -> dict:
        """The exact evidence optimum over ``log a_b`` (L-BFGS); sets ``prior`` to it.

        Returns
        -------
        dict
            ``variances`` (list), ``log_evidence``, ``gamma`` (exact ``γ_b``,
            list), ``evaluations``, ``seconds``, ``grad_norm``.
        """
        t0 = time.perf_counter()
        log_a = prior.variances.detach().double().cpu().log().clone().requires_grad_(True)
        opt = torch.optim.LBFGS([log_a], lr=1, max_iter=max_iter, tolerance_grad=tol,
                                tolerance_change=1e-12, history_size=20,
                                line_search_fn="strong_wolfe")
        n_eval = [0]
        scale = float(max(1, self.theta.numel()))  # objective per parameter

        def closure():
            opt.zero_grad()
            n_eval[0] += 1
            loss = -self.log_evidence(log_a, prior) / scale
            loss.backward()
            return loss

        opt.step(closure)
        loss = closure().detach()
        prior.set_hyperparameters(variances=log_a.detach().exp())
        gamma = self.gamma(prior)
        return {"variances": log_a.detach().exp().tolist(),
                "log_evidence": -float(loss) * scale, "gamma": gamma.tolist(),
                "evaluations": n_eval[0], "seconds": time.perf_counter() - t0,
                "grad_norm": float(log_a.grad.norm())}

    # -- posterior --------------------------------------------------------------
    def hessian(self, prior: GaussianPrior) -> Tensor:
        """``H = G + Σ⁻¹``, ``[d_θ, d_θ]``."""
        return self.G + torch.diag(1.0 / self._prior_diagonal(prior)[0])

    def cholesky(self, prior: GaussianPrior) -> Tensor:
        """Lower Cholesky factor of :meth:`hessian` (cached per hyperparameters)."""
        key = tuple(prior.variances.detach().double().cpu().tolist())
        if self._chol is None or self._chol[0] != key:
            self._chol = (key, torch.linalg.cholesky(self.hessian(prior)))
        return self._chol[1]

    def covariance(self, prior: GaussianPrior) -> Tensor:
        """``H⁻¹``, ``[d_θ, d_θ]``."""
        return torch.cholesky_inverse(self.cholesky(prior))

    def gamma(self, prior: GaussianPrior) -> Tensor:
        """Exact ``γ_b = d_b − Tr(Σ_b⁻¹ H⁻¹_{bb})``, ``[B]``."""
        var, idx = self._prior_diagonal(prior)
        per = self.covariance(prior).diagonal() / var
        return prior.block_dims - torch.zeros(prior.num_blocks, dtype=torch.float64
                                              ).index_add_(0, idx, per)

    def solve_whitened(self, prior: GaussianPrior, rhs: Tensor) -> Tensor:
        """``(I + Lᵀ G L)⁻¹ rhs`` for whitened right-hand sides ``[k, d_θ]`` (STO's system)."""
        Ls = prior.cov_sqrt(torch.eye(prior.num_params, dtype=torch.float64,
                                      device=prior._device())).t().cpu()  # rows → columns
        Hw = torch.eye(prior.num_params, dtype=torch.float64) + Ls.t() @ self.G @ Ls
        return torch.linalg.solve(Hw, rhs.double().cpu().t()).t()

    def function_covariance(self, prior: GaussianPrior, x: Tensor) -> tuple[Tensor, Tensor]:
        """``f(x, θ̂)`` ``[n, C]`` and ``Σ(x) = J(x) H⁻¹ J(x)ᵀ`` ``[n, C, C]`` (float64)."""
        L = self.cholesky(prior)
        means, covs = [], []
        for f, J in self._jacobian_chunks(x):
            n, C, d = J.shape
            W = torch.linalg.solve_triangular(L, J.reshape(n * C, d).t(), upper=False)
            W = W.t().reshape(n, C, d)
            covs.append(W @ W.transpose(1, 2))
            means.append(f)
        return torch.cat(means), torch.cat(covs)

    def prior_scale_basis(self, prior: GaussianPrior) -> tuple[Tensor, Tensor]:
        """``(W, lam)`` with ``(G + c Σ⁻¹)⁻¹ = W diag(1 / (lam + c)) Wᵀ`` for all ``c > 0``.

        ``Σ^{1/2} G Σ^{1/2} = U diag(lam) Uᵀ`` (one symmetric eigendecomposition),
        ``W = Σ^{1/2} U``: the posterior for any multiple of the prior precision
        without a new factorisation (:func:`tune_prior_scale`).

        Returns
        -------
        W : Tensor, shape (d_θ, d_θ), float64
        lam : Tensor, shape (d_θ,), float64 (clamped at 0)
        """
        sd = self._prior_diagonal(prior)[0].sqrt()
        lam, U = torch.linalg.eigh(sd[:, None] * self.G * sd[None, :])
        return sd[:, None] * U, lam.clamp_min(0)

    def prior_scale_factor(self, W: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """``f(x, θ̂)`` ``[n, C]`` and ``K = J(x) W`` ``[n, C, d_θ]`` (float64) for
        :func:`scaled_prior_covariance`."""
        means, ks = zip(*((f, J @ W) for f, J in self._jacobian_chunks(x)))
        return torch.cat(means), torch.cat(ks)

    def predict(self, prior: GaussianPrior, x: Tensor, method: str = "mc",
                n_samples: int = 1000, generator: torch.Generator | None = None) -> Tensor:
        """Predictive probabilities ``[n, C]`` by ``'mc'`` over the exact Gaussian or ``'probit'``."""
        f, cov = self.function_covariance(prior, x)
        if method == "probit":
            return probit_predictive(f, cov.diagonal(dim1=-2, dim2=-1))
        if method == "mc":
            return gaussian_mc_predictive(f, cov, n_samples, generator)
        raise InputError(f"must be 'mc' or 'probit', got {method!r}", field="predictive")


# ------------------------------------------------------------------------------
# other baselines


def mc_dropout_predict(model: nn.Module, x: Tensor, n_samples: int = 100,
                       seed: int = 0) -> Tensor:
    """MC dropout: mean softmax over ``n_samples`` passes with dropout active, ``[n, C]``.

    Only the dropout modules are switched to training mode; the model is
    back in eval mode afterwards.
    """
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout | nn.Dropout2d)]
    if not drops or all(m.p == 0 for m in drops):
        raise InputError("the model has no active dropout layer", field="dropout")
    model.eval()
    for m in drops:
        m.train()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(int(seed))
            acc = 0.0
            for _ in range(int(n_samples)):
                acc = acc + torch.softmax(model(x).double(), -1)
    finally:
        model.eval()
    return acc / int(n_samples)


def laplace_torch_available() -> bool:
    """Whether the optional ``laplace`` package (laplace-torch) imports here."""
    try:
        import laplace  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure (e.g. a CUDA-only torchvision)
        return False
    return True


LAPLACE_TORCH_SUBSETS = ("all", "last_layer")
LAPLACE_TORCH_STRUCTURES = ("full", "kron", "diag")


def laplace_torch_fit(model: nn.Module, x_train: Tensor, y_train: Tensor,
                      *, subset: str = "all", structure: str = "full",
                      prior_structure: str | None = None,
                      batch_size: int = 256) -> tuple:
    """laplace-torch's GGN Laplace, prior precision by its marginal likelihood, probit predictive.

    An independent implementation of the same linearised Laplace (``subset='all',
    structure='full'`` is :class:`ExactLLA`'s posterior up to the prior's
    parametrisation), and, with ``subset='last_layer', structure='kron'``, the
    library's default recipe.

    Parameters
    ----------
    model : nn.Module
        The trained classifier (not modified).
    x_train : Tensor, shape (N, 1, H, W)
    y_train : Tensor, shape (N,)
    subset : {'all', 'last_layer'}, optional
        Weights of the Laplace. Default ``'all'``.
    structure : {'full', 'kron', 'diag'}, optional
        GGN approximation. Default ``'full'``.
    prior_structure : {'scalar', 'layerwise', 'diag'}, optional
        Prior precisions tuned by laplace-torch's marginal likelihood (Adam, 100
        steps). Default ``'layerwise'`` (one per parameter tensor, closest to
        ctuq's layer-wise ARD) for ``subset='all'``, ``'scalar'`` for the last
        layer (laplace-torch's last-layer Laplace takes no layer-wise prior).
    batch_size : int, optional
        Default 256.

    Returns
    -------
    predict : callable
        ``predict(x)``: ``[n, C]`` float64 probabilities for inputs ``[n, 1, H, W]``.
    info : dict
        ``subset``, ``structure``, ``prior_structure``, ``prior_precision`` (mean),
        ``prior_precisions`` (list), ``log_marglik``, ``version``.

    Raises
    ------
    InputError
        When laplace-torch does not import, or for an unknown ``subset`` / ``structure``.
    """
    if subset not in LAPLACE_TORCH_SUBSETS:
        raise InputError(f"must be one of {', '.join(LAPLACE_TORCH_SUBSETS)}, got {subset!r}",
                         field="subset")
    if structure not in LAPLACE_TORCH_STRUCTURES:
        raise InputError(f"must be one of {', '.join(LAPLACE_TORCH_STRUCTURES)}, "
                         f"got {structure!r}", field="structure")
    if not laplace_torch_available():
        raise InputError("laplace-torch is not installed or does not import here "
                         "(see the README: install it without torchvision)", field="methods")
    import laplace

    # laplace-torch wraps the model (hooks, a feature extractor): give it a copy
    net = copy.deepcopy(model).eval()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train),
                                         batch_size=batch_size)
    la = laplace.Laplace(net, "classification", subset_of_weights=subset,
                         hessian_structure=structure)
    prior_structure = prior_structure or ("layerwise" if subset == "all" else "scalar")
    la.fit(loader, progress_bar=False)
    with warnings.catch_warnings():  # it warns on every call that probit is its default
        warnings.filterwarnings("ignore", message="By default `link_approx`")
        la.optimize_prior_precision(pred_type="glm", method="marglik",
                                    prior_structure=prior_structure, link_approx="probit")
    def predict(x: Tensor) -> Tensor:
        # no torch.no_grad(): the GLM predictive takes Jacobians by autograd
        return la(x, pred_type="glm", link_approx="probit").detach().double()

    prec = torch.as_tensor(la.prior_precision).detach().double().reshape(-1)
    return predict, {"subset": subset, "structure": structure,
                   "prior_structure": prior_structure,
                   "prior_precision": float(prec.mean()), "prior_precisions": prec.tolist(),
                   "log_marglik": float(la.log_marginal_likelihood()),
                   "version": getattr(laplace, "__version__", "unknown")}
