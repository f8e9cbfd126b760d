"""Posterior samples of the linearised model: the result type and the common sampler driver.

For a likelihood with factor ``Φ``, data target ``ỹ`` (if any), noise
variance ``σ²`` and prior ``N(0, Σ)`` (docs/method.md §5):

    H  = Φᵀ Φ / σ² + Σ⁻¹,     θ* = H⁻¹ Φᵀ ỹ / σ²,     z ~ N(0, H⁻¹).

A sampler returns ``θ*`` (when the likelihood has a target; else the
posterior is centred on ``likelihood.mode``) and ``k`` zero-mean samples
``z``. Every sampler maps the same standard-normal draws ``(u, e)``
(``θ⁰ = L u`` with ``Σ = L Lᵀ``, noise ``σ e``) to the same sample

    z = θ⁰ − Σ Φᵀ K⁻¹ (Φ θ⁰ + σ e),     K = Φ Σ Φᵀ + σ² I,

so that the samplers of :mod:`ctuq.posterior.sampling_cg`,
:mod:`ctuq.posterior.sampling_sto` and the dense
:class:`ctuq.posterior.evidence_oracle.DenseSampler` agree draw by draw.

All samplers are warm-startable (EM steps): pass the previous
:class:`PosteriorSample` as ``warm_start``. Its ``θ*`` solution and
preconditioner carry over; with the same ``k`` (and ``redraw=False``) so do
its draws and sample solutions.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ctuq.errors import InputError

__all__ = ["PosteriorSample", "SamplerState", "WarmStart", "Sampler", "max_residual"]

log = logging.getLogger(__name__)


def max_residual(info: dict) -> float | None:
    """The largest relative residual a sampler's solve ended with (None if not reported)."""
    r = info.get("residuals")
    if torch.is_tensor(r):
        return float(r.max()) if r.numel() else None
    return None


@dataclass
class SamplerState:
    """What a later call needs to warm-start (kept inside :class:`PosteriorSample`).

    Attributes
    ----------
    method : str
    base_u : Tensor, shape (k, d_θ)
        Standard normals of the prior draws, ``θ⁰ = L u``.
    base_e : Tensor, shape (k, d_y)
        Standard normals of the noise draws, ``ε = σ e`` (flat observation space).
    solution : Tensor
        CG: ``K⁻¹ b`` for the right-hand sides ``[ỹ; Φθ⁰ + σe]``, ``[m+k, d_y]``.
        STO: the whitened iterates ``w`` (``[θ*; z] = L w``), ``[m+k, d_θ]``
        (``m = 1`` with a data target, else 0).
    preconditioner : NystromPreconditioner or None
    anchor : Tensor or None
        STO: the whitened anchors ``wⁿ`` of the samples, ``[k, d_θ]``.
    """

    method: str
    base_u: Tensor
    base_e: Tensor
    solution: Tensor
    preconditioner: object | None = None
    anchor: Tensor | None = None


@dataclass
class PosteriorSample:
    """Result of a sampler.

    Attributes
    ----------
    theta_star : Tensor, shape (d_θ,), or None
        The linear-model mode ``θ*``; None when the likelihood has no target.
    z : Tensor, shape (k, d_θ)
        Zero-mean samples ``z ~ N(0, H⁻¹)``.
    theta0 : Tensor, shape (k, d_θ)
        The prior draws ``θ⁰`` behind the samples.
    info : dict
        ``method``, ``k``, ``iterations``, ``converged`` (bool), ``residuals``
        (final relative residual per right-hand side, ``θ*`` first when there
        is one), ``time`` (s) and sampler specific entries.
    state : SamplerState
        Pass the whole result as ``warm_start`` to the next call.
    data_residual : Tensor, shape (d_y,), or None
        ``ỹ − Φθ*`` as the sampler knows it best (the CG sampler: ``σ² v`` with
        ``v = K⁻¹ỹ`` its observation-space solution, which does not carry the
        solve's residual ``ỹ − K v``; where ``Φθ*`` nearly equals ``ỹ``, at low
        noise, the difference ``ỹ − Φθ*`` is mostly that residual). None: the
        statistics compute ``ỹ − Φθ*``.
    """

    theta_star: Tensor | None
    z: Tensor
    theta0: Tensor
    info: dict
    state: SamplerState
    data_residual: Tensor | None = None

    @property
    def k(self) -> int:
        return int(self.z.shape[0])


@dataclass
class WarmStart:
    """A previous solution, resolved for one call (internal to the samplers)."""

    theta_star: Tensor | None  # the θ* row of a previous solution
    samples: Tensor | None  # the sample rows (only with the same draws)
    preconditioner: object | None
    forced: bool  # passed explicitly: use as it is


