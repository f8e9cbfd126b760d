"""Sample-then-optimise: posterior samples by optimisation in parameter space (docs/method.md §5.2).

The sample ``z_j`` is the minimiser of the variance-reduced objective

    L'(z) = ½ ‖Φ z‖² / σ² + ½ ‖z − θⁿ_j‖²_{Σ⁻¹},   θⁿ_j = θ⁰_j − Σ Φᵀ e_j / σ

(the noise moved out of the data term into the anchor ``θⁿ``), whose
minimiser is the Matheron sample ``θ⁰_j − Σ Φᵀ K⁻¹ (Φ θ⁰_j + σ e_j)`` of the
same draws; with a data target, ``θ*`` minimises
``½ ‖ỹ − Φ θ‖² / σ² + ½ ‖θ‖²_{Σ⁻¹}`` in the same run (row 0). One solver
loop (:func:`nesterov_polyak`): SGD with Nesterov momentum, gradient
clipping, linear learning-rate decay and Polyak averaging, optionally
mini-batched over the likelihood's batch axis (projection angles, data
points). It runs in prior-whitened coordinates ``z = L w``, where the Hessian
``I + LᵀΦᵀΦL/σ²`` has smallest eigenvalue 1 (which fixes the momentum), and
by default with a Nyström preconditioner of ``LᵀΦᵀΦL``: plain SGD needs
``~sqrt(λ_max(ΦΣΦᵀ)/σ²)`` steps, thousands at 28² (``λ_max/σ² ≈ 10⁷``);
preconditioned, 5–15.

Examples
--------
::

    post = STOSampler(STOOptions(batch_size=5)).sample(likelihood, prior, noise_var, 16)
    post.z, post.info["iterations"], post.info["converged"]
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
from ctuq.posterior.preconditioner import NystromPreconditioner, pick_preconditioner
from ctuq.posterior.samples import PosteriorSample, Sampler, SamplerState, WarmStart
from ctuq.progress import check_cancel, emit_progress

__all__ = ["STOOptions", "STOSampler", "nesterov_polyak", "step_curvature"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class STOOptions:
    """Settings of the sample-then-optimise sampler (both clients).

    One class for every client; a client that needs other settings passes
    its own instance (the classifiers: 300 steps, rank 100, ``reuse_tol``
    0.05, ``init='zero'``; the CT pipeline: 1000 steps at most).

    Parameters
    ----------
    iterations : int
        Most SGD steps (full-batch runs usually stop early, see ``tol``).
        Default 200.
    lr : float or None
        Peak learning rate in whitened coordinates; None: ``lr_scale / L``
        with ``L = max(1, 1.1 λ_max)`` and ``λ_max`` the largest eigenvalue of
        the (preconditioned) whitened Hessian ``M⁻¹(I + LᵀΦᵀΦL/σ²)``
        estimated by ``power_iterations`` power iterations. Default None.
    lr_scale : float
        Default 1.
    momentum : float or None
        Nesterov momentum; None: ``(√κ − 1)/(√κ + 1)`` with ``κ = L`` (the
        smallest Hessian eigenvalue is 1 in whitened coordinates), the
        optimal value for a quadratic. Default None.
    lr_final_factor : float
        The learning rate decays linearly from ``lr`` to ``lr ·
        lr_final_factor`` over the iterations. Default 0.1.
    clip_factor : float or None
        Clip each right-hand side's gradient norm to ``clip_factor`` × its
        norm at the first step; None disables clipping. Default 10.
    polyak_start : float
        Fraction of the iterations after which the iterates are averaged
        (uniform Polyak–Ruppert average); 1 disables averaging. Default 0.8.
    batch_size : int or None
        Units of the likelihood's mini-batch axis per step (projection angles
        for CT, data points for classifiers); the data term is scaled by
        ``n / batch_size`` so that the gradient is unbiased. None: full batch.
        The network products of a CT batch cost the same for any batch (only
        ``A``, ``Aᵀ`` shrink); a classifier's shrink with the batch. Default None.
    precond_rank : int
        Rank of a randomised Nyström preconditioner of the whitened Hessian
        (built like the CG one, in parameter space); the step then uses
        ``M⁻¹ g``. 0: plain (unpreconditioned) SGD, which needs of the order
        of ``sqrt(λ_max(ΦΣΦᵀ)/σ²)`` steps (thousands at 28²). Default 200.
    precond_oversample, precond_power_iters : int
        As for :class:`~ctuq.posterior.sampling_cg.CGOptions`. Defaults 10 and 1.
    reuse_tol : float
        Warm starts reuse the preconditioner while no log-hyperparameter of
        the prior moved by more than this (a stale one still preconditions,
        less sharply: with 0.5 the digits EM needed up to 300 instead of 15–30
        steps after the first update). Default 0.5.
    init : {'auto', 'zero', 'anchor'}
        Cold start of the samples: ``'anchor'`` starts each sample at its
        anchor ``wⁿ`` (exact in the directions the data do not inform: the
        right start for plain SGD, whose slow directions are those), ``'zero'``
        at 0 (relative residual 1; with the preconditioner every direction
        converges at the same rate, and the anchor's residual is ~10⁵× larger
        in the leading directions: 13 instead of 5 steps measured at 28²).
        ``'auto'``: zero with a preconditioner, else anchor. θ* always starts
        at 0. Default ``'auto'``.
    power_iterations : int
        For the step size. Default 20.
    curvature_batches : int
        Mini-batched runs: also estimate ``λ_max`` of a batch's rescaled Hessian on
        this many random batches and size the steps for the largest (a step sees one
        batch's curvature, which can lie far above the full one's once the
        preconditioner has flattened the full spectrum). Default 4.
    tol : float or None
        ``info['converged']`` reports whether every relative residual
        ``‖∇L'(w)‖_{M⁻¹} / ‖rhs‖_{M⁻¹}`` is below ``tol``, where the
        gradient is the residual of the linear system ``H_w w = rhs`` and
        ``rhs = −∇L'(0)`` (the same measure as CG's; Euclidean without a
        preconditioner). Full-batch runs stop early (checked every 5 steps,
        before Polyak averaging would matter) once every row is below
        ``tol / 2``; None disables the check. Default 1e-3.
    progress_every : int
        Default 50.
    """

    iterations: int = 200
    lr: float | None = None
    lr_scale: float = 1.0
    momentum: float | None = None
    lr_final_factor: float = 0.1
    clip_factor: float | None = 10.0
    polyak_start: float = 0.8
    batch_size: int | None = None
    precond_rank: int = 200
    precond_oversample: int = 10
    precond_power_iters: int = 1
    reuse_tol: float = 0.5
    init: str = "auto"
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
        if self.init not in ("auto", "zero", "anchor"):
            raise InputError(f"must be 'auto', 'zero' or 'anchor', got {self.init!r}",
                             field="init")


def power_lambda_max(apply_H: Callable[[Tensor], Tensor], d: int, iters: int, gen,
                      device) -> float:
    """Largest eigenvalue of a (possibly preconditioned) PSD operator by power iteration.

    Uses the growth ``‖H v‖`` of a normalised iterate, valid also for ``M⁻¹ H``
    (similar to a symmetric matrix, positive eigenvalues).
    """
    v = torch.randn(1, d, generator=gen).to(device)
    v /= v.norm()
    lam = 0.0
    for _ in range(max(1, iters)):
        w = apply_H(v)
        lam = float(w.norm())
        v = w / max(lam, 1e-30)
    return lam


def step_curvature(apply_H: Callable[[Tensor], Tensor], d: int, iters: int, gen, device,
                    apply_batch_H: Callable[[Tensor, Tensor], Tensor] | None = None,
                    draw_batch: Callable[[], Tensor] | None = None, n_batches: int = 0) -> float:
    """The largest curvature an SGD step sees: ``λ_max`` of ``apply_H`` and, for
    mini-batched steps, of ``apply_batch_H(·, idx)`` on ``n_batches`` batches ``draw_batch()``.

    A mini-batch step applies one batch's rescaled Hessian, whose top eigenvalue can lie
    far above the full one's (above all after a preconditioner has flattened the full
    spectrum): steps sized for the full Hessian then diverge.
    """
    lam = power_lambda_max(apply_H, d, iters, gen, device)
    for _ in range(n_batches if apply_batch_H is not None else 0):
        idx = draw_batch()
        lam = max(lam, power_lambda_max(lambda v: apply_batch_H(v, idx), d, iters, gen,
                                         device))
    return lam


def nesterov_polyak(grad: Callable[[Tensor], Tensor], W: Tensor, apply_M, *, n_iter: int,
                     lr0: float, beta: float, lr_final_factor: float, clip: Tensor | None,
                     polyak_start: float, stop: Callable[[Tensor], bool] | None = None,
                     check_every: int = 5, cancel=None, progress=None, stage: str = "sampling",
                     progress_every: int = 50) -> tuple[Tensor, int]:
    """The STO solver loop: preconditioned Nesterov SGD, linearly decaying step, Polyak average.

    ``grad(look)`` is the (mini-batch) gradient at the look-ahead point, a new tensor
    (clipped in place here); every ``check_every`` steps ``stop(g)`` may end the run
    (full-batch gradients only). ``W`` is updated in place. Returns the Polyak average
    (the last iterate when the run stopped early) and the number of steps run.
    """
    V, avg, n_avg = torch.zeros_like(W), torch.zeros_like(W), 0
    start_avg = min(n_iter - 1, int(math.floor(polyak_start * n_iter)))
    stopped = n_iter
    for it in range(n_iter):
        check_cancel(cancel, "posterior sampling")
        lr = lr0 * (1.0 - (1.0 - lr_final_factor) * it / max(1, n_iter - 1))
        look = W + beta * V  # Nesterov look-ahead
        g = grad(look)
        if stop is not None and (it + 1) % check_every == 0 and stop(g):
            stopped = it + 1
            break
        if clip is not None:
            g.mul_((clip / g.norm(dim=1).clamp_min(1e-30)).clamp_max(1.0).unsqueeze(1))
        V.mul_(beta).add_(apply_M(g), alpha=-lr)
        W.add_(V)
        if it >= start_avg:
            n_avg += 1
            avg.add_(W - avg, alpha=1.0 / n_avg)
        if (it + 1) % progress_every == 0:
            emit_progress(progress, stage, it + 1, n_iter, f"STO step {it + 1}")
    return (avg if (n_avg > 0 and stopped == n_iter and n_iter > 0) else W), stopped


class STOSampler(Sampler):
    """The sample-then-optimise sampler (module docstring); settings in :class:`STOOptions`.

    See :meth:`ctuq.posterior.samples.Sampler.sample` for the call. Rows of the
    whitened system: ``θ*`` first when the likelihood has a target (anchor 0,
    data target ``ỹ``), then one per sample (anchor ``wⁿ``, no data target).
    """

    method = "sto"
    options_class = STOOptions

    def _solve(self, options, likelihood, prior, noise_var, u, e, gen, warm: WarmStart,
               theta_star0, z0, progress, cancel, stage) -> PosteriorSample:
        t0 = time.perf_counter()
        k, d = u.shape[0], likelihood.num_params
        n = likelihood.batch_size_max
        device = likelihood.device
        batch = options.batch_size
        sigma = math.sqrt(noise_var)
        m = 0 if likelihood.target is None else 1
        if batch is not None and not 1 <= batch <= n:
            raise InputError(f"must be between 1 and the {n} {likelihood.batch_axis}, got "
                             f"{batch}", field="batch_size")
        with torch.no_grad():
            theta0 = prior.cov_sqrt(u)
            # whitened anchors wⁿ = u − Lᵀ Φᵀ e / σ, i.e. θⁿ = L wⁿ = θ⁰ + Σ Φᵀ ε / σ² with
            # ε = −σ e: the sign makes the minimiser equal the Matheron sample
            # θ⁰ − Σ Φᵀ K⁻¹ (Φ θ⁰ + σ e) of the same draws (u, e), as the CG and the dense
            # samplers compute it. The θ* row (with a target) has anchor 0, data target ỹ.
            anchor = torch.zeros(m + k, d, device=device)
            if k:
                pull = prior.cov_sqrt(likelihood.phi_t(e.view(k, *likelihood.obs_shape)),
                                      transpose=True) / sigma
                anchor[m:] = u - pull
            target = None
            if m:
                target = torch.zeros(m + k, *likelihood.obs_shape, device=device)
                target[0] = likelihood.target.view(likelihood.obs_shape)

            def data_grad(w: Tensor, idx: Tensor | None, scale: float,
                          with_target: bool = True) -> Tensor:
                # Lᵀ Φ_Sᵀ (Φ_S L w − t_S) · scale / σ² (without t_S: the batch's gram)
                g = likelihood.normal(prior.cov_sqrt(w), idx, target if with_target else None)
                return prior.cov_sqrt(g, transpose=True).mul_(scale / noise_var)

            def full_grad(w: Tensor) -> Tensor:
                return data_grad(w, None, 1.0).add_(w).sub_(anchor)

            def gram(w: Tensor) -> Tensor:  # Lᵀ Φᵀ Φ L w
                return prior.cov_sqrt(likelihood.normal(prior.cov_sqrt(w)), transpose=True)

            # optional Nyström preconditioner of the whitened Hessian (LᵀΦᵀΦL + σ² I)/σ²
            precond = None
            if options.precond_rank > 0 or warm.forced:
                def build(hyper):
                    return NystromPreconditioner.build(
                        gram, d, options.precond_rank, oversample=options.precond_oversample,
                        power_iters=options.precond_power_iters, generator=gen,
                        device=device, chunk=likelihood.lin.chunk_size, hyper=hyper,
                        cancel=cancel, progress=progress, stage=stage)
                precond = pick_preconditioner(warm.preconditioner, warm.forced, prior,
                                              options.reuse_tol, build, rescale=False)

            def apply_M(g: Tensor) -> Tensor:
                return g if precond is None else precond(g, noise_var)

            # curvature of M⁻¹ H in whitened coordinates: μ = 1, L estimated (mini-batched:
            # the largest a batch's step sees)
            full = batch is None or batch == n
            if options.lr is None or options.momentum is None:
                lam = step_curvature(
                    lambda v: apply_M(gram(v) / noise_var + v), d, options.power_iterations,
                    gen, device, None if full else lambda v, idx: apply_M(
                        data_grad(v, idx, n / batch, with_target=False) + v),
                    lambda: likelihood.draw_batch(gen, batch), options.curvature_batches)
                L_max = max(1.0, 1.1 * lam)
            else:
                L_max = float("nan")
            lr0 = options.lr if options.lr is not None else options.lr_scale / L_max
            beta = (options.momentum if options.momentum is not None
                    else (math.sqrt(L_max) - 1) / (math.sqrt(L_max) + 1))

            # initial iterate (whitened): the previous solution, or a cold start
            init = options.init
            if init == "auto":
                init = "zero" if precond is not None else "anchor"
            W = anchor.clone() if init == "anchor" else torch.zeros_like(anchor)
            if init == "anchor" and m:
                W[0] = 0.0
            if warm.theta_star is not None:
                W[0] = warm.theta_star
            if warm.samples is not None:
                W[m:] = warm.samples
            if theta_star0 is not None or z0 is not None:
                def whiten(t):  # w = L⁻¹ θ = Lᵀ Σ⁻¹ θ
                    return prior.cov_sqrt(prior.precision(t.to(device).float()), transpose=True)
                if theta_star0 is not None and m:
                    W[0] = whiten(theta_star0.reshape(1, d))[0]
                if z0 is not None:
                    W[m:] = whiten(z0.reshape(k, d))

            def m_norm(g: Tensor) -> Tensor:
                # ‖g‖_{M⁻¹} ≈ energy norm of the error (Euclidean without a preconditioner)
                return (g * apply_M(g)).sum(1).clamp_min(0).sqrt() if precond is not None \
                    else g.norm(dim=1)

            g_init = full_grad(W)
            g0_norm = g_init.norm(dim=1).clamp_min(1e-30)
            # the system is H w = rhs with rhs = −∇L'(0) = wⁿ + Lᵀ Φᵀ t / σ²: residuals are
            # measured relative to ‖rhs‖ (in the M⁻¹ norm), as for CG, whatever the start
            if m == 0:
                rhs_mnorm = m_norm(anchor).clamp_min(1e-30)
            else:
                at_zero = bool((W == 0).all())
                rhs_mnorm = m_norm(g_init if at_zero else full_grad(torch.zeros_like(W))
                                   ).clamp_min(1e-30)
            clip = options.clip_factor * g0_norm if options.clip_factor is not None else None
            t_setup = time.perf_counter() - t0

            n_iter = int(options.iterations)
            # full-batch gradients are exact: stop once every row is well inside tol
            early_stop = options.tol is not None and full
            history = [float((m_norm(g_init) / rhs_mnorm).max())]
            if early_stop and history[0] <= 0.5 * options.tol:
                n_iter = 0  # a warm start that is already converged
            batches = None if full else likelihood.batches(gen, batch)

            def grad(look: Tensor) -> Tensor:
                if full:
                    g = data_grad(look, None, 1.0)
                else:
                    g = data_grad(look, next(batches), n / batch)
                return g.add_(look).sub_(anchor)

            def converged(g: Tensor) -> bool:
                history.append(float((m_norm(g) / rhs_mnorm).max()))
                log.debug("STO step %d: max relative residual %.2e", 5 * (len(history) - 1),
                          history[-1])
                return history[-1] <= 0.5 * options.tol

            t1 = time.perf_counter()
            W_final, stopped_at = nesterov_polyak(
                grad, W, apply_M, n_iter=n_iter, lr0=lr0, beta=beta,
                lr_final_factor=options.lr_final_factor, clip=clip,
                polyak_start=options.polyak_start, stop=converged if early_stop else None,
                cancel=cancel, progress=progress, stage=stage,
                progress_every=options.progress_every)
            t_solve = time.perf_counter() - t1
            rel = (m_norm(full_grad(W_final)) / rhs_mnorm).cpu()
            sol = prior.cov_sqrt(W_final)
        emit_progress(progress, stage, n_iter, n_iter, "STO done")
        info = {"method": "sto", "iterations": stopped_at, "residuals": rel,
                "converged": bool(options.tol is None or (rel <= options.tol).all()),
                "residual_history": history, "time_setup": t_setup, "time_solve": t_solve,
                "time_per_iteration": t_solve / max(1, stopped_at), "lr": lr0,
                "momentum": beta, "curvature_max": L_max, "noise_var": noise_var,
                "batch_size": batch, "precond_rank": precond.rank if precond is not None else 0,
                "precond_time": precond.build_time if precond is not None else 0.0,
                "precond_reused": precond is not None and precond is warm.preconditioner}
        state = SamplerState("sto", u, e, W_final.clone(), precond, anchor[m:])
        return PosteriorSample(sol[0] if m else None, sol[m:], theta0, info, state)
