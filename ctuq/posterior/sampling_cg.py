"""Matheron samples by preconditioned conjugate gradients, in observation space (docs/method.md §5.1).

``θ* = Σ Φᵀ K⁻¹ ỹ`` and ``z_j = θ⁰_j − Σ Φᵀ K⁻¹ (Φ θ⁰_j + σ e_j)`` with
``K = Φ Σ Φᵀ + σ² I`` (``d_y × d_y``). The ``k + 1`` systems share one
batched, matrix-free preconditioned CG solve (per iteration one ``Φᵀ``, one
``Φ`` and one ``Σ`` product: for CT a batched VJP, a batched JVP, ``Aᵀ``
and ``A``) with a randomised Nyström preconditioner of ``Φ Σ Φᵀ`` (one
subspace iteration) applied in float64 through the Woodbury identity.
Residuals are measured in the preconditioner norm (see :func:`batched_cg`
for why).

Examples
--------
::

    post = CGSampler().sample(likelihood, prior, noise_var, 16,
                              generator=torch.Generator().manual_seed(0))
    post.theta_star, post.z, post.info["iterations"], post.info["converged"]
    again = CGSampler().sample(likelihood, prior, noise_var, 16, warm_start=post)
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.posterior.preconditioner import (NystromPreconditioner, hyper_vector,
                                          pick_preconditioner)
from ctuq.posterior.samples import (PosteriorSample, Sampler, SamplerState, WarmStart,
                                    max_residual)
from ctuq.progress import check_cancel, emit_progress

__all__ = ["CGOptions", "CGSampler", "ObservationKernel", "batched_cg"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class CGOptions:
    """Settings of the Matheron / CG sampler.

    Parameters
    ----------
    tol : float
        Stop when every right-hand side has ``‖r_j‖ ≤ tol · ‖b_j‖`` in the
        norm ``norm``. Default 1e-3.
    refine : int
        Rounds of iterative refinement after the solve, at most: the residual
        ``r_j = b_j − K x_j`` is computed in float64 (the network and the
        operator recomputed in double precision) and ``K d_j = r_j`` solved
        again in float32 (to the looser of ``tol`` and what the bound needs),
        while some ``‖r_j‖`` exceeds ``refine_tol · σ sqrt(d_y)`` and each round
        at least halves the largest; after a round the samples are formed in
        float64. A sample's error seen through the data,
        ``Φ δz_j = Φ Σ Φᵀ K⁻¹ r_j``, is at most ``‖r_j‖``: at low noise the
        float32 solve alone leaves it at the noise's size or above (float32
        products cannot resolve it; docs/dip.md §21), one or two rounds bring
        it below the bound. Where no round was needed the samples are the
        float32 solve's, unchanged. The float64 check itself is skipped where the
        solve's own float32 residual, with a bound on its round-off
        (``0.05 ε λ_max(K) ‖x_j‖``, ``λ_max`` from a preconditioner of today's
        ``K``), is already within the bound: at moderate noise every solve but
        an EM's first. Needs a likelihood that
        ``supports_float64`` (CT on the matrix backend); elsewhere it is
        skipped with a note in the log. Default 0: off.
    refine_tol : float
        The bound on ``‖r_j‖ / (σ sqrt(d_y))`` that ends the refinement.
        Default 0.1.
    norm : {'preconditioned', 'euclidean'}
        The residual norm (see :func:`batched_cg`). Default
        ``'preconditioned'``: in float32 the Euclidean residual of the
        sample systems stagnates near 1e-2 on 28² problems (round-off
        ``≈ ε λ_max(K) ‖x‖`` in the leading eigen-directions, where the
        solution is already exact), while the preconditioned residual keeps
        falling with the actual error.
    max_iter : int
        Iteration cap. Default 500.
    precond_rank : int
        Rank ``r`` of the Nyström preconditioner (capped at ``d_y``); 0
        disables preconditioning. Default 200.
    precond_oversample : int
        Extra random directions in the Nyström sketch (the ``r`` largest
        eigenpairs of a rank ``r + oversample`` sketch are kept). Default 10.
    precond_power_iters : int
        Subspace iterations of the sketch (see
        :meth:`NystromPreconditioner.build`). Default 1.
    precond_max_rank : int or None
        Adaptive rank: the rank doubles from ``precond_rank`` up to this while
        the smallest kept eigenvalue exceeds ``precond_max_ratio · σ²``
        (:meth:`NystromPreconditioner.grown`), at a fresh build and whenever
        a reused sketch is still exact (a rescaled g-prior). Default None: the
        rank stays ``precond_rank``.
    precond_max_ratio : float or None
        The bound on ``λ_r / σ²``. Default 100. None: the rank grows only on
        ``precond_grow_after``.
    precond_grow_after : int or None
        Adaptive rank, on the solve itself: a solve still above ``tol`` after
        this many iterations (or stagnating earlier) stops, the preconditioner
        is remade for the current prior with twice the rank (at most
        ``precond_max_rank``; a kept sketch keeps its products) and the solve
        continues from its best iterate; at the largest rank it has
        ``max_iter`` iterations. The bound ``λ_r/σ²`` reads the Nyström
        approximation's own smallest eigenvalue, which can look small while
        the preconditioned system is still far from well conditioned; the
        iterations a solve needs do not mislead. Default None: off.
    reuse_preconditioner : bool
        With a ``warm_start``, reuse its preconditioner while no prior
        hyperparameter moved by more than ``reuse_tol`` in log space (the
        noise variance enters the Woodbury formula at apply time, so it may
        change freely). Default True.
    reuse_tol : float
        Default 3.0 (a factor ≈ 20). A stale preconditioner still
        preconditions: on the 64² demo, reusing the first EM step's sketch
        for all later steps took CG from 8 to at most 16 iterations
        (≈ 0.45 s each) where a rebuild costs ≈ 11 s (220 products).
    patience : int or None
        Stop when the residual stagnates (see :func:`batched_cg`). Default 50.
    true_residual : bool
        Report the recomputed residual ``‖b − K x‖`` (one extra product).
        Default True.
    check_every : int
        Iterations between convergence checks (each is one host sync).
        Default 1.
    progress_every : int
        Iterations between progress reports. Default 10.
    """

    tol: float = 1e-3
    max_iter: int = 500
    refine: int = 0
    refine_tol: float = 0.1
    patience: int | None = 50
    true_residual: bool = True
    norm: str = "preconditioned"
    precond_rank: int = 200
    precond_oversample: int = 10
    precond_power_iters: int = 1
    precond_max_rank: int | None = None
    precond_max_ratio: float | None = 100.0
    precond_grow_after: int | None = None
    reuse_preconditioner: bool = True
    reuse_tol: float = 3.0
    check_every: int = 1
    progress_every: int = 10

    @property
    def adapts_rank(self) -> bool:
        """Whether the Nyström rank may grow (``precond_max_rank`` above ``precond_rank``):
        then the sketch is kept so that it can be extended."""
        return self.precond_max_rank is not None and self.precond_max_rank > self.precond_rank



class ObservationKernel:
    """Matrix-free ``K = Φ Σ Φᵀ + σ² I`` on flat observation-space vectors ``[m, d_y]``.

    ``P(X) = Φ Σ Φᵀ X`` costs one ``Φᵀ``, one ``Σ`` and one ``Φ`` product;
    ``K(X) = P(X) + σ² X``.
    """

    def __init__(self, likelihood, prior, noise_var: float):
        self.likelihood, self.prior = likelihood, prior
        self.noise_var = float(noise_var)
        self.obs_shape = tuple(likelihood.obs_shape)
        self.d_y = likelihood.d_obs

    def P(self, X: Tensor) -> Tensor:
        m = X.shape[0]
        with torch.no_grad():
            g = self.likelihood.phi_t(X.view(m, *self.obs_shape))
            g = self.prior.cov(g)
            return self.likelihood.phi(g).reshape(m, self.d_y)

    def __call__(self, X: Tensor) -> Tensor:
        out = self.P(X)
        return out.add_(X, alpha=self.noise_var)

    def sigma_phi_t(self, X: Tensor) -> Tensor:
        """``Σ Φᵀ X``: ``[m, d_y]`` → ``[m, d_θ]``."""
        with torch.no_grad():
            return self.prior.cov(self.likelihood.phi_t(X.view(X.shape[0], *self.obs_shape)))


def batched_cg(apply_K: Callable[[Tensor], Tensor], B: Tensor, *, X0: Tensor | None = None,
               precond: Callable[[Tensor], Tensor] | None = None, tol: float = 1e-3,
               max_iter: int = 500, check_every: int = 1, patience: int | None = 50,
               true_residual: bool = True, norm: str = "preconditioned",
               callback: Callable[[int, float], None] | None = None) -> tuple[Tensor, dict]:
    """Preconditioned conjugate gradients for ``K X = B``, one system per row.

    Rows that reach the tolerance are frozen (their step size is set to 0),
    so every row stops at its own tolerance while the batch runs on.

    Parameters
    ----------
    apply_K : callable
        ``[m, n]`` → ``[m, n]``, symmetric positive definite, row-wise.
    B : Tensor, shape (m, n)
    X0 : Tensor, optional
        Initial guess (default zeros).
    precond : callable, optional
        ``[m, n]`` → ``[m, n]``, an SPD approximation of ``K⁻¹``.
    tol : float
        Relative residual ``‖r_j‖ / ‖b_j‖`` to reach for every row (in the
        norm chosen by ``norm``). Default 1e-3.
    norm : {'preconditioned', 'euclidean'}
        ``'preconditioned'`` (default): ``‖r‖_{M⁻¹} / ‖b‖_{M⁻¹}`` with
        ``‖r‖²_{M⁻¹} = rᵀ M⁻¹ r`` (free in PCG). With a good preconditioner
        ``M⁻¹ ≈ c K⁻¹`` this is the relative energy-norm error of the solution
        ``‖x − x*‖_K / ‖x*‖_K`` up to a factor ``sqrt(cond(M⁻¹K))``: it
        measures the error that reaches the samples, and it is not held up by
        float32 round-off in the leading eigen-directions of ``K`` (where
        the Euclidean residual stagnates at ``≈ ε · λ_max · ‖x‖`` while the
        solution there is already exact). ``'euclidean'``: ``‖r‖ / ‖b‖``.
        Without a preconditioner both are Euclidean.
    max_iter : int
    check_every : int
        Convergence is checked (a host sync) every this many iterations.
    patience : int or None
        Stop early (not converged) when the largest residual has not reached
        a new minimum in this many checks: in float32 the residual stagnates
        at a floor set by the round-off of ``apply_K``, or wanders upwards
        where ``K`` is too ill-conditioned for float32 (low noise). A stopped
        solve returns each row's iterate at its smallest checked residual.
        Default 50.
    true_residual : bool
        Recompute ``B − K X`` when the recursive residuals reach ``tol``
        (one more product) and report it; if some row is still above
        ``tol`` (float32 drift), restart from the true residual (at most
        twice). Otherwise the recursively updated residual is reported.
        Default True.
    callback : callable, optional
        ``callback(iteration, max_relative_residual)`` after every check.

    Returns
    -------
    X : Tensor, shape (m, n)
    info : dict
        ``iterations``, ``converged`` (every row's final residual ≤ tol),
        ``residuals`` (final relative residual per row in the chosen norm,
        CPU tensor), ``residuals_euclidean``, ``restarts``,
        ``residual_history`` (max relative recursive residual at each
        check), ``stagnated``, ``norm``.
    """
    if norm not in ("preconditioned", "euclidean"):
        raise InputError(f"must be 'preconditioned' or 'euclidean', got {norm!r}", field="norm")
    use_m = norm == "preconditioned" and precond is not None
    tiny = torch.finfo(B.dtype).tiny
    m = B.shape[0]

    def rel_norm(R_: Tensor, RZ: Tensor | None, denom: Tensor) -> Tensor:
        num = RZ.clamp_min(0).sqrt() if use_m else R_.norm(dim=1)
        return num / denom

    b_euc = B.norm(dim=1).clamp_min(tiny)
    b_den = (B * precond(B)).sum(1).clamp_min(tiny).sqrt() if use_m else b_euc
    if X0 is None:
        X = torch.zeros_like(B)
        R = B.clone()
    else:
        X = X0.clone()
        R = B - apply_K(X)
    history: list[float] = []
    best, since_best = math.inf, 0
    # each row's iterate at its smallest checked residual: a stagnating solve in float32
    # (low noise, an ill-conditioned K) can wander far above it, even above ‖b‖
    X_best, rel_best = X.clone(), torch.full((m,), math.inf, dtype=B.dtype, device=B.device)

    def keep_best(rel_: Tensor) -> None:
        better = rel_ < rel_best
        X_best[better] = X[better]
        torch.minimum(rel_, rel_best, out=rel_best)

    it, stagnated, restarts = 0, False, 0
    zero = torch.zeros(m, dtype=B.dtype, device=B.device)
    one = torch.ones_like(zero)
    while True:
        # (re)start from the current residual R
        Z = precond(R) if precond is not None else R.clone()
        P = Z.clone()
        rz = (R * Z).sum(1)
        rel = rel_norm(R, rz, b_den)
        keep_best(rel)
        active = rel > tol
        history.append(float(rel.max()) if m else 0.0)
        while bool(active.any()) and it < max_iter:
            KP = apply_K(P)
            pkp = (P * KP).sum(1)
            ok = active & (pkp > 0) & torch.isfinite(pkp)
            alpha = torch.where(ok, rz / torch.where(ok, pkp, one), zero)
            X.addcmul_(alpha.unsqueeze(1), P)
            R.addcmul_(alpha.unsqueeze(1), KP, value=-1.0)
            it += 1
            active = active & ok  # a breakdown (pkp ≤ 0 from round-off) freezes the row
            Z = precond(R) if precond is not None else R
            rz_new = (R * Z).sum(1)
            if it % check_every == 0 or it == max_iter:
                rel = rel_norm(R, rz_new, b_den)
                keep_best(rel)
                active = active & (rel > tol)
                rmax = float(rel.max())
                history.append(rmax)
                if callback is not None:
                    callback(it, rmax)
                if rmax < best * 0.999:
                    best, since_best = rmax, 0
                else:
                    since_best += 1
                    if patience is not None and since_best >= patience:
                        stagnated = True
                        # info, not a warning: the caller warns when the solve ends
                        # above tol (a sampler with an adaptive rank grows it and goes on)
                        log.info("CG stagnated at relative residual %.2e after %d "
                                 "iterations", rmax, it)
                        break
            beta = torch.where(active, rz_new / torch.where(active, rz, one), zero)
            P.mul_(beta.unsqueeze(1)).add_(Z)
            rz = rz_new
        if stagnated:  # back to each row's best iterate, its residual recomputed
            X = X_best
            R = B - apply_K(X)
            break
        if not true_residual:
            break
        # residual replacement: the recursive residual drifts in float32; restart from
        # the true one while some row is above tol (at most 2 restarts)
        R = B - apply_K(X)
        rel_true = rel_norm(R, (R * precond(R)).sum(1) if use_m else None, b_den)
        if bool((rel_true <= tol).all()) or it >= max_iter or stagnated or restarts >= 2:
            break
        restarts += 1
    final_euc = (R.norm(dim=1) / b_euc).detach().cpu()
    final = rel_norm(R, (R * precond(R)).sum(1) if use_m else None, b_den).detach().cpu()
    return X, {"iterations": it, "converged": bool((final <= tol).all()),
               "residuals": final, "residuals_euclidean": final_euc,
               "restarts": restarts, "residual_history": history,
               "stagnated": stagnated, "norm": norm if use_m else "euclidean"}



# The float32 round-off of ``b − K x`` per row, over ``ε λ_max(K) ‖x‖``: at most 0.014 measured
# on the 28² toy (noise ×1 … ×0.01) and a 64² DIP+TV scan at 1 % noise (every solve of its EM
# and predictive); taken with a margin of about 3.5
_ROUNDOFF_FACTOR = 0.05


def _float32_roundoff(X: Tensor, lambda_max: float) -> Tensor:
    """A bound on each row's float32 round-off in ``K x``: ``0.05 ε λ_max(K) ‖x‖``."""
    eps = torch.finfo(torch.float32).eps
    return _ROUNDOFF_FACTOR * eps * lambda_max * X.double().norm(dim=1).cpu()


def _stage(options: CGOptions, kern: ObservationKernel, B: Tensor, precond, noise_var: float,
           *, tol: float, max_iter: int, X0: Tensor | None = None,
           callback=None) -> tuple[Tensor, dict, int]:
    """One :func:`batched_cg` run of ``K X = B`` with ``options``' solver settings and the
    Nyström ``precond`` (or none): ``(X, info, K products)``. Every iteration is one
    product; a run adds one for a warm start's initial residual and one per true
    residual it recomputed."""
    X, info = batched_cg(kern, B, X0=X0,
                         precond=(lambda R: precond(R, noise_var))
                         if precond is not None else None,
                         tol=tol, max_iter=max_iter, check_every=options.check_every,
                         patience=options.patience, true_residual=options.true_residual,
                         norm=options.norm, callback=callback)
    products = (info["iterations"] + (X0 is not None)
                + bool(options.true_residual) * (1 + info["restarts"]))
    return X, info, products


def _nystrom(options: CGOptions, kern: ObservationKernel, hyper, rank: int, gen, progress,
             cancel, stage: str, keep: bool) -> NystromPreconditioner:
    """The Nyström preconditioner of ``kern.P`` at ``rank`` with ``options``' sketch settings
    (``keep``: keep the sketch so that the rank may grow)."""
    lik = kern.likelihood
    pc = NystromPreconditioner.build(
        kern.P, kern.d_y, rank, oversample=options.precond_oversample,
        power_iters=options.precond_power_iters, generator=gen, device=lik.device,
        chunk=lik.lin.chunk_size, hyper=hyper, cancel=cancel, progress=progress, stage=stage,
        keep_sketch=keep)
    log.debug("Nyström preconditioner rank %d in %.2f s, λ = %.3g … %.3g",
              pc.rank, pc.build_time, float(pc.eigvals[0]), float(pc.eigvals[-1]))
    return pc


class CGSampler(Sampler):
    """The Matheron / CG sampler (module docstring); settings in :class:`CGOptions`.

    See :meth:`ctuq.posterior.samples.Sampler.sample` for the call.
    """

    method = "cg"
    options_class = CGOptions

    def observation_sketch(self, likelihood, prior, noise_var: float, *,
                           generator: torch.Generator | None = None, progress=None,
                           cancel=None, stage: str = "sampling") -> NystromPreconditioner | None:
        """The Nyström preconditioner of today's ``P = Φ Σ Φᵀ`` at ``precond_rank``.

        What the first call of :meth:`sample` would build; passed back as its
        ``start_preconditioner`` it is used (rescaled when only a common prior
        scale moved) instead of a new sketch. None when ``precond_rank`` is 0.
        """
        opts = self.options
        if opts.precond_rank <= 0:
            return None
        kern = ObservationKernel(likelihood, prior, noise_var)
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        return _nystrom(opts, kern, hyper_vector(prior), opts.precond_rank, gen, progress,
                        cancel, stage, keep=opts.adapts_rank)

    @staticmethod
    def _is_current(precond, prior) -> bool:
        """Whether ``precond``'s sketch is of today's ``P`` (fresh, rescaled, or nothing moved)."""
        return precond.hyper is not None and torch.equal(precond.hyper, hyper_vector(prior))

    def _grow(self, precond, prior, noise_var, kern, build, max_rank):
        """``precond`` with twice its rank (at most ``max_rank``) for today's ``P``: its kept
        sketch extended where it is current, else a fresh build at that rank."""
        rank = min(2 * precond.rank, int(max_rank), kern.d_y)
        log.info("CG slow at Nyström rank %d: rank %d", precond.rank, rank)
        if precond.sketch is not None and self._is_current(precond, prior):
            return precond.grown(rank, -math.inf, noise_var, kern.P)
        return build(hyper_vector(prior), rank)

    @staticmethod
    def _refine(options, kern, rhs, X, precond, noise_var, callback, *,
                residual32: Tensor | None = None,
                lambda_max: float | None = None) -> tuple[Tensor, dict]:
        """``X`` refined in float64 (:class:`CGOptions` ``refine``) and the record:
        ``rounds``, ``iterations`` (of the correction solves), ``products`` (K products,
        the float64 ones included), ``data_error`` (the largest ``‖r_j‖ / (σ sqrt(d_y))``
        at the end, a bound on the samples' error seen through the data),
        ``data_error_start`` (the same before refining), ``checked`` ('float32': the
        solve's own float32 residual with its round-off bound certified it, no float64
        product made; 'float64') and ``supported`` (False: the likelihood cannot
        compute in float64, nothing done).

        ``residual32`` (each row's ``‖b_j − K x_j‖`` as the solve computed it in float32)
        and ``lambda_max`` (``λ_max(K)``, from a preconditioner of today's ``K``) allow the
        float32 certificate; without them the check is made in float64."""
        if not kern.likelihood.supports_float64:
            log.info("CG refinement skipped: the likelihood does not compute in float64")
            return X, {"supported": False, "checked": None, "rounds": 0, "iterations": 0,
                       "products": 0, "data_error": None, "data_error_start": None}
        noise_norm = math.sqrt(noise_var * kern.d_y)
        bound = options.refine_tol * noise_norm
        if residual32 is not None and lambda_max is not None:
            # ‖r_j‖ ≤ its float32 value + the float32 product's round-off; where that is
            # within the bound the float64 check (several float32 products' cost on a
            # CPU) is not needed: at moderate noise, every solve but an EM's first
            certified = residual32.double().cpu() + _float32_roundoff(X, lambda_max)
            if bool((certified <= bound).all()):
                worst = float(certified.max()) / noise_norm
                return X, {"supported": True, "checked": "float32", "rounds": 0,
                           "iterations": 0, "products": 0, "data_error": worst,
                           "data_error_start": worst}
        B, X = rhs.double(), X.double()
        rounds = iterations = products = 0
        start = last = None
        while True:
            R = B - kern(X)
            products += 1
            rn = R.norm(dim=1)
            worst = float(rn.max())
            start = worst if start is None else start
            todo = rn > bound
            if not bool(todo.any()) or rounds >= options.refine:
                break
            if last is not None and worst > 0.5 * last:
                # the correction solve stalls (a preconditioner far from this K, as at an
                # EM's first noise level): more rounds would cost without helping
                log.info("CG refinement stopped: no progress in round %d", rounds)
                break
            last = worst
            # a row already within the bound gets a zero right-hand side: done at once
            scale = torch.where(todo, rn, torch.ones_like(rn)).unsqueeze(1)
            # the correction need only shrink the residual to the bound (a next round
            # checks it): on the 28² toy at a thirtieth of its noise this halves its
            # iterations against the outer solve's tolerance
            corr_tol = min(0.1, max(options.tol, 0.5 * bound / worst))
            D, info, n = _stage(options, kern, (R * todo.unsqueeze(1) / scale).to(rhs.dtype),
                                precond, noise_var, tol=corr_tol, max_iter=options.max_iter,
                                callback=callback)
            X = X + D.double() * scale
            rounds += 1
            iterations += info["iterations"]
            products += n
        log.info("CG refinement: %d rounds, %d iterations; data-space error at most %.2e of "
                 "the noise's norm (%.2e before)", rounds, iterations,
                 worst / noise_norm, start / noise_norm)
        if rounds == 0:
            # nothing corrected: the samples stay those of the float32 solve, formed in
            # float32 (a float64 product costs several float32 ones on a CPU)
            X = X.to(rhs.dtype)
        return X, {"supported": True, "checked": "float64", "rounds": rounds,
                   "iterations": iterations, "products": products,
                   "data_error": worst / noise_norm,
                   "data_error_start": start / noise_norm}

    def _solve(self, options, likelihood, prior, noise_var, u, e, gen, warm: WarmStart,
               theta_star0, z0, progress, cancel, stage) -> PosteriorSample:
        t0 = time.perf_counter()
        kern = ObservationKernel(likelihood, prior, noise_var)
        sigma = math.sqrt(noise_var)
        k = u.shape[0]
        m = 0 if likelihood.target is None else 1
        with torch.no_grad():
            theta0 = prior.cov_sqrt(u)
            y_tilde = None if m == 0 else likelihood.target.reshape(1, kern.d_y)
            if k:
                rows = likelihood.phi(theta0).reshape(k, -1) + sigma * e
                rhs = rows if y_tilde is None else torch.cat([y_tilde, rows])
            else:
                rhs = y_tilde.clone()

        precond = None
        adaptive = options.adapts_rank

        def build(hyper, rank=options.precond_rank):
            return _nystrom(options, kern, hyper, rank, gen, progress, cancel, stage,
                            keep=adaptive)

        if options.precond_rank > 0 or warm.forced:
            precond = pick_preconditioner(
                warm.preconditioner, warm.forced, prior,
                options.reuse_tol if options.reuse_preconditioner else None, build)
            if (adaptive and options.precond_max_ratio is not None and not warm.forced
                    and self._is_current(precond, prior)):
                # a kept sketch of this very P (fresh, rescaled, or nothing moved) grows
                # while λ_r/σ² is above the bound
                precond = precond.grown(options.precond_max_rank, options.precond_max_ratio,
                                        noise_var, kern.P)
        t_setup = time.perf_counter() - t0

        X0 = None
        if warm.theta_star is not None or warm.samples is not None:
            X0 = torch.zeros_like(rhs)
            if warm.theta_star is not None:
                X0[0] = warm.theta_star
            if warm.samples is not None:
                X0[m:] = warm.samples
        total = options.max_iter
        done = 0  # iterations of the stages before this one (a grown rank's restart)

        def callback(it, rmax):
            check_cancel(cancel, "posterior sampling")
            if (done + it) % options.progress_every == 0:
                emit_progress(progress, stage, done + it, total,
                              f"CG iteration {done + it}, residual {rmax:.2e}")

        t1 = time.perf_counter()
        growths, products, t_grow = [], 0, 0.0
        while True:
            can_grow = (adaptive and options.precond_grow_after is not None
                        and precond is not None and not warm.forced
                        and precond.rank < min(options.precond_max_rank, kern.d_y))
            X, info, n = _stage(options, kern, rhs, precond, noise_var, X0=X0,
                                tol=options.tol,
                                max_iter=(min(options.precond_grow_after, options.max_iter)
                                          if can_grow else options.max_iter),
                                callback=callback)
            done += info["iterations"]
            products += n
            if info["converged"] or not can_grow:
                break
            growths.append({"rank": precond.rank, "iterations": info["iterations"],
                            "residual": max_residual(info)})
            t2 = time.perf_counter()
            precond = self._grow(precond, prior, noise_var, kern, build,
                                 options.precond_max_rank)
            t_grow += time.perf_counter() - t2
            X0 = X
        info["iterations"] = done
        refined = None
        if options.refine > 0:
            # the solve's last residual is a recomputed one with true_residual (or after
            # a stagnation), else the recursion's, which drifts: then no float32 check
            exact_r = options.true_residual or info["stagnated"]
            current = precond is not None and self._is_current(precond, prior)
            X, refined = self._refine(
                options, kern, rhs, X, precond, noise_var, callback,
                residual32=(info["residuals_euclidean"] * rhs.norm(dim=1).cpu()
                            if exact_r else None),
                lambda_max=(float(precond.eigvals.max()) + noise_var if current else None))
            products += refined["products"]
        t_solve = time.perf_counter() - t1 - t_grow  # the sketches count as setup
        t_setup += t_grow
        W = kern.sigma_phi_t(X)
        if refined is not None and refined["checked"] == "float64":
            # the float64 network's forward pass is not needed until the next solve's check
            likelihood.release_float64()
        theta_star = W[0].to(theta0.dtype) if m else None
        z = (theta0.to(W.dtype) - W[m:]).to(theta0.dtype)
        X = X.to(rhs.dtype)
        emit_progress(progress, stage, info["iterations"], total,
                      f"CG done: {info['iterations']} iterations")
        if not info["converged"]:
            log.warning("CG did not reach tol %.1e in %d iterations (max residual %.2e)",
                        options.tol, info["iterations"], max_residual(info))
        info.update(method="cg", time_setup=t_setup, time_solve=t_solve,
                    time_per_iteration=t_solve / max(1, products),
                    precond_rank=precond.rank if precond is not None else 0,
                    precond_ratio=precond.ratio(noise_var) if precond is not None else None,
                    precond_time=precond.build_time if precond is not None else 0.0,
                    precond_growths=growths, noise_var=noise_var, refine=refined)
        state = SamplerState("cg", u, e, X, precond)
        # ỹ − Φθ* = σ² K⁻¹ỹ exactly; from the solve, σ² v errs by σ² (v − v*) where
        # ỹ − Φ ΣΦᵀ v would also carry the whole CG residual ỹ − K v
        resid = noise_var * X[0].reshape(likelihood.target.shape) if m else None
        return PosteriorSample(theta_star, z, theta0, info, state, data_residual=resid)
