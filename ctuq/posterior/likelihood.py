"""The data term of the linearised model, behind one interface (docs/method.md §3).

Every client of the engine writes its linearised data term as a factor
``Φ`` (``d_y × d_θ``) of the Gauss–Newton matrix and, where there is one, a
data target ``ỹ``:

    data term  ½ ‖ỹ − Φ θ‖² / σ²       (Gaussian: ỹ the linear-model target)
               ½ ‖Φ θ‖²                (categorical at the MAP: Φ = B J, no target)

so that the posterior precision is ``H = ΦᵀΦ / σ² + Σ⁻¹`` in both cases
(``σ² = 1`` where the likelihood has no noise parameter). The noise
variance is kept outside ``Φ`` so that the EM can learn it without
rebuilding the likelihood. The samplers, priors, EM and oracles of
:mod:`ctuq.posterior` only use what :class:`Likelihood` declares:

- ``phi(v, idx)`` = ``Φ_S v`` and ``phi_t(u, idx)`` = ``Φ_Sᵀ u``, batched over
  vectors, restricted to the mini-batch ``S = idx`` of the batch axis (the
  first axis of an observation: projection angles for CT, data points for
  classifiers); ``normal(v, idx, target)`` = ``Φ_Sᵀ (Φ_S v − t_S)``,
- ``diag_normal()``: ``diag(ΦᵀΦ)`` by Rademacher probes or exactly,
- ``target``: ``ỹ`` (``obs_shape``) or None, and ``mode``: the point the
  posterior is centred on when there is no target to solve for,
- ``num_observations``: the normaliser of the g-prior's column scales,
- ``draw_batch`` / ``batches``: how a sampler draws mini-batches.

:class:`LinearGaussianLikelihood` is the Gaussian likelihood through any
linear operator ``A`` (CT: a ray transform) applied to the network output;
the categorical likelihood of classifiers is
:class:`ctuq.posterior.categorical.CategoricalLikelihood`.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.posterior.linearize import Linearization

__all__ = ["Likelihood", "LinearGaussianLikelihood", "WhitenedOperator", "dense_matrix"]


class Likelihood:
    """Interface of a linearised data term (module docstring).

    Attributes
    ----------
    lin : Linearization
        The Jacobian operator (``num_params``, ``device``, ``chunk_size``).
    obs_shape : tuple of int
        Shape of one observation-space vector (its first axis is the batch axis).
    num_observations : int
        The g-prior's normaliser: ``s_i = (diag(ΦᵀΦ)_i / num_observations)^{-1/2}``.
    target : Tensor or None
        ``ỹ``, shape ``obs_shape``; None when the likelihood has no target.
    mode : Tensor, shape (d_θ,)
        The posterior's centre when ``target`` is None (the linearisation point).
    """

    lin: Linearization
    obs_shape: tuple
    num_observations: int
    target: Tensor | None = None
    #: What the mini-batch axis counts (for messages).
    batch_axis: str = "observations"

    # -- to be provided -----------------------------------------------------------
    def phi(self, v: Tensor, idx: Tensor | None = None) -> Tensor:  # pragma: no cover
        """``Φ_S v``: ``[k, d_θ]`` → ``[k, |S|, …]`` (all of the batch axis for None)."""
        raise NotImplementedError

    def phi_t(self, u: Tensor, idx: Tensor | None = None) -> Tensor:  # pragma: no cover
        """``Φ_Sᵀ u``: ``[k, |S|, …]`` → ``[k, d_θ]``."""
        raise NotImplementedError

    def _diag_normal_exact(self) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    #: Whether ``phi``/``phi_t`` compute in float64 when given float64 (a sampler's
    #: refinement needs it); a subclass that can says so.
    supports_float64: bool = False

    def release_float64(self) -> None:
        """Drop what the float64 products keep between calls (nothing here)."""

    # -- shared ---------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        return self.lin.num_params

    @property
    def device(self):
        return self.lin.device

    @property
    def d_obs(self) -> int:
        """``d_y``: entries of one observation-space vector."""
        return math.prod(self.obs_shape)

    @property
    def batch_size_max(self) -> int:
        """Length of the mini-batch axis."""
        return int(self.obs_shape[0])

    @property
    def mode(self) -> Tensor:
        return self.lin.theta_hat

    def normal(self, v: Tensor, idx: Tensor | None = None,
               target: Tensor | None = None) -> Tensor:
        """``Φ_Sᵀ (Φ_S v − t_S)`` for ``v`` ``[k, d_θ]`` (``ΦᵀΦ v`` without a target).

        ``target`` has one row per vector, over the whole batch axis; it is
        restricted to ``idx`` here.
        """
        r = self.phi(v, idx)
        if target is not None:
            r = r - (target if idx is None else target.index_select(1, idx))
        return self.phi_t(r, idx)

    def diag_normal(self, *, n_probes: int = 256, generator: torch.Generator | None = None,
                    exact: bool = False, batch_size: int = 64) -> Tensor:
        """``diag(ΦᵀΦ)``, ``[d_θ]`` float64.

        By Rademacher probes, ``E[(Φᵀ ε)²] = diag(ΦᵀΦ)`` for ``ε_r = ±1``
        (relative error of each entry ≈ ``sqrt(2/n_probes)`` at most), or
        exactly from dense Jacobians (small problems).

        Parameters
        ----------
        n_probes : int, optional
            Default 256.
        generator : torch.Generator, optional
            CPU generator of the probes. Default: seeded with 0.
        exact : bool, optional
            Default False.
        batch_size : int, optional
            Probes per batched product. Default 64.
        """
        if exact:
            return self._diag_normal_exact()
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        acc = torch.zeros(self.num_params, dtype=torch.float64, device=self.device)
        done = 0
        while done < n_probes:
            m = min(batch_size, n_probes - done)
            eps = torch.randint(0, 2, (m, *self.obs_shape), generator=gen).float() * 2 - 1
            g = self.phi_t(eps.to(self.device))
            acc += g.double().square().sum(0)
            done += m
        return acc / n_probes

    def draw_batch(self, generator: torch.Generator, size: int) -> Tensor:
        """One random mini-batch of ``size`` indices of the batch axis."""
        return torch.randperm(self.batch_size_max, generator=generator)[:size].to(self.device)

    def batches(self, generator: torch.Generator, size: int) -> Iterator[Tensor]:
        """The mini-batches of a sampler run: epochs of a random permutation.

        Each epoch visits every index once; a remainder smaller than ``size``
        is skipped (a new permutation starts).
        """
        n = self.batch_size_max
        perm, pos = None, n
        while True:
            if pos + size > n:
                perm, pos = torch.randperm(n, generator=generator).to(self.device), 0
            yield perm[pos:pos + size]
            pos += size


class WhitenedOperator:
    """``V^{-1/2} A``: a linear operator whose range rows are divided by ``sqrt(v)``.

    ``A(x) = A₀(x) / sqrt(v)`` and ``A_adjoint(s) = A₀ᵀ(s / sqrt(v))`` (the exact
    adjoint), ``v`` a positive tensor of the range's shape (per-ray relative
    noise variances). Other attributes are those of the wrapped operator.
    """

    def __init__(self, operator, variance: Tensor):
        self.base = operator
        self.inv_sqrt = variance.rsqrt()

    def __getattr__(self, name):
        if name in ("base", "inv_sqrt"):   # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.base, name)

    def A(self, x: Tensor) -> Tensor:
        return self.base.A(x) * self.inv_sqrt.to(x.dtype)

    def A_adjoint(self, s: Tensor) -> Tensor:
        return self.base.A_adjoint(s * self.inv_sqrt.to(s.dtype))


class LinearGaussianLikelihood(Likelihood):
    """``y = A f(θ) + η``, ``η ~ N(0, σ² V)``, linearised: ``Φ = V^{-1/2} A J``, ``ỹ = V^{-1/2} y − …``.

    The target is ``ỹ = V^{-1/2}(y − A f(θ̃)) + Φ θ̃``.

    ``V = diag(v)`` holds per-ray relative noise variances (``ray_variance``;
    ``V = I`` by default, the white-noise model ``σ² I``). The likelihood is
    written in whitened form: every product with ``Φ``/``Φᵀ``, the target, the
    normal products, ``diag(ΦᵀΦ)`` (the g-prior's scales) and the dense
    oracles use ``V^{-1/2} A`` (``operator`` is the whitened one), so the
    samplers, the evidence and the EM see ``½‖ỹ − Φθ‖²/σ²`` as with white
    noise. The EM's noise update then learns the common factor ``σ²`` of
    ``σ² v_i``; with ``v`` the absolute variances (e.g. from
    :mod:`ctuq.data.counts`), keep ``σ² = 1`` fixed. The log-likelihood of
    the raw data differs from the whitened one by the constant
    ``−½ Σ log v_i`` (:attr:`log_det_variance` holds ``Σ log v_i``).

    Parameters
    ----------
    lin : Linearization
        The Jacobian operator of the fitted network (output ``[H, W]``).
    operator
        Any linear map of the network output with ``A(x)`` (``[..., *domain]`` →
        ``[..., *range]``), its adjoint ``A_adjoint(s)``, ``range_shape`` and ``domain_shape``
        (CT: :class:`ctuq.data.operators.RayTransform`). The mini-batch axis
        is the first axis of its range (the projection angles).
    y : Tensor, shape ``range_shape``, optional
        The measured data; without it there is no target (``θ*`` cannot be
        solved for, samples can).
    batch_axis : str, optional
        What the first range axis counts (messages; CT: ``"projection angles"``).
        Default ``"rows of the operator's range"``.
    ray_variance : float or Tensor, optional
        ``v``: relative noise variance per measurement, a positive scalar or a
        tensor that broadcasts to ``range_shape``; the noise covariance is
        ``σ² diag(v)``. Default None: ``v = 1`` (the operator is used
        unwrapped, bit for bit the white-noise likelihood).

    Attributes
    ----------
    operator
        The operator the likelihood applies: ``V^{-1/2} A`` (a
        :class:`WhitenedOperator`) when ``ray_variance`` is given, else ``A``.
    raw_operator
        ``A`` as given.
    y : Tensor or None
        The data as given (not whitened).
    ray_variance : Tensor or None
        ``v``, float32, ``range_shape``.
    log_det_variance : float
        ``Σ log v_i`` (0 without ``ray_variance``).

    Notes
    -----
    A mini-batch applies the full operator and selects the rows ``idx`` of
    its range (the matrix backend's cost is dominated by the network
    products); its adjoint back-projects the zero-filled rows. A step draws
    an independent random subset of rows (sorted), not epochs.
    """

    def __init__(self, lin: Linearization, operator, y: Tensor | None = None, *,
                 batch_axis: str = "rows of the operator's range", ray_variance=None):
        self.lin = lin
        self.batch_axis = batch_axis
        self.raw_operator = operator
        self.obs_shape = tuple(int(s) for s in operator.range_shape)
        self.num_observations = math.prod(self.obs_shape)
        self.ray_variance = None if ray_variance is None else self._as_variance(ray_variance)
        self.log_det_variance = 0.0 if self.ray_variance is None else float(
            self.ray_variance.double().log().sum())
        self.operator = operator if self.ray_variance is None else WhitenedOperator(
            operator, self.ray_variance)
        self.y = None if y is None else self._as_data(y)
        self.target = None if self.y is None else self._linear_target(self.y)

    def _as_data(self, y) -> Tensor:
        y = torch.as_tensor(y, dtype=torch.float32)
        shape = self.obs_shape
        if y.numel() != math.prod(shape):
            raise InputError(f"sinogram shape {tuple(y.shape)} does not match the geometry's "
                             f"{shape}", field="sinogram")
        return y.reshape(shape).to(self.lin.device)

    def _as_variance(self, v) -> Tensor:
        v = torch.as_tensor(v, dtype=torch.float32)
        if not bool(torch.isfinite(v).all()) or not bool((v > 0).all()):
            raise InputError("must be positive and finite", field="ray_variance")
        try:
            v = torch.broadcast_to(v, self.obs_shape)
        except RuntimeError:
            raise InputError(f"shape {tuple(v.shape)} does not fit the data's "
                             f"{self.obs_shape}", field="ray_variance") from None
        return v.contiguous().to(self.lin.device)

    @property
    def y_white(self) -> Tensor | None:
        """``V^{-1/2} y``: the data on the scale of ``Φ`` (``y`` without ``ray_variance``)."""
        if self.y is None or self.ray_variance is None:
            return self.y
        return self.y * self.ray_variance.rsqrt()

    def _linear_target(self, y: Tensor) -> Tensor:
        """``ỹ = V^{-1/2}(y − A f(θ̃)) + Φ θ̃``, the target of the linear model (``obs_shape``)."""
        lin, op = self.lin, self.operator
        if self.ray_variance is not None:
            y = y * self.ray_variance.rsqrt()
        with torch.no_grad():
            return y - op.A(lin.x_hat) + op.A(lin.jvp(lin.theta_hat))

    def A_subset(self, x: Tensor, idx: Tensor | None) -> Tensor:
        """``A`` restricted to the rows ``idx`` of the batch axis: ``[..., *domain]`` → ``[..., |idx|, …]``."""
        s = self.operator.A(x)
        return s if idx is None else s.index_select(-2, idx)

    def A_adjoint_subset(self, s: Tensor, idx: Tensor | None) -> Tensor:
        """Adjoint of :meth:`A_subset`: ``Aᵀ`` of the zero-filled data."""
        if idx is None:
            return self.operator.A_adjoint(s)
        full = s.new_zeros(*s.shape[:-2], self.obs_shape[0], s.shape[-1])
        full.index_copy_(-2, idx, s)
        return self.operator.A_adjoint(full)

    @property
    def supports_float64(self) -> bool:
        """Whether ``phi``/``phi_t`` compute in float64 when given float64 (the network
        recomputed in float64 and an operator that projects in float64)."""
        return bool(getattr(self.raw_operator, "supports_float64", False))

    def release_float64(self) -> None:
        """Drop the network's float64 copy (:meth:`Linearization.release_float64`)."""
        self.lin.release_float64()

    def phi(self, v: Tensor, idx: Tensor | None = None) -> Tensor:
        """``Φ_S v``; in float64 for a float64 ``v`` where :attr:`supports_float64`."""
        dtype = torch.float64 if v.dtype == torch.float64 and self.supports_float64 else None
        return self.A_subset(self.lin.jvp(v, dtype), idx)

    def phi_t(self, u: Tensor, idx: Tensor | None = None) -> Tensor:
        """``Φ_Sᵀ u``; in float64 for a float64 ``u`` where :attr:`supports_float64`."""
        dtype = torch.float64 if u.dtype == torch.float64 and self.supports_float64 else None
        return self.lin.vjp(self.A_adjoint_subset(u, idx), dtype)

    def normal(self, v: Tensor, idx: Tensor | None = None,
               target: Tensor | None = None) -> Tensor:
        r = self.A_subset(self.lin.jvp(v), idx)
        if target is not None:
            r = r - (target if idx is None else target.index_select(-2, idx))
        return self.lin.vjp(self.A_adjoint_subset(r, idx))

    def _diag_normal_exact(self) -> Tensor:
        J = self.lin.dense(torch.float64)
        A = dense_matrix(self.operator, torch.float64)
        return (A @ J).square().sum(0)

    def draw_batch(self, generator: torch.Generator, size: int) -> Tensor:
        return torch.randperm(self.batch_size_max, generator=generator)[:size].sort().values.to(
            self.device)

    def batches(self, generator: torch.Generator, size: int) -> Iterator[Tensor]:
        """Independent random subsets of ``size`` rows, one per step (sorted)."""
        while True:
            yield self.draw_batch(generator, size)


def dense_matrix(operator, dtype: torch.dtype = torch.float64) -> Tensor:
    """The dense matrix of a linear operator, ``[d_y, d_x]``, from ``operator.A`` of the basis.

    Rows in range C order (for a ray transform: angle-major), columns in
    domain C order; small problems only (28²: 800 × 784).
    """
    n0, n1 = operator.domain_shape
    eye = torch.eye(n0 * n1, device=operator.device).reshape(-1, n0, n1)
    with torch.no_grad():
        cols = operator.A(eye).reshape(n0 * n1, -1)
    return cols.t().contiguous().to(dtype)
