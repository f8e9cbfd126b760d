"""Predictive distributions of the linearised classifier and their tuning (docs/method.md §8.3).

Monte Carlo over linearised logits ``f(x, θ̂) + J(x) z_s``
(:func:`function_samples`, :func:`mc_predictive`) or the probit
approximation ``softmax(f / sqrt(1 + π/8 · diag Σ(x)))``
(:func:`probit_predictive`), ``Σ(x) = J(x) H⁻¹ J(x)ᵀ``. Optionally the
spread is rescaled, ``f + t · J(x) z_s``, with ``t`` tuned on held-out data
(:func:`tune_predictive_scale`; covariance ``t² H⁻¹``, no new samples), or
the prior precision of the exact LLA is multiplied by a tuned ``c``
(:func:`tune_prior_scale`); temperature scaling of the MAP logits
(:func:`tune_temperature`) is the non-Bayesian baseline.
"""

from __future__ import annotations

import math

import torch
from scipy.optimize import minimize_scalar
from torch import Tensor, nn

from ctuq.errors import InputError
from ctuq.posterior import ClassifierLinearization

__all__ = ["function_samples", "mc_predictive", "scaled_mc_predictive", "scaled_predictive_nll",
           "tune_predictive_scale", "scaled_prior_covariance", "tune_prior_scale",
           "sample_function_variance", "probit_predictive", "gaussian_mc_predictive",
           "gaussian_deviations", "tune_temperature"]


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
