"""Posterior samples of the linearised model (METHOD.md §5).

For ``Φ = A J`` (``d_y × d_θ``), a prior ``N(0, Σ)``, noise variance ``σ²`` and
the linear-model target ``ỹ = y − A f(θ̃) + Φ θ̃``:

    H  = Φᵀ Φ / σ² + Σ⁻¹,     θ* = H⁻¹ Φᵀ ỹ / σ²,     z ~ N(0, H⁻¹).

One entry point, :func:`sample_posterior`, returns ``θ*`` and ``k``
zero-mean samples ``z`` with one of two samplers. Both map the same
standard-normal draws ``(u, e)`` (``θ⁰ = L u``, ``Σ = L Lᵀ``, noise ``σ e``)
to the same sample ``z = θ⁰ − Σ Φᵀ K⁻¹ (Φ θ⁰ + σ e)``, which
:meth:`ctuq.recon.exact.ExactPosterior.sample` reproduces densely.

``method='cg'`` (pathwise / Matheron, observation space)
    ``θ* = Σ Φᵀ K⁻¹ ỹ`` and ``z_j = θ⁰_j − Σ Φᵀ K⁻¹ (Φ θ⁰_j + σ e_j)`` with
    ``K = Φ Σ Φᵀ + σ² I``. The ``k + 1`` systems share one batched,
    matrix-free preconditioned CG solve (per iteration: one batched VJP, one
    batched JVP, ``A``, ``Aᵀ``, ``Σ``) with a randomised Nyström
    preconditioner of ``Φ Σ Φᵀ`` (one subspace iteration) applied in float64
    through the Woodbury identity. Residuals are measured in the
    preconditioner norm (see :func:`batched_cg` for why).
``method='sto'`` (sample-then-optimise, parameter space)
    ``z_j = argmin ½‖Φ z‖²/σ² + ½‖z − θⁿ_j‖²_{Σ⁻¹}`` with the noise moved into
    the anchor ``θⁿ_j = θ⁰_j − Σ Φᵀ e_j / σ`` (the variance-reduced objective
    ``L'``), and ``θ*`` the minimiser of ``½‖ỹ − Φ θ‖²/σ² + ½‖θ‖²_{Σ⁻¹}``.
    SGD with Nesterov momentum, gradient clipping, linear learning-rate
    decay and Polyak averaging, optionally mini-batched over projection
    angles. It runs in prior-whitened coordinates ``z = L w``, where the
    Hessian ``I + LᵀΦᵀΦL/σ²`` has smallest eigenvalue 1 (which fixes the
    momentum), and by default with a Nyström preconditioner of ``LᵀΦᵀΦL``:
    plain SGD needs ``~sqrt(λ_max(ΦΣΦᵀ)/σ²)`` steps, thousands at 28²
    (``λ_max/σ² ≈ 10⁷``); preconditioned, 5–15.

Both are warm-startable (EM steps): pass the previous
:class:`PosteriorSample` as ``warm_start``. Its θ* solution and
preconditioner carry over; with the same ``k`` (and ``redraw=False``) so do
its draws and sample solutions.

Examples
--------
::

    post = sample_posterior(lin, op, prior, noise_var, y, k=16, method="cg",
                            generator=torch.Generator().manual_seed(0))
    post.theta_star, post.z, post.info["iterations"], post.info["converged"]
    again = sample_posterior(lin, op, prior, noise_var, y, k=16, warm_start=post)
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.recon.linearize import Linearization
from ctuq.recon.priors import GaussianPrior
from ctuq.recon.progress import check_cancel, emit_progress

__all__ = [
    "CGOptions",
    "STOOptions",
    "PosteriorSample",
    "SamplerState",
    "NystromPreconditioner",
    "ObservationKernel",
    "sample_posterior",
    "linear_target",
    "batched_cg",
    "A_subset",
    "A_adjoint_subset",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------
# options and results


@dataclass(frozen=True)
class CGOptions:
    """Settings of the Matheron / CG sampler.

    Parameters
    ----------
    tol : float
        Stop when every right-hand side has ``‖r_j‖ ≤ tol · ‖b_j‖`` in the
        norm ``norm``. Default 1e-3.
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
    patience: int | None = 50
    true_residual: bool = True
    norm: str = "preconditioned"
    precond_rank: int = 200
    precond_oversample: int = 10
    precond_power_iters: int = 1
    reuse_preconditioner: bool = True
    reuse_tol: float = 3.0
    check_every: int = 1
    progress_every: int = 10


