"""The TV term's curvature in the linearised posterior (docs/method.md §5.4).

DIP+TV fits ``‖A f(θ) − y‖²_V + γ TV(f(θ))`` (:mod:`ctuq.recon.dip`), but the
linearised posterior of :mod:`ctuq.posterior` keeps only the data term's
Gauss–Newton matrix: it does not know that TV made the fit's flat regions
flat, and on the realistic validation scans it covers 94–100 % of their pixels
at ±1σ. This module adds TV's curvature to the posterior that the predictive
samples come from:

    H = ΦᵀΦ/σ² + Σ⁻¹ + Jᵀ Dᵀ diag(c) D J,   c_k = κ γ / (2 σ_d² ξ_k),

with ``D`` the finite differences of the anisotropic TV, ``γ`` the fit's TV
weight, ``σ_d`` the noise std the fit was weighted with (so ``γ/(2σ_d²)`` is
TV's weight in the fit's negative log-posterior) and ``κ`` the setting
``tv_curvature``. ``|d|`` has no curvature away from 0; its variational bound
``|d| ≤ (d²/ξ + ξ)/2`` (the Laplace density as a scale mixture of Gaussians,
as in variational Bayesian TV) at ``ξ_k = √(d̂_k² + Var d_k)``, with ``d̂ = D x̂``
and ``Var d_k`` under the posterior without the term, gives the quadratic:
large where the fit is flat, small across its edges.

The term enters as extra rows of the likelihood's factor ``Φ``:
``√(c σ²) D J`` below ``V^{-1/2} A J`` (:class:`TVCurvatureOperator`), so any
sampler of the engine draws from the new posterior; the prior and ``σ²`` are
the EM's, unchanged. Measured on validation scans (docs/defaults.md, "TV's
curvature in the posterior"): sharper where the fit's flat regions are right,
too narrow beside thin strokes, so an option (``κ = 0`` by default).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from ctuq.errors import InputError

__all__ = ["TVCurvatureOperator", "differences", "differences_adjoint",
           "tv_curvature_weights", "with_tv_curvature"]


def differences(x: Tensor) -> Tensor:
    """``D x``: the finite differences of the anisotropic TV, ``[..., H, W]`` → ``[..., K]``.

    ``K = (H−1)·W + H·(W−1)``: first ``x[i+1, j] − x[i, j]`` (C order), then
    ``x[i, j+1] − x[i, j]``; ``Σ|D x|`` is
    :func:`~ctuq.recon.baselines.total_variation`.
    """
    lead = x.shape[:-2]
    d0 = (x[..., 1:, :] - x[..., :-1, :]).reshape(*lead, -1)
    d1 = (x[..., :, 1:] - x[..., :, :-1]).reshape(*lead, -1)
    return torch.cat([d0, d1], dim=-1)


def differences_adjoint(d: Tensor, shape: tuple[int, int]) -> Tensor:
    """``Dᵀ d``, the adjoint of :func:`differences`: ``[..., K]`` → ``[..., H, W]``."""
    h, w = shape
    lead = d.shape[:-1]
    n0 = (h - 1) * w
    d0 = d[..., :n0].reshape(*lead, h - 1, w)
    d1 = d[..., n0:].reshape(*lead, h, w - 1)
    x = d.new_zeros(*lead, h, w)
    x[..., 1:, :] += d0
    x[..., :-1, :] -= d0
    x[..., :, 1:] += d1
    x[..., :, :-1] -= d1
    return x


class TVCurvatureOperator:
    """``[B; diag(w) D]``: a linear operator's rows with weighted finite differences below.

    The range is flattened to ``(m + K, 1)`` rows (``m`` the base operator's
    range size): the mini-batch axis of a likelihood over it is the row.

    Parameters
    ----------
    operator
        The base operator (``A``, ``A_adjoint``, ``range_shape``,
        ``domain_shape``, ``device``): the likelihood's, whitened or not.
    weights : Tensor, shape (K,)
        ``w``, the weight of each difference (:func:`differences` order).
    """

    def __init__(self, operator, weights: Tensor):
        self.base = operator
        self.domain_shape = tuple(int(s) for s in operator.domain_shape)
        h, w = self.domain_shape
        k = (h - 1) * w + h * (w - 1)
        weights = torch.as_tensor(weights, dtype=torch.float32).reshape(-1)
        if weights.numel() != k:
            raise InputError(f"expected {k} weights for a {h}x{w} image, got {weights.numel()}",
                             field="weights")
        self.device = getattr(operator, "device", weights.device)
        self.weights = weights.to(self.device)
        self.base_size = math.prod(int(s) for s in operator.range_shape)
        self.range_shape = (self.base_size + k, 1)

    def A(self, x: Tensor) -> Tensor:
        lead = x.shape[:-2]
        top = self.base.A(x).reshape(*lead, -1)
        bottom = differences(x) * self.weights.to(x.dtype)
        return torch.cat([top, bottom], dim=-1).unsqueeze(-1)

    def A_adjoint(self, s: Tensor) -> Tensor:
        s = s.squeeze(-1)
        lead = s.shape[:-1]
        top = s[..., :self.base_size].reshape(*lead, *self.base.range_shape)
        bottom = s[..., self.base_size:] * self.weights.to(s.dtype)
        return self.base.A_adjoint(top) + differences_adjoint(bottom, self.domain_shape)


def tv_curvature_weights(x_hat: Tensor, difference_variance: Tensor, *, factor: float,
                         tv_weight: float, noise_std: float) -> Tensor:
    """``c_k = κ γ / (2 σ_d² ξ_k)``, ``ξ_k = √(d̂_k² + Var d_k)`` (module docstring).

    Parameters
    ----------
    x_hat : Tensor, shape (H, W)
        The fit's output ``x̂``.
    difference_variance : Tensor, shape (K,)
        ``Var d_k`` under the posterior without the term.
    factor : float
        ``κ`` (> 0).
    tv_weight : float
        ``γ`` of the fit.
    noise_std : float
        ``σ_d``, the noise std the fit's ``γ`` was set with.

    Returns
    -------
    Tensor, shape (K,), float64
    """
    if not (factor > 0 and tv_weight > 0 and noise_std > 0):
        raise InputError(f"κ, γ and σ must be positive, got {factor}, {tv_weight}, {noise_std}",
                         field="tv_curvature")
    d_hat = differences(x_hat.double())
    xi = (d_hat.square() + difference_variance.double().clamp_min(0)).sqrt()
    # a pixel pair that neither the fit nor the posterior separates: bounded by the
    # smallest positive ξ, so that no weight is infinite
    floor = xi[xi > 0].min() if bool((xi > 0).any()) else xi.new_tensor(1.0)
    return factor * tv_weight / (2.0 * noise_std**2) / xi.clamp_min(floor)


def with_tv_curvature(post, lin, *, factor: float, tv_weight: float, noise_std: float):
    """The fitted posterior with TV's curvature added (module docstring).

    ``Var d`` is read from the posterior's last E-step samples; the prior and
    ``σ²`` stay. The result draws from the new posterior (its own
    preconditioner is built at the first draw).

    Parameters
    ----------
    post : FittedPosterior
        The EM's result, with a :class:`~ctuq.posterior.LinearGaussianLikelihood`.
    lin : Linearization
    factor, tv_weight, noise_std : float
        See :func:`tv_curvature_weights`.

    Returns
    -------
    FittedPosterior
    """
    from ctuq.posterior import LinearGaussianLikelihood

    with torch.no_grad():
        # the E-step's few samples (8 at 64²) make Var d noisy: ξ comes out a little
        # small on average, the curvature a little strong (docs/defaults.md)
        d = differences(lin.jvp(post.samples.to(lin.theta_hat)).double())
        var_d = d.square().mean(0)
        c = tv_curvature_weights(lin.x_hat.reshape(lin.image_shape[-2:]), var_d,
                                 factor=factor, tv_weight=tv_weight, noise_std=noise_std)
    # the engine divides ΦᵀΦ by σ²: rows √(c σ²) D J give Jᵀ Dᵀ diag(c) D J
    weights = (c * float(post.noise_var)).sqrt()
    op = TVCurvatureOperator(post.likelihood.operator, weights)
    likelihood = LinearGaussianLikelihood(lin, op, batch_axis="rows (data, then differences)")
    return dataclasses.replace(post, likelihood=likelihood, sample_state=None)
