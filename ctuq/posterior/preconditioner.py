"""The randomised Nyström preconditioner shared by both samplers (docs/method.md §5.3).

The CG sampler preconditions ``K = Φ Σ Φᵀ + σ² I`` (observation space,
``d_y``); the sample-then-optimise sampler the whitened Hessian
``(LᵀΦᵀΦL + σ² I) / σ²`` (parameter space, ``d_θ``). Both sketch a PSD
operator ``P`` and apply the same Woodbury formula; :func:`pick_preconditioner`
decides, for a warm start, whether the previous sketch is reused.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import torch
from torch import Tensor

from ctuq.progress import check_cancel, emit_progress

__all__ = ["NystromPreconditioner", "pick_preconditioner", "hyper_vector"]

log = logging.getLogger(__name__)


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
              cancel: Callable[[], bool] | None = None,
              progress: Callable | None = None,
              stage: str = "preconditioner") -> "NystromPreconditioner":
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
        progress : callable, optional
            Gets ``(stage, products done, products in all, message)`` after
            every chunk (at 512² on 2 CPU cores the sketch takes tens of
            minutes: it must not look like a hang).
        stage : str
            Stage name of those events. Default ``'preconditioner'``.

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
        n_products = s * (max(0, int(power_iters)) + 1)
        done = 0

        def sketch(rows: Tensor) -> Tensor:
            nonlocal done
            parts = []
            for i in range(0, s, step):
                check_cancel(cancel, "preconditioner")
                parts.append(apply_P(rows[i:i + step]))
                done += parts[-1].shape[0]
                emit_progress(progress, stage, done, n_products,
                              f"Nyström sketch: {done}/{n_products} products")
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

    def rescaled(self, factor: float, hyper: Tensor | None = None) -> "NystromPreconditioner":
        """The sketch of ``factor · P``: same ``U``, eigenvalues times ``factor`` (exact).

        A Nyström sketch is linear in ``P`` for fixed test directions, so
        when only a common prior scale moved (``Σ → c Σ`` makes both
        ``Φ Σ Φᵀ`` and ``LᵀΦᵀΦL`` scale by ``c``) this *is* the sketch that a
        rebuild with the same directions would give, at no products.
        """
        return NystromPreconditioner(self.U, self.eigvals * float(factor), hyper,
                                     self.build_time)

    def __call__(self, X: Tensor, noise_var: float) -> Tensor:
        """``M⁻¹ X`` for rows ``X`` ``[m, d_y]`` (computed in float64)."""
        coef = (self.eigvals[-1] + noise_var) / (self.eigvals + noise_var)  # (0, 1]
        X64 = X.to(torch.float64)
        proj = X64 @ self.U  # [m, r]
        out = torch.addmm(X64, proj * (coef - 1.0), self.U.t())
        return out.to(X.dtype)


def hyper_vector(prior) -> Tensor:
    """Every log-hyperparameter of ``prior``, flat float64 on the CPU (reuse decisions)."""
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).double().cpu() for p in prior.parameters()])


def pick_preconditioner(previous: "NystromPreconditioner | None", forced: bool, prior,
                        reuse_tol: float | None,
                        build: Callable[[Tensor], "NystromPreconditioner"], *,
                        rescale: bool = True) -> "NystromPreconditioner":
    """``previous`` when it may be reused, else ``build(hyper_vector(prior))``.

    Used as it is when it was passed explicitly (``forced``). Otherwise, when
    only a common scale of the prior moved since it was built (the g-prior's
    ``g``; every block variance of a block prior by the same factor, length
    scales unchanged: ``prior.log_scale_change``), it is rescaled exactly at
    no cost, however far the scale moved. Else it is reused while no
    log-hyperparameter moved by more than ``reuse_tol`` (None: never reuse):
    a stale preconditioner still preconditions, only less sharply. The noise
    variance enters at apply time and may change freely.

    ``rescale=False`` keeps the stale sketch even for a pure scale change: the
    sample-then-optimise sampler runs a fixed number of steps, so its samples
    depend on the preconditioner, and the classification benchmark's figures
    were measured with the stale one (a rescaled sketch moved its rotated-digits
    NLL from 5.2 to 7.1 on the golden run: that needs a validation run first).
    CG solves to a tolerance, so there the sketch changes only the cost.
    """
    hyper = hyper_vector(prior)
    if previous is None:
        return build(hyper)
    comparable = previous.hyper is not None and previous.hyper.shape == hyper.shape
    if rescale and comparable and not forced:
        shift = getattr(prior, "log_scale_change", lambda _old: None)(previous.hyper)
        if shift == 0.0:
            return previous
        if shift is not None:
            log.debug("rescaling the Nyström preconditioner by %.4g", math.exp(shift))
            return previous.rescaled(math.exp(shift), hyper)
    if forced or (reuse_tol is not None and comparable
                  and float((previous.hyper - hyper).abs().max()) <= reuse_tol):
        log.debug("reusing the Nyström preconditioner (rank %d)", previous.rank)
        return previous
    return build(hyper)