@dataclass(frozen=True)
class STOOptions:
    """Settings of the sample-then-optimise sampler.

    Parameters
    ----------
    iterations : int
        SGD steps. Default 1000.
    lr : float or None
        Peak learning rate in whitened coordinates; None: ``lr_scale / L``
        with ``L = 1 + λ_max(LᵀΦᵀΦL)/σ²`` estimated by ``power_iterations``
        power iterations (× 1.1 safety). Default None.
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
    batch_angles : int or None
        Projection angles per mini-batch (the data term is scaled by
        ``n_angles / batch_angles`` so that the gradient is unbiased); None:
        full batch. Note: the network products ``J v``, ``Jᵀ u`` cost the
        same for any mini-batch; only ``A``, ``Aᵀ`` shrink. Default None.
    precond_rank : int
        Rank of a randomised Nyström preconditioner of the whitened Hessian
        (built like the CG one, in parameter space); the step then uses
        ``M⁻¹ g``. 0: plain (unpreconditioned) SGD, which needs of the order
        of ``sqrt(λ_max(ΦΣΦᵀ)/σ²)`` steps (thousands at 28²). Default 200.
    precond_oversample, precond_power_iters : int
        As for :class:`CGOptions`. Defaults 10 and 1.
    reuse_tol : float
        Warm starts reuse the preconditioner while the prior's log
        hyperparameters moved less than this. Default 0.5.
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
        batch's curvature). Default 4.
    tol : float or None
        ``info['converged']`` reports whether every relative residual
        ``‖∇L'(w)‖_{M⁻¹} / ‖rhs‖_{M⁻¹}`` is below ``tol``, where the
        gradient is the residual of the linear system ``H_w w = rhs`` and
        ``rhs = −∇L'(0)`` (the same measure as CG's; Euclidean without a
        preconditioner).
        Full-batch runs stop early (checked every 5 steps, before Polyak
        averaging would matter) once every row is below ``tol / 2``; None
        disables the check. Default 1e-3.
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
    batch_angles: int | None = None
    precond_rank: int = 200
    precond_oversample: int = 10
    precond_power_iters: int = 1
    reuse_tol: float = 0.5
    init: str = "auto"
    power_iterations: int = 20
    curvature_batches: int = 4
    tol: float | None = 1e-3
    progress_every: int = 50


@dataclass
class SamplerState:
    """What a later call needs to warm-start (kept inside :class:`PosteriorSample`).

    Attributes
    ----------
    method : str
    base_u : Tensor, shape (k, d_θ)
        Standard normals of the prior draws, ``θ⁰ = L u``.
    base_e : Tensor, shape (k, d_y)
        Standard normals of the noise draws, ``ε = σ e``.
    solution : Tensor
        CG: ``K⁻¹ b`` for the ``k + 1`` right-hand sides ``[ỹ; Φθ⁰ + ε]``,
        ``[k+1, d_y]``. STO: the whitened iterates ``w`` (``[θ*; z] = L w``),
        ``[k+1, d_θ]``.
    preconditioner : NystromPreconditioner or None
    """

    method: str
    base_u: Tensor
    base_e: Tensor
    solution: Tensor
    preconditioner: "NystromPreconditioner | None" = None


@dataclass
class PosteriorSample:
    """Result of :func:`sample_posterior`.

    Attributes
    ----------
    theta_star : Tensor, shape (d_θ,)
        The linear-model mode ``θ*`` (MAP of the linear model).
    z : Tensor, shape (k, d_θ)
        Zero-mean samples ``z ~ N(0, H⁻¹)``.
    theta0 : Tensor, shape (k, d_θ)
        The prior draws ``θ⁰`` behind the samples.
    info : dict
        ``method``, ``iterations``, ``converged`` (bool), ``residuals``
        (final relative residual per right-hand side, ``[k+1]``, row 0 is
        ``θ*``; CG: ``‖r_j‖/‖b_j‖`` in the chosen norm, STO: the
        full-batch gradient in the ``M⁻¹`` norm relative to the right-hand
        side), ``residual_history`` (max over right-hand sides per check;
        STO: at the start and every 5 full-batch steps), ``time`` (s),
        ``time_setup`` (s), and sampler specific entries
        (``precond_rank``, ``precond_time``, ``restarts``, ``lr``,
        ``momentum``, …).
    state : SamplerState
        Pass the whole result as ``warm_start`` to the next call.
    """

    theta_star: Tensor
    z: Tensor
    theta0: Tensor
    info: dict
    state: SamplerState

    @property
    def k(self) -> int:
        return int(self.z.shape[0])


# ------------------------------------------------------------------------------
# building blocks


def linear_target(lin: Linearization, op, y: Tensor) -> Tensor:
    """``ỹ = y − A f(θ̃) + Φ θ̃``, the target of the linear model, ``[n_angles, n_det]``."""
    y = _as_sinogram(y, op, lin.device)
    with torch.no_grad():
        return y - op.A(lin.x_hat) + op.A(lin.jvp(lin.theta_hat))


def _as_sinogram(y, op, device) -> Tensor:
    y = torch.as_tensor(y, dtype=torch.float32)
    shape = tuple(op.range_shape)
    if y.numel() != math.prod(shape) or tuple(y.shape[-2:]) != shape:
        raise InputError(f"sinogram shape {tuple(y.shape)} does not match the geometry's "
                         f"{shape}", field="sinogram")
    return y.reshape(shape).to(device)


def A_subset(op, x: Tensor, idx: Tensor | None) -> Tensor:
    """``A`` restricted to the projection angles ``idx``: ``[..., H, W]`` → ``[..., |idx|, n_det]``.

    Implemented by projecting onto every angle and selecting (the matrix
    backend's cost is dominated by the network products anyway).
    """
    s = op.A(x)
    return s if idx is None else s.index_select(-2, idx)


def A_adjoint_subset(op, s: Tensor, idx: Tensor | None) -> Tensor:
    """Adjoint of :func:`A_subset`: ``Aᵀ`` of the zero-filled sinogram."""
    if idx is None:
        return op.A_adjoint(s)
    full = s.new_zeros(*s.shape[:-2], op.range_shape[0], s.shape[-1])
    full.index_copy_(-2, idx, s)
    return op.A_adjoint(full)


class ObservationKernel:
    """Matrix-free ``K = Φ Σ Φᵀ + σ² I`` on flat sinograms ``[m, d_y]``.

    ``P(X) = Φ Σ Φᵀ X`` costs one batched VJP, one batched JVP, ``Aᵀ``, ``A``
    and ``Σ``; ``K(X) = P(X) + σ² X``.
    """

    def __init__(self, lin: Linearization, op, prior: GaussianPrior, noise_var: float):
        self.lin, self.op, self.prior = lin, op, prior
        self.noise_var = float(noise_var)
        self.range_shape = tuple(op.range_shape)
        self.d_y = math.prod(self.range_shape)

    def P(self, X: Tensor) -> Tensor:
        m = X.shape[0]
        with torch.no_grad():
            g = self.lin.vjp(self.op.A_adjoint(X.view(m, *self.range_shape)))
            g = self.prior.cov(g)
            return self.op.A(self.lin.jvp(g)).reshape(m, self.d_y)

    def __call__(self, X: Tensor) -> Tensor:
        out = self.P(X)
        return out.add_(X, alpha=self.noise_var)

    def sigma_phi_t(self, X: Tensor) -> Tensor:
        """``Σ Φᵀ X``: ``[m, d_y]`` → ``[m, d_θ]``."""
        with torch.no_grad():
            return self.prior.cov(self.lin.vjp(self.op.A_adjoint(
                X.view(X.shape[0], *self.range_shape))))


class NystromPreconditioner:
    """Randomised Nyström approximation ``Φ Σ Φᵀ ≈ U Λ Uᵀ`` and its Woodbury preconditioner.

    Built from ``rank + oversample`` batched products with ``P = Φ Σ Φᵀ``
    (stable Nyström, Tropp et al. 2017; preconditioner of Frangella, Tropp &
    Udell 2023). For ``K = P + μ I`` (``μ = σ²``) it applies

        M⁻¹ x = (λ_r + μ) U (Λ + μ I)⁻¹ Uᵀ x + (I − U Uᵀ) x,

    which costs ``O(d_y · r)`` per vector. It is applied in **float64**
    (input and output keep their dtype): the weights
    ``(λ_r + μ)/(λ_i + μ)`` reach 1e-7 on 28² problems, so in float32 the
    projection ``x − U Uᵀ x`` loses everything in the leading directions and
    CG stalls (measured: float32 application stagnates at relative residual
    0.1 where float64 converges in 5 iterations). The cost is ``4 · d_y · r``
    flops per vector, ≈ 1 % of a JVP + VJP of the 128² U-net.

    Attributes
    ----------
    U : Tensor, shape (d_y, r)
        Orthonormal eigenvector estimates (float64).
    eigvals : Tensor, shape (r,)
        ``Λ`` in decreasing order (float64).
    hyper : Tensor or None
        The prior hyperparameters it was built with (for reuse decisions).
    build_time : float
        Seconds.
    """

    def __init__(self, U: Tensor, eigvals: Tensor, hyper: Tensor | None = None,
                 build_time: float = 0.0):
        self.U, self.eigvals, self.hyper, self.build_time = U, eigvals, hyper, build_time

    @property
    def rank(self) -> int:
        return int(self.eigvals.numel())

    @classmethod
    def build(cls, apply_P: Callable[[Tensor], Tensor], d_y: int, rank: int, *,
              oversample: int = 10, power_iters: int = 1,
              generator: torch.Generator | None = None,
              device=None, dtype=torch.float32, chunk: int | None = None,
              hyper: Tensor | None = None,
              cancel: Callable[[], bool] | None = None) -> "NystromPreconditioner":
        """Sketch ``P`` with ``rank + oversample`` Gaussian directions and keep ``rank`` pairs.

        Parameters
        ----------
        apply_P : callable
            ``[m, d_y]`` → ``[m, d_y]``, the PSD operator.
        d_y : int
        rank : int
            Kept rank (capped at ``d_y``).
        oversample : int
            Extra sketch directions. Default 10.
        power_iters : int
            Subspace (power) iterations before the Nyström step; each costs
            one more batch of ``rank + oversample`` products and makes the
            leading eigenvectors far more accurate, which matters for the
            steep spectra of ``Φ Σ Φᵀ`` (λ spans ~10⁷ at 28²). Default 1.
        generator : torch.Generator, optional
            CPU generator for the sketch.
        device, dtype
            Of the products; the small factorisations run in float64.
        chunk : int, optional
            Columns per call of ``apply_P`` (memory bound). Default 32: at
            256² (dip-256) the 110 sketch products in one batch peak at
            9.7 GB and take 295 s; in chunks of 32, 3.4 GB and 186 s.
        hyper : Tensor, optional
            Stored with the result, for reuse decisions.
        cancel : callable, optional
            Polled between chunks: the sketch is the longest step without
            a CG iteration in it (≈ 2 · (rank + oversample) products).

        Raises
        ------
        Cancelled
            When ``cancel()`` returned True.
        """
        t0 = time.perf_counter()
        rank = max(1, min(int(rank), d_y))
        s = min(d_y, rank + max(0, int(oversample)))
        omega = torch.randn(d_y, s, generator=generator, dtype=torch.float64)
        omega = torch.linalg.qr(omega).Q  # [d_y, s], orthonormal columns
        om = omega.t().contiguous().to(device=device, dtype=dtype)  # rows = directions
        step = max(1, int(chunk)) if chunk is not None else 32

        def sketch(rows: Tensor) -> Tensor:
            parts = []
            for i in range(0, s, step):
                check_cancel(cancel, "preconditioner")
                parts.append(apply_P(rows[i:i + step]))
            return torch.cat(parts).detach().to(torch.float64).t()  # [d_y, s]

        for _ in range(max(0, int(power_iters))):  # subspace iteration sharpens the sketch
            omega = torch.linalg.qr(sketch(om)).Q
            om = omega.t().contiguous().to(device=device, dtype=dtype)
        Y = sketch(om)
        omega = omega.to(Y.device)
        nu = math.sqrt(d_y) * torch.finfo(dtype).eps * float(torch.linalg.matrix_norm(Y, 2))
        nu = max(nu, 1e-30)
        Y_nu = Y + nu * omega
        core = omega.t() @ Y_nu
        core = 0.5 * (core + core.t())
        C = torch.linalg.cholesky(core + 1e-12 * core.diagonal().abs().max()
                                  * torch.eye(s, dtype=core.dtype, device=core.device))
        B = torch.linalg.solve_triangular(C, Y_nu.t(), upper=False).t()  # Y_nu C^{-T}
        U, S, _ = torch.linalg.svd(B, full_matrices=False)
        lam = (S.square() - nu).clamp_min(0.0)
        U, lam = U[:, :rank], lam[:rank]
        return cls(U.contiguous(), lam, hyper, time.perf_counter() - t0)

    def __call__(self, X: Tensor, noise_var: float) -> Tensor:
        """``M⁻¹ X`` for rows ``X`` ``[m, d_y]`` (computed in float64)."""
        coef = (self.eigvals[-1] + noise_var) / (self.eigvals + noise_var)  # (0, 1]
        X64 = X.to(torch.float64)
        proj = X64 @ self.U  # [m, r]
        out = torch.addmm(X64, proj * (coef - 1.0), self.U.t())
        return out.to(X.dtype)


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
        at a floor set by the round-off of ``apply_K``. Default 50.
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
    it, stagnated, restarts = 0, False, 0
    zero = torch.zeros(m, dtype=B.dtype, device=B.device)
    one = torch.ones_like(zero)
    while True:
        # (re)start from the current residual R
        Z = precond(R) if precond is not None else R.clone()
        P = Z.clone()
        rz = (R * Z).sum(1)
        rel = rel_norm(R, rz, b_den)
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
                        log.warning("CG stagnated at relative residual %.2e after %d "
                                    "iterations", rmax, it)
                        break
            beta = torch.where(active, rz_new / torch.where(active, rz, one), zero)
            P.mul_(beta.unsqueeze(1)).add_(Z)
            rz = rz_new
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


# ------------------------------------------------------------------------------
# the entry point


def _hyper_vector(prior: GaussianPrior) -> Tensor:
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).double().cpu() for p in prior.parameters()])


def _make_options(method: str, opts: dict):
    cls = CGOptions if method == "cg" else STOOptions
    options = opts.pop("options", None)
    if options is None:
        options = cls()
    elif not isinstance(options, cls):
        raise InputError(f"options for method {method!r} must be a {cls.__name__}",
                         field="options")
    known = {f.name for f in fields(cls)}
    unknown = set(opts) - known
    if unknown:
        raise InputError(f"unknown option(s) {sorted(unknown)} for method {method!r}; "
                         f"known: {sorted(known)}", field="options")
    return replace(options, **opts) if opts else options


@dataclass
class _WarmStart:
    theta_star: Tensor | None  # row 0 of a previous solution
    samples: Tensor | None  # rows 1.. (only with the same draws)
    preconditioner: "NystromPreconditioner | None"
    forced: bool  # passed explicitly: use as it is


def _pick_preconditioner(warm: _WarmStart, prior: GaussianPrior, reuse: bool, reuse_tol: float,
                         build: Callable[[Tensor], "NystromPreconditioner"]):
    hyper = _hyper_vector(prior)
    old = warm.preconditioner
    if old is not None and (warm.forced or (
            reuse and old.hyper is not None and old.hyper.shape == hyper.shape
            and float((old.hyper - hyper).abs().max()) <= reuse_tol)):
        log.debug("reusing the Nyström preconditioner (rank %d)", old.rank)
        return old
    return build(hyper)


def sample_posterior(lin: Linearization, op, prior: GaussianPrior, noise_var, y, k: int,
                     method: str = "cg", *, generator: torch.Generator | None = None,
                     warm_start: PosteriorSample | None = None, redraw: bool = False,
                     theta_star0: Tensor | None = None, z0: Tensor | None = None,
                     preconditioner: "NystromPreconditioner | None" = None,
                     progress: Callable | None = None, cancel: Callable | None = None,
                     stage: str = "sampling", **opts) -> PosteriorSample:
    """The linear-model mode ``θ*`` and ``k`` zero-mean posterior samples ``z ~ N(0, H⁻¹)``.

    Parameters
    ----------
    lin : Linearization
        The Jacobian operator at the fit.
    op : RayTransform
        On ``lin.device``.
    prior : GaussianPrior
        :class:`~ctuq.recon.priors.BlockPrior` or :class:`~ctuq.recon.priors.GPrior`.
    noise_var : float
        ``σ²`` (sinogram units squared).
    y : Tensor, shape (n_angles, n_det)
        The measured sinogram (``ỹ`` is formed inside, see :func:`linear_target`).
    k : int
        Number of samples (≥ 0).
    method : {'cg', 'sto'}
        Matheron + preconditioned CG (default), or sample-then-optimise.
    generator : torch.Generator, optional
        CPU generator for every random draw (prior draws, noise, sketch).
        Default: a fresh one seeded with 0.
    warm_start : PosteriorSample, optional
        A previous result of the same method (an EM step): its θ* solution
        starts the θ* system and its preconditioner is reused while the prior
        moved little (see ``reuse_tol``). If it also has the same ``k`` and
        ``redraw`` is False, its standard-normal draws are reused and its
        sample solutions start the sample systems; otherwise fresh draws
        start cold. A result of the other method is ignored (logged).
    redraw : bool
        Draw fresh prior/noise samples even when ``warm_start`` has the same
        ``k``. Default False.
    theta_star0, z0 : Tensor, optional
        STO only: initial ``θ*`` ``[d_θ]`` and samples ``[k, d_θ]`` in
        parameter space (override ``warm_start``'s).
    preconditioner : NystromPreconditioner, optional
        Use this preconditioner as it is (CG: of ``Φ Σ Φᵀ``, ``d_y``; STO: of
        ``Lᵀ Φᵀ Φ L``, ``d_θ``), e.g. ``previous.state.preconditioner``.
        Default: reuse ``warm_start``'s or build one.
    progress, cancel : callable, optional
        See :mod:`ctuq.recon.progress`. Stage ``stage`` (default ``'sampling'``).
    **opts
        Fields of :class:`CGOptions` / :class:`STOOptions`, or
        ``options=CGOptions(...)``.

    Returns
    -------
    PosteriorSample

    Raises
    ------
    InputError
        Bad method, option, shape or noise variance.
    Cancelled
        When ``cancel()`` returned True.
    """
    if method not in ("cg", "sto"):
        raise InputError(f"must be 'cg' or 'sto', got {method!r}", field="method")
    noise_var = float(noise_var)
    if not (math.isfinite(noise_var) and noise_var > 0):
        raise InputError(f"must be a positive number, got {noise_var!r}", field="noise_var")
    k = int(k)
    if k < 0:
        raise InputError(f"must be >= 0, got {k}", field="k")
    if prior.num_params != lin.num_params:
        raise InputError(f"prior has {prior.num_params} parameters, the linearisation "
                         f"{lin.num_params}", field="prior")
    options = _make_options(method, dict(opts))
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    device = lin.device
    t0 = time.perf_counter()

    if warm_start is not None and warm_start.state.method != method:
        log.warning("warm start ignored: it comes from method %r, this call is %r",
                    warm_start.state.method, method)
        warm_start = None
    d_y = math.prod(op.range_shape)
    reuse_draws = warm_start is not None and warm_start.k == k and not redraw
    if reuse_draws:
        u, e = warm_start.state.base_u, warm_start.state.base_e
    else:
        u = torch.randn(k, lin.num_params, generator=gen).to(device)
        e = torch.randn(k, d_y, generator=gen).to(device)
    warm = _WarmStart(None, None, preconditioner, preconditioner is not None)
    if warm_start is not None:
        sol = warm_start.state.solution
        warm.theta_star = sol[0] if sol.shape[0] else None
        warm.samples = sol[1:] if reuse_draws else None
        if preconditioner is None:
            warm.preconditioner = warm_start.state.preconditioner
    y_tilde = linear_target(lin, op, y).reshape(1, d_y)
    sigma = math.sqrt(noise_var)

    if method == "cg":
        res = _sample_cg(lin, op, prior, noise_var, sigma, y_tilde, u, e, options, gen,
                         warm, progress, cancel, stage)
    else:
        res = _sample_sto(lin, op, prior, noise_var, sigma, y_tilde, u, e, options, gen,
                          warm, theta_star0, z0, progress, cancel, stage)
    res.info["time"] = time.perf_counter() - t0
    res.info["k"] = k
    log.info("%s sampler: k=%d, %d iterations, converged %s, max residual %.2e, %.2f s",
             method, k, res.info["iterations"], res.info["converged"],
             float(res.info["residuals"].max()) if res.info["residuals"].numel() else 0.0,
             res.info["time"])
    return res


def _sample_cg(lin, op, prior, noise_var, sigma, y_tilde, u, e, options: CGOptions, gen,
               warm: _WarmStart, progress, cancel, stage) -> PosteriorSample:
    t0 = time.perf_counter()
    kern = ObservationKernel(lin, op, prior, noise_var)
    k = u.shape[0]
    with torch.no_grad():
        theta0 = prior.cov_sqrt(u)
        rhs = torch.cat([y_tilde, op.A(lin.jvp(theta0)).reshape(k, -1) + sigma * e]) \
            if k else y_tilde.clone()

    precond = None
    if options.precond_rank > 0 or warm.forced:
        def build(hyper):
            pc = NystromPreconditioner.build(
                kern.P, kern.d_y, options.precond_rank, oversample=options.precond_oversample,
                power_iters=options.precond_power_iters, generator=gen, device=lin.device,
                chunk=lin.chunk_size, hyper=hyper, cancel=cancel)
            log.debug("Nyström preconditioner rank %d in %.2f s, λ = %.3g … %.3g",
                      pc.rank, pc.build_time, float(pc.eigvals[0]), float(pc.eigvals[-1]))
            return pc
        precond = _pick_preconditioner(warm, prior, options.reuse_preconditioner,
                                       options.reuse_tol, build)
    t_setup = time.perf_counter() - t0

    X0 = None
    if warm.theta_star is not None:
        X0 = torch.zeros_like(rhs)
        X0[0] = warm.theta_star
        if warm.samples is not None:
            X0[1:] = warm.samples
    total = options.max_iter

    def callback(it, rmax):
        check_cancel(cancel, "posterior sampling")
        if it % options.progress_every == 0:
            emit_progress(progress, stage, it, total, f"CG iteration {it}, residual {rmax:.2e}")

    t1 = time.perf_counter()
    X, info = batched_cg(kern, rhs, X0=X0,
                         precond=(lambda R: precond(R, noise_var)) if precond is not None
                         else None,
                         tol=options.tol, max_iter=options.max_iter,
                         check_every=options.check_every, patience=options.patience,
                         true_residual=options.true_residual, norm=options.norm,
                         callback=callback)
    t_solve = time.perf_counter() - t1
    W = kern.sigma_phi_t(X)
    theta_star = W[0]
    z = theta0 - W[1:]
    emit_progress(progress, stage, info["iterations"], total,
                  f"CG done: {info['iterations']} iterations")
    if not info["converged"]:
        log.warning("CG did not reach tol %.1e in %d iterations (max residual %.2e)",
                    options.tol, options.max_iter, float(info["residuals"].max()))
    info.update(method="cg", time_setup=t_setup, time_solve=t_solve,
                # every iteration is one K product; the solve adds one for a warm start's
                # initial residual and one for the true final residual
                time_per_iteration=t_solve / max(1, info["iterations"] + (X0 is not None)
                                                 + bool(options.true_residual)
                                                 * (1 + info["restarts"])),
                precond_rank=precond.rank if precond is not None else 0,
                precond_time=precond.build_time if precond is not None else 0.0,
                noise_var=noise_var)
    state = SamplerState("cg", u, e, X, precond)
    return PosteriorSample(theta_star, z, theta0, info, state)


def _power_lambda_max(apply_H: Callable[[Tensor], Tensor], d: int, iters: int, gen,
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


def _step_curvature(apply_H: Callable[[Tensor], Tensor], d: int, iters: int, gen, device,
                    apply_batch_H: Callable[[Tensor, Tensor], Tensor] | None = None,
                    draw_batch: Callable[[], Tensor] | None = None, n_batches: int = 0) -> float:
    """The largest curvature an SGD step sees: ``λ_max`` of ``apply_H`` and, for
    mini-batched steps, of ``apply_batch_H(·, idx)`` on ``n_batches`` batches ``draw_batch()``.

    A mini-batch step applies one batch's rescaled Hessian, whose top eigenvalue can lie
    far above the full one's (above all after a preconditioner has flattened the full
    spectrum): steps sized for the full Hessian then diverge.
    """
    lam = _power_lambda_max(apply_H, d, iters, gen, device)
    for _ in range(n_batches if apply_batch_H is not None else 0):
        idx = draw_batch()
        lam = max(lam, _power_lambda_max(lambda v: apply_batch_H(v, idx), d, iters, gen,
                                         device))
    return lam


def _nesterov_polyak(grad: Callable[[Tensor], Tensor], W: Tensor, apply_M, *, n_iter: int,
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


def _sample_sto(lin, op, prior, noise_var, sigma, y_tilde, u, e, options: STOOptions, gen,
                warm: _WarmStart, theta_star0, z0, progress, cancel, stage) -> PosteriorSample:
    t0 = time.perf_counter()
    k, d = u.shape[0], lin.num_params
    n_angles, n_det = op.range_shape
    device = lin.device
    batch = options.batch_angles
    if options.init not in ("auto", "zero", "anchor"):
        raise InputError(f"must be 'auto', 'zero' or 'anchor', got {options.init!r}",
                         field="init")
    if batch is not None and not 1 <= batch <= n_angles:
        raise InputError(f"must be between 1 and {n_angles}, got {batch}", field="batch_angles")
    with torch.no_grad():
        theta0 = prior.cov_sqrt(u)
        # whitened anchors wⁿ = u − Lᵀ Φᵀ e / σ, i.e. θⁿ = L wⁿ = θ⁰ + Σ Φᵀ ε / σ² with
        # ε = −σ e: the sign makes the minimiser equal the Matheron sample
        # θ⁰ − Σ Φᵀ K⁻¹ (Φ θ⁰ + σ e) of the same draws (u, e), as the CG sampler and
        # ExactPosterior.sample compute it. Row 0 is θ*: anchor 0, data target ỹ.
        anchor = torch.zeros(k + 1, d, device=device)
        if k:
            anchor[1:] = u - prior.cov_sqrt(lin.phi_t(e.view(k, n_angles, n_det), op),
                                            transpose=True) / sigma
        target = torch.zeros(k + 1, n_angles, n_det, device=device)
        target[0] = y_tilde.view(n_angles, n_det)

        def data_grad(w: Tensor, idx: Tensor | None, scale: float,
                      with_target: bool = True) -> Tensor:
            # Lᵀ Φ_Sᵀ (Φ_S L w − t_S) · scale / σ² (without t_S: the batch's gram)
            x = lin.jvp(prior.cov_sqrt(w))
            r = A_subset(op, x, idx)
            if with_target:
                r = r - (target if idx is None else target.index_select(-2, idx))
            g = lin.vjp(A_adjoint_subset(op, r, idx))
            return prior.cov_sqrt(g, transpose=True).mul_(scale / noise_var)

        def full_grad(w: Tensor) -> Tensor:
            return data_grad(w, None, 1.0).add_(w).sub_(anchor)

        def gram(w: Tensor) -> Tensor:  # Lᵀ Φᵀ Φ L w
            return prior.cov_sqrt(lin.phi_t(lin.phi(prior.cov_sqrt(w), op), op), transpose=True)

        # optional Nyström preconditioner of the whitened Hessian (LᵀΦᵀΦL + σ² I)/σ²
        precond = None
        if options.precond_rank > 0 or warm.forced:
            def build(hyper):
                return NystromPreconditioner.build(
                    gram, d, options.precond_rank, oversample=options.precond_oversample,
                    power_iters=options.precond_power_iters, generator=gen, device=device,
                    chunk=lin.chunk_size, hyper=hyper, cancel=cancel)
            precond = _pick_preconditioner(warm, prior, True, options.reuse_tol, build)

        def apply_M(g: Tensor) -> Tensor:
            return g if precond is None else precond(g, noise_var)

        # curvature of M⁻¹ H in whitened coordinates: μ = 1, L estimated (mini-batched:
        # the largest a batch's step sees)
        full = batch is None or batch == n_angles
        if options.lr is None or options.momentum is None:
            lam = _step_curvature(
                lambda v: apply_M(gram(v) / noise_var + v), d, options.power_iterations, gen,
                device, None if full else lambda v, idx: apply_M(
                    data_grad(v, idx, n_angles / batch, with_target=False) + v),
                lambda: torch.randperm(n_angles, generator=gen)[:batch].sort().values.to(device),
                options.curvature_batches)
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
        if init == "anchor":
            W[0] = 0.0
        if warm.theta_star is not None:
            W[0] = warm.theta_star
        if warm.samples is not None:
            W[1:] = warm.samples
        if theta_star0 is not None or z0 is not None:
            def whiten(t):  # w = L⁻¹ θ = Lᵀ Σ⁻¹ θ
                return prior.cov_sqrt(prior.precision(t.to(device).float()), transpose=True)
            if theta_star0 is not None:
                W[0] = whiten(theta_star0.reshape(1, d))[0]
            if z0 is not None:
                W[1:] = whiten(z0.reshape(k, d))

        def m_norm(g: Tensor) -> Tensor:
            # ‖g‖_{M⁻¹} ≈ energy norm of the error (Euclidean without a preconditioner)
            return (g * apply_M(g)).sum(1).clamp_min(0).sqrt() if precond is not None \
                else g.norm(dim=1)

        g_init = full_grad(W)
        g0_norm = g_init.norm(dim=1).clamp_min(1e-30)
        # the system is H w = rhs with rhs = −∇L'(0) = wⁿ + Lᵀ Φᵀ t / σ²: residuals are
        # measured relative to ‖rhs‖ (in the M⁻¹ norm), as for CG, whatever the start
        at_zero = bool((W == 0).all())
        rhs_mnorm = m_norm(g_init if at_zero else full_grad(torch.zeros_like(W))).clamp_min(1e-30)
        clip = options.clip_factor * g0_norm if options.clip_factor is not None else None
        t_setup = time.perf_counter() - t0

        n_iter = int(options.iterations)
        # full-batch gradients are exact: stop once every row is well inside tol
        early_stop = options.tol is not None and full
        history = [float((m_norm(g_init) / rhs_mnorm).max())]
        if early_stop and history[0] <= 0.5 * options.tol:
            n_iter = 0  # a warm start that is already converged

        def grad(look: Tensor) -> Tensor:
            if full:
                g = data_grad(look, None, 1.0)
            else:
                idx = torch.randperm(n_angles, generator=gen)[:batch].sort().values.to(device)
                g = data_grad(look, idx, n_angles / batch)
            return g.add_(look).sub_(anchor)

        def converged(g: Tensor) -> bool:
            history.append(float((m_norm(g) / rhs_mnorm).max()))
            log.debug("STO step %d: max relative residual %.2e", 5 * (len(history) - 1),
                      history[-1])
            return history[-1] <= 0.5 * options.tol

        t1 = time.perf_counter()
        W_final, stopped_at = _nesterov_polyak(
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
            "time_per_iteration": t_solve / max(1, stopped_at), "lr": lr0, "momentum": beta,
            "curvature_max": L_max, "noise_var": noise_var, "batch_angles": batch,
            "precond_rank": precond.rank if precond is not None else 0,
            "precond_time": precond.build_time if precond is not None else 0.0}
    state = SamplerState("sto", u, e, W_final.clone(), precond)
    return PosteriorSample(sol[0], sol[1:], theta0, info, state)
