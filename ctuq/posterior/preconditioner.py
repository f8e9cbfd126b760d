"""The randomised Nyström preconditioner shared by both samplers (docs/method.md §5.3).

The CG sampler preconditions ``K = Φ Σ Φᵀ + σ² I`` (observation space,
``d_y``); the sample-then-optimise sampler the whitened Hessian
``(LᵀΦᵀΦL + σ² I) / σ²`` (parameter space, ``d_θ``). Both sketch a PSD
operator ``P`` and apply the same Woodbury formula; :func:`pick_preconditioner`
decides, for a warm start, whether the previous sketch is reused.
"""

from __future__ import annotations

import copy
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
                 build_time: float = 0.0, sketch: "_Sketch | None" = None):
        self.U, self.eigvals, self.hyper, self.build_time = U, eigvals, hyper, build_time
        # the test directions and their products, kept only where the rank may grow
        self.sketch = sketch

    def __getstate__(self):  # a checkpoint keeps the factors, not the sketch behind them
        return {**self.__dict__, "sketch": None}

    @property
    def rank(self) -> int:
        return int(self.eigvals.numel())

    def ratio(self, noise_var: float) -> float:
        """``λ_r / σ²``: the smallest kept eigenvalue over the noise variance.

        CG on the preconditioned ``K`` needs about ``√(1 + λ_r/σ²)`` times the
        iterations of a perfectly conditioned system (Frangella, Tropp & Udell
        2023): the quantity the adaptive rank bounds.
        """
        return float(self.eigvals[-1]) / max(float(noise_var), 1e-300)

    def evidence_scale(self, target: Tensor, noise_var: float, *,
                       log_range: float = 30.0, grid: int = 2001) -> float:
        """The common prior scale ``c`` that best explains ``target`` in the sketch's subspace.

        The projections ``c_i = u_iᵀ ỹ`` of the data on the sketch's
        eigenvectors are, under the linear model with ``Σ → c Σ``,
        independent ``N(0, c λ_i + σ²)`` (for exact eigenvectors), so
        ``log p(Uᵀỹ | c) = −½ Σ_i [c_i² / (c λ_i + σ²) + log(c λ_i + σ²)]`` is an
        exact marginal likelihood of ``r`` statistics of the data; this is its
        maximiser, found on a grid in ``log c`` and refined by a parabola
        (``σ²`` held). It costs no products: the EM's first prior scale
        (``EMOptions.initial_scale = 'sketch'``).

        Parameters
        ----------
        target : Tensor, shape (d_y,) or any shape with ``d_y`` elements
            The whitened data ``ỹ`` the sketch's ``P`` acts on.
        noise_var : float
            ``σ²``.
        log_range : float
            Search ``log c`` in ``[−log_range, log_range]``. Default 30.
        grid : int
            Grid points. Default 2001.

        Returns
        -------
        float
            ``c`` (1 when the sketch is empty or every eigenvalue is zero).
        """
        lam = self.eigvals.double().clamp_min(0.0).cpu()
        if lam.numel() == 0 or not float(lam.max()) > 0:
            return 1.0
        proj = target.reshape(-1).double().to(self.U.device) @ self.U.double()
        c2 = proj.square().cpu()
        s2 = float(noise_var)
        t = torch.linspace(-log_range, log_range, grid, dtype=torch.float64)
        k = t.exp()[:, None] * lam[None, :] + s2  # c λ_i + σ², [points, r]
        f = -0.5 * (c2[None, :] / k + k.log()).sum(1)
        i = int(f.argmax())
        if 0 < i < grid - 1:  # the vertex of the parabola through the three points
            f0, f1, f2 = (float(v) for v in f[i - 1:i + 2])
            h = float(t[1] - t[0])
            den = f0 - 2 * f1 + f2
            best = float(t[i]) + (0.5 * h * (f0 - f2) / den if den < 0 else 0.0)
        else:
            best = float(t[i])
        return math.exp(best)

    @classmethod
    def build(cls, apply_P: Callable[[Tensor], Tensor], d_y: int, rank: int, *,
              oversample: int = 10, power_iters: int = 1,
              generator: torch.Generator | None = None,
              device=None, dtype=torch.float32, chunk: int | None = None,
              hyper: Tensor | None = None,
              cancel: Callable[[], bool] | None = None,
              progress: Callable | None = None,
              stage: str = "preconditioner",
              keep_sketch: bool = False) -> "NystromPreconditioner":
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
        keep_sketch : bool
            Keep the test directions and their products, so that the rank can
            grow later (:meth:`grown`: the products already made are kept, and
            the sketch costs what a direct build at the final rank costs).
            Default False.

        Raises
        ------
        Cancelled
            When ``cancel()`` returned True.
        """
        t0 = time.perf_counter()
        sketch = _Sketch(apply_P, d_y, oversample, power_iters, generator, device, dtype,
                         chunk, cancel, progress, stage)
        rank = max(1, min(int(rank), d_y))
        sketch.extend(min(d_y, rank + sketch.oversample))
        return cls._from_sketch(sketch, rank, hyper, time.perf_counter() - t0,
                                keep=keep_sketch)

    @classmethod
    def _from_sketch(cls, sketch: "_Sketch", rank: int, hyper, seconds: float,
                     keep: bool) -> "NystromPreconditioner":
        U, lam = sketch.nystrom(rank)
        return cls(U, lam, hyper, seconds, sketch if keep else None)

    def grown(self, max_rank: int, max_ratio: float, noise_var: float,
              apply_P: Callable[[Tensor], Tensor] | None = None) -> "NystromPreconditioner":
        """This sketch, its rank doubled (at most to ``max_rank``) while ``λ_r/σ² > max_ratio``.

        Only the new directions' products are made: the test space of a
        rank ``2r`` build is this one's plus ``r`` orthogonal directions
        (with a power iteration, ``P`` of them), and the Nyström
        approximation depends on the test space alone. The sketch must be
        of the current ``P`` (fresh, or :meth:`rescaled`); ``apply_P``
        replaces the operator it was built with. Returns ``self`` when
        nothing grows (or no sketch was kept).
        """
        pc = self
        while (pc.sketch is not None and pc.rank < max_rank
               and pc.sketch.columns < pc.sketch.d_y and pc.ratio(noise_var) > max_ratio):
            t0 = time.perf_counter()
            rank = min(2 * pc.rank, int(max_rank), pc.sketch.d_y)
            log.info("Nyström rank %d -> %d (λ_r/σ² = %.3g > %.3g)", pc.rank, rank,
                     pc.ratio(noise_var), max_ratio)
            sketch = copy.copy(pc.sketch)  # extend() rebinds Q and Y: the old pc keeps its own
            if apply_P is not None:
                sketch.apply_P = apply_P
            sketch.extend(min(sketch.d_y, rank + sketch.oversample))
            pc = type(self)._from_sketch(sketch, rank, pc.hyper,
                                         pc.build_time + time.perf_counter() - t0, keep=True)
        return pc

    def rescaled(self, factor: float, hyper: Tensor | None = None) -> "NystromPreconditioner":
        """The sketch of ``factor · P``: same ``U``, eigenvalues times ``factor`` (exact).

        A Nyström sketch is linear in ``P`` for fixed test directions, so
        when only a common prior scale moved (``Σ → c Σ`` makes both
        ``Φ Σ Φᵀ`` and ``LᵀΦᵀΦL`` scale by ``c``) this *is* the sketch that a
        rebuild with the same directions would give, at no products. A kept
        sketch is rescaled with it (it may still grow).
        """
        sketch = self.sketch.rescaled(float(factor)) if self.sketch is not None else None
        return NystromPreconditioner(self.U, self.eigvals * float(factor), hyper,
                                     self.build_time, sketch)

    def __call__(self, X: Tensor, noise_var: float) -> Tensor:
        """``M⁻¹ X`` for rows ``X`` ``[m, d_y]`` (computed in float64)."""
        coef = (self.eigvals[-1] + noise_var) / (self.eigvals + noise_var)  # (0, 1]
        X64 = X.to(torch.float64)
        proj = X64 @ self.U  # [m, r]
        out = torch.addmm(X64, proj * (coef - 1.0), self.U.t())
        return out.to(X.dtype)


class _Sketch:
    """Orthonormal test directions ``Q`` ``[d_y, s]`` and ``Y = P Q``, extendable.

    The first :meth:`extend` is the classic build (Gaussian directions, then
    ``power_iters`` subspace iterations); a later one draws new Gaussian
    directions, applies the same iterations to them and orthogonalises the
    result against ``Q``, so the test space is ``range Pᵖ [all directions]``,
    the one a direct build with all of them spans.
    """

    def __init__(self, apply_P, d_y, oversample, power_iters, generator, device, dtype,
                 chunk, cancel, progress, stage):
        self.apply_P, self.d_y = apply_P, int(d_y)
        self.oversample, self.power_iters = max(0, int(oversample)), max(0, int(power_iters))
        self.generator, self.device, self.dtype = generator, device, dtype
        self.step = max(1, int(chunk)) if chunk is not None else 32
        self.cancel, self.progress, self.stage = cancel, progress, stage
        self.Q = self.Y = None  # float64
        self.scale = 1.0  # Y of the current P is scale * self.Y
        self.done = 0

    @property
    def columns(self) -> int:
        return 0 if self.Q is None else int(self.Q.shape[1])

    def rescaled(self, factor: float) -> "_Sketch":
        other = copy.copy(self)
        other.scale = self.scale * factor
        return other

    def _apply(self, omega: Tensor, total: int) -> Tensor:
        """``P omega`` for orthonormal columns ``omega`` ``[d_y, m]`` (float64 out)."""
        rows = omega.t().contiguous().to(device=self.device, dtype=self.dtype)
        parts = []
        for i in range(0, rows.shape[0], self.step):
            check_cancel(self.cancel, "preconditioner")
            parts.append(self.apply_P(rows[i:i + self.step]))
            self.done += parts[-1].shape[0]
            emit_progress(self.progress, self.stage, self.done, total,
                          f"Nyström sketch: {self.done}/{total} products")
        return torch.cat(parts).detach().to(torch.float64).t()

    def extend(self, columns: int) -> None:
        """Grow the test space to ``columns`` directions (``(power_iters + 1)`` products each)."""
        new = int(columns) - self.columns
        if new <= 0:
            return
        total = self.done + new * (self.power_iters + 1)
        omega = torch.randn(self.d_y, new, generator=self.generator, dtype=torch.float64)
        omega = torch.linalg.qr(omega).Q
        for _ in range(self.power_iters):  # subspace iteration sharpens the sketch
            omega = torch.linalg.qr(self._apply(omega, total)).Q
        if self.Q is not None:  # range [Q, omega] = range P^p [all directions drawn]
            omega = torch.linalg.qr(self._orth(omega.to(self.Q.device))).Q
        Y = self._apply(omega, total)
        omega = omega.to(Y.device)
        if self.Q is None:
            self.Q, self.Y = omega, Y
        else:  # store Y at the stored scale
            self.Q, self.Y = torch.cat([self.Q, omega], 1), torch.cat([self.Y, Y / self.scale], 1)

    def _orth(self, omega: Tensor) -> Tensor:
        Q = self.Q.to(omega.device)
        for _ in range(2):  # twice is enough (Kahan-Parlett)
            omega = omega - Q @ (Q.t() @ omega)
        return omega

    def nystrom(self, rank: int) -> tuple[Tensor, Tensor]:
        """``U`` ``[d_y, rank]`` and ``Λ`` of the stable Nyström approximation
        (Tropp et al. 2017)."""
        omega, Y = self.Q, self.Y * self.scale if self.scale != 1.0 else self.Y
        nu = math.sqrt(self.d_y) * torch.finfo(self.dtype).eps \
            * float(torch.linalg.matrix_norm(Y, 2))
        nu = max(nu, 1e-30)
        Y_nu = Y + nu * omega
        core = omega.t() @ Y_nu
        core = 0.5 * (core + core.t())
        s = core.shape[0]
        C = torch.linalg.cholesky(core + 1e-12 * core.diagonal().abs().max()
                                  * torch.eye(s, dtype=core.dtype, device=core.device))
        B = torch.linalg.solve_triangular(C, Y_nu.t(), upper=False).t()  # Y_nu C^{-T}
        U, S, _ = torch.linalg.svd(B, full_matrices=False)
        lam = (S.square() - nu).clamp_min(0.0)
        return U[:, :rank].contiguous(), lam[:rank]


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