class Sampler:
    """Common driver of the samplers: checks, base draws, warm starts, timing.

    Subclasses set ``method`` and ``options_class`` and implement :meth:`_solve`.

    Parameters
    ----------
    options : optional
        An instance of the subclass's ``options_class`` (default: its defaults).
    """

    method = ""
    options_class: type = object

    def __init__(self, options=None):
        if options is not None and not isinstance(options, self.options_class):
            raise InputError(f"expected {self.options_class.__name__}, got "
                             f"{type(options).__name__}", field="options")
        self.options = options if options is not None else self.options_class()

    def sample(self, likelihood, prior, noise_var, k: int, *,
               generator: torch.Generator | None = None,
               warm_start: PosteriorSample | None = None, redraw: bool = False,
               theta_star0: Tensor | None = None, z0: Tensor | None = None,
               preconditioner=None, start_preconditioner=None, progress=None,
               cancel=None, stage: str = "sampling") -> PosteriorSample:
        """``θ*`` (with a target) and ``k`` zero-mean posterior samples ``z ~ N(0, H⁻¹)``.

        Parameters
        ----------
        likelihood : Likelihood
            ``Φ``, the target and the mini-batch axis.
        prior : GaussianPrior
        noise_var : float
            ``σ²`` (1 for a likelihood without a noise parameter).
        k : int
            Number of samples (≥ 0; ≥ 1 without a target).
        generator : torch.Generator, optional
            CPU generator of every random draw (prior draws, noise, sketches,
            mini-batches). Default: a fresh one seeded with 0.
        warm_start : PosteriorSample, optional
            A previous result of the same method: its ``θ*`` solution starts
            the ``θ*`` system and its preconditioner is reused while the prior
            moved little (``reuse_tol``). With the same ``k`` and ``redraw``
            False its draws are reused and its sample solutions start the
            sample systems. A result of another method is ignored (logged).
        redraw : bool
            Fresh draws even when ``warm_start`` has the same ``k``. Default False.
        theta_star0, z0 : Tensor, optional
            STO only: initial ``θ*`` ``[d_θ]`` and samples ``[k, d_θ]`` in
            parameter space (override ``warm_start``'s).
        preconditioner : NystromPreconditioner, optional
            Use this one as it is (CG: of ``Φ Σ Φᵀ``; STO: of ``Lᵀ Φᵀ Φ L``).
        start_preconditioner : NystromPreconditioner, optional
            Where neither ``preconditioner`` nor ``warm_start`` gives one: start
            from this one as from a previous call's (rescaled, reused or rebuilt
            as the prior moved since it was built; e.g.
            :meth:`~ctuq.posterior.sampling_cg.CGSampler.observation_sketch`).
        progress, cancel : callable, optional
            See :mod:`ctuq.progress`; stage ``stage``.

        Raises
        ------
        InputError
            Bad noise variance, ``k`` or prior size.
        Cancelled
            When ``cancel()`` returned True.
        """
        noise_var = float(noise_var)
        if not (math.isfinite(noise_var) and noise_var > 0):
            raise InputError(f"must be a positive number, got {noise_var!r}",
                             field="noise_var")
        k = int(k)
        has_target = likelihood.target is not None
        if k < (0 if has_target else 1):
            raise InputError(f"must be >= {0 if has_target else 1}, got {k}", field="k")
        if prior.num_params != likelihood.num_params:
            raise InputError(f"prior has {prior.num_params} parameters, the linearisation "
                             f"{likelihood.num_params}", field="prior")
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        device = likelihood.device
        t0 = time.perf_counter()

        if warm_start is not None and warm_start.state.method != self.method:
            log.warning("warm start ignored: it comes from method %r, this call is %r",
                        warm_start.state.method, self.method)
            warm_start = None
        d_y = likelihood.d_obs
        reuse_draws = (warm_start is not None and warm_start.k == k and not redraw
                       and warm_start.state.base_e.shape[-1] == d_y)
        if reuse_draws:
            u, e = warm_start.state.base_u, warm_start.state.base_e
        else:
            u = torch.randn(k, likelihood.num_params, generator=gen).to(device)
            e = torch.randn(k, d_y, generator=gen).to(device)
        m = 1 if has_target else 0
        warm = WarmStart(None, None, preconditioner if preconditioner is not None
                         else start_preconditioner, preconditioner is not None)
        if warm_start is not None:
            sol = warm_start.state.solution
            warm.theta_star = sol[0] if m and sol.shape[0] else None
            warm.samples = sol[m:] if reuse_draws else None
            if preconditioner is None and warm_start.state.preconditioner is not None:
                warm.preconditioner = warm_start.state.preconditioner
        res = self._solve(self.options, likelihood, prior, noise_var, u, e, gen, warm,
                          theta_star0, z0, progress, cancel, stage)
        res.info["time"] = time.perf_counter() - t0
        res.info["k"] = k
        log.info("%s sampler: k=%d, %d iterations, converged %s, max residual %.2e, %.2f s",
                 self.method, k, res.info["iterations"], res.info["converged"],
                 max_residual(res.info) or 0.0,
                 res.info["time"])
        return res

    def _solve(self, options, likelihood, prior, noise_var: float, u: Tensor, e: Tensor,
               gen, warm: WarmStart, theta_star0, z0, progress, cancel,
               stage: str) -> PosteriorSample:  # pragma: no cover - abstract
        """One solve with the base draws ``u`` (``[k, d_θ]``) and ``e`` (``[k, d_y]``)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"
