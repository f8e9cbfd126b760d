"""The exact dense oracle of a linearised Gaussian posterior (docs/method.md §9), float64.

For a :class:`~ctuq.posterior.likelihood.LinearGaussianLikelihood` of a small
problem (28² images, ``d_θ`` up to ~10⁵) everything is formed densely: ``J``
(``d_x × d_θ``, by batched VJPs in double precision), the operator ``A``
(``d_y × d_x``), ``Φ = A J``, the observation-space kernel
``K = Φ Σ Φᵀ + σ² I`` and its Cholesky factor. From these:

- ``θ* = Σ Φᵀ K⁻¹ ỹ`` (= ``H⁻¹ Φᵀ ỹ / σ²``),
- the output-space (CT: image-space) posterior covariance
  ``Cov[x | y] = J H⁻¹ Jᵀ = S − S Aᵀ K⁻¹ A S`` with ``S = J Σ Jᵀ`` (never a
  ``d_θ × d_θ`` inverse), and its diagonal,
- the evidence ``log p(y) = −½ ỹᵀ K⁻¹ ỹ − ½ log|K| − (d_y/2) log 2π``,
  differentiable in the prior hyperparameters and in ``σ²``,
- the effective number of parameters per block
  ``γ_b = d_b − Tr(Σ_b⁻¹ H⁻¹_{bb}) = Tr(K⁻¹ Φ_b Σ_b Φ_bᵀ)``,
- exact Matheron samples ``z = θ⁰ − Σ Φᵀ K⁻¹ (Φ θ⁰ + ε)`` and, for tiny
  ``d_θ``, the dense parameter-space ``H`` and ``H⁻¹``.

Memory: ``J`` is ``8 · d_θ · d_x`` bytes (the reference 28² U-net: 0.5 GB;
``dip-64`` at 64²: 3.8 GB), ``S`` and the whitened ``A S`` ``8 d_x²`` each;
``Φ`` (formed only for ``γ_b``, the differentiable evidence and the
parameter-space matrices) adds ``8 · d_θ · d_y``. Time: ``d_x`` VJPs in
float64 and one ``d_x² d_θ`` product.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.posterior.likelihood import LinearGaussianLikelihood, dense_matrix
from ctuq.posterior.priors import GaussianPrior

__all__ = ["ExactPosterior"]

log = logging.getLogger(__name__)

DTYPE = torch.float64


class ExactPosterior:
    """Dense float64 linearised posterior for small problems.

    Parameters
    ----------
    likelihood : LinearGaussianLikelihood
        Its linearisation gives ``J``, its operator ``A``, its target ``ỹ``
        (without data: no ``θ*``, no evidence).
    prior : GaussianPrior
        Its current hyperparameters are read at every call (the dense
        ``J``, ``A`` are computed once), so it can be optimised in place or
        replaced (``ex.prior = other``).
    noise_var : float or Tensor
        ``σ²``; a 0-d tensor (e.g. ``log_noise.exp()``) stays differentiable.
    J : Tensor, optional
        A precomputed dense Jacobian ``[d_x, d_θ]`` (float64).

    Attributes
    ----------
    J : Tensor, shape (d_x, d_θ)
    A : Tensor, shape (d_y, d_x)
    Phi : Tensor, shape (d_y, d_θ)
        ``A J``, formed on first use.
    y_tilde : Tensor or None, shape (d_y,)

    Notes
    -----
    Without autograd, everything goes through the prior image covariance
    ``S = J Σ Jᵀ`` (``d_x × d_x``, one ``d_x² d_θ`` product, cached for the
    current hyperparameters): ``K = A S Aᵀ + σ² I``, ``Φ Σ Jᵀ = A S``,
    ``θ* = Σ Jᵀ Aᵀ K⁻¹ ỹ``. When a prior hyperparameter or ``σ²`` requires
    grad (and grad mode is on), ``K`` is formed from ``Φ`` so that it is
    differentiable.
    """

    def __init__(self, likelihood: LinearGaussianLikelihood, prior: GaussianPrior, noise_var,
                 *, J: Tensor | None = None):
        if not isinstance(likelihood, LinearGaussianLikelihood):
            raise InputError("the dense oracle needs a Gaussian likelihood through a linear "
                             f"operator, got {type(likelihood).__name__}", field="likelihood")
        lin = likelihood.lin
        self.likelihood, self.lin, self.prior = likelihood, lin, prior
        self.noise_var = noise_var
        self.J = (lin.dense(DTYPE) if J is None else J.to(DTYPE)).detach()
        self.A = dense_matrix(likelihood.operator, DTYPE).to(self.J.device)
        self._phi: Tensor | None = None
        self.d_x, self.d_theta = self.J.shape
        self.d_y = self.A.shape[0]
        self.image_shape = lin.image_shape
        t = likelihood.target
        self.y_tilde = None if t is None else t.reshape(-1).to(DTYPE)
        self.row_chunk = 512
        self._cache: dict = {}

    @property
    def Phi(self) -> Tensor:
        """``Φ = A J``, ``[d_y, d_θ]`` (computed once)."""
        if self._phi is None:
            self._phi = self.A @ self.J
        return self._phi

    # ------------------------------------------------------------------ helpers
    def _sigma2(self, noise_var=None) -> Tensor:
        nv = self.noise_var if noise_var is None else noise_var
        if torch.is_tensor(nv):
            return nv.to(DTYPE).reshape(())
        return torch.tensor(float(nv), dtype=DTYPE, device=self.J.device)

    def _need_y(self) -> Tensor:
        if self.y_tilde is None:
            raise InputError("the exact posterior's likelihood has no data", field="y")
        return self.y_tilde

    def _needs_graph(self, noise_var=None) -> bool:
        if not torch.is_grad_enabled():
            return False
        nv = self.noise_var if noise_var is None else noise_var
        return (any(p.requires_grad for p in self.prior.parameters())
                or (torch.is_tensor(nv) and nv.requires_grad))

    def _prior_key(self):
        return (id(self.prior),) + tuple((p._version, p.data_ptr())
                                         for p in self.prior.parameters())

    def _cached(self, name: str, key, fn):
        hit = self._cache.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        with torch.no_grad():
            val = fn()
        self._cache[name] = (key, val)
        return val

    def _S(self) -> Tensor:
        def build():
            # row blocks of J Σ, so that only J and S are held in full
            S = torch.empty(self.d_x, self.d_x, dtype=DTYPE, device=self.J.device)
            for i in range(0, self.d_x, self.row_chunk):
                S[i:i + self.row_chunk] = self.prior.cov(self.J[i:i + self.row_chunk]) @ self.J.t()
            return S.add_(S.t().clone()).mul_(0.5)
        return self._cached("S", self._prior_key(), build)

    def _chol(self, noise_var=None) -> Tensor:
        s2 = self._sigma2(noise_var)
        if self._needs_graph(noise_var):
            return torch.linalg.cholesky(self.kernel(noise_var))
        key = (self._prior_key(), float(s2))
        return self._cached("chol", key, lambda: torch.linalg.cholesky(self.kernel(noise_var)))

    # ------------------------------------------------------------------ matrices
    def phi_sigma(self) -> Tensor:
        """``Φ Σ``, ``[d_y, d_θ]`` (differentiable in the prior)."""
        return self.prior.cov(self.Phi)

    def kernel(self, noise_var=None) -> Tensor:
        """``K = Φ Σ Φᵀ + σ² I``, ``[d_y, d_y]`` (differentiable when needed)."""
        eye = torch.eye(self.d_y, dtype=DTYPE, device=self.J.device)
        if self._needs_graph(noise_var):
            K = self.phi_sigma() @ self.Phi.t()
        else:
            K = self.A @ self._S() @ self.A.t()
        K = 0.5 * (K + K.t())
        return K + self._sigma2(noise_var) * eye

    def kernel_cholesky(self, noise_var=None) -> Tensor:
        """Lower Cholesky factor of ``K``."""
        return self._chol(noise_var)

    def prior_image_cov(self) -> Tensor:
        """``S = J Σ Jᵀ``, the prior covariance of the linearised image, ``[d_x, d_x]``."""
        if self._needs_graph():
            S = self.prior.cov(self.J) @ self.J.t()
            return 0.5 * (S + S.t())
        return self._S()

    # ------------------------------------------------------------------ results
    def theta_star(self) -> Tensor:
        """``θ* = Σ Φᵀ K⁻¹ ỹ = Σ Jᵀ Aᵀ K⁻¹ ỹ``, ``[d_θ]``."""
        y = self._need_y()
        alpha = torch.cholesky_solve(y.unsqueeze(1), self._chol()).squeeze(1)
        return self.prior.cov(self.J.t() @ (self.A.t() @ alpha))

    def _whitened_AS(self) -> Tensor:
        S = self.prior_image_cov()
        return torch.linalg.solve_triangular(self._chol(), self.A @ S, upper=False)

    def posterior_cov_image(self) -> Tensor:
        """``Cov[x | y] = J H⁻¹ Jᵀ = S − S Aᵀ K⁻¹ A S``, ``[d_x, d_x]``."""
        W = self._whitened_AS()
        C = self.prior_image_cov() - W.t() @ W
        return 0.5 * (C + C.t())

    def posterior_var_image(self) -> Tensor:
        """The diagonal of :meth:`posterior_cov_image`, ``[H, W]``."""
        W = self._whitened_AS()
        var = torch.diagonal(self.prior_image_cov()) - W.square().sum(0)
        return var.reshape(self.image_shape)

    def posterior_std_image(self) -> Tensor:
        """Per-pixel posterior std, ``[H, W]``."""
        return self.posterior_var_image().clamp_min(0).sqrt()

    def log_evidence(self, noise_var=None) -> Tensor:
        """``−½ ỹᵀ K⁻¹ ỹ − ½ log|K| − (d_y/2) log 2π`` (0-d, differentiable)."""
        y = self._need_y()
        L = self._chol(noise_var)
        a = torch.linalg.solve_triangular(L, y.unsqueeze(1), upper=False).squeeze(1)
        return (-0.5 * a.square().sum() - torch.log(torch.diagonal(L)).sum()
                - 0.5 * self.d_y * math.log(2 * math.pi))

    def gamma_blocks(self) -> Tensor:
        """``γ_b = Tr(K⁻¹ Φ_b Σ_b Φ_bᵀ)`` per prior block, ``[B]`` (their sum is ``γ``)."""
        kinv_phi = torch.cholesky_solve(self.Phi, self._chol())
        prod = kinv_phi * self.phi_sigma()
        return torch.stack([prod[:, sl].sum() for sl in self.prior.block_slices.values()])

    def expected_block_quadratics(self) -> Tensor:
        """``E‖z_b‖²_{C_b⁻¹} = Tr(C_b⁻¹ H⁻¹_{bb}) = a_b (d_b − γ_b)``, ``[B]``.

        For ``z ~ N(0, H⁻¹)``: what the sample-based MacKay / EM updates estimate.
        """
        dims = self.prior.block_dims.to(self.J.device)
        return self.prior.variances.to(DTYPE) * (dims - self.gamma_blocks())

    def sample(self, k: int, generator: torch.Generator | None = None, *,
               u: Tensor | None = None, e: Tensor | None = None) -> Tensor:
        """Exact zero-mean samples ``z ~ N(0, H⁻¹)`` (dense Matheron), ``[k, d_θ]``.

        ``z = θ⁰ − Σ Φᵀ K⁻¹ (Φ θ⁰ + σ e)`` with ``θ⁰ = L u``; pass the standard
        normals ``u`` ``[k, d_θ]`` and ``e`` ``[k, d_y]`` (e.g. a sampler's
        ``state.base_u``, ``state.base_e``) to reproduce its draws exactly.
        """
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        if u is None:
            u = torch.randn(k, self.d_theta, generator=gen, dtype=DTYPE)
        if e is None:
            e = torch.randn(k, self.d_y, generator=gen, dtype=DTYPE)
        u = u.to(device=self.J.device, dtype=DTYPE)
        e = e.to(device=self.J.device, dtype=DTYPE)
        with torch.no_grad():
            theta0 = self.prior.cov_sqrt(u)
            sigma = self._sigma2().sqrt()
            rhs = (theta0 @ self.J.t()) @ self.A.t() + sigma * e  # Φ θ⁰ + σ e
            X = torch.cholesky_solve(rhs.t(), self._chol()).t()
            return theta0 - self.prior.cov((X @ self.A) @ self.J)

    def precision_params(self) -> Tensor:
        """Dense ``H = ΦᵀΦ/σ² + Σ⁻¹``, ``[d_θ, d_θ]`` (tiny ``d_θ`` only)."""
        eye = torch.eye(self.d_theta, dtype=DTYPE, device=self.J.device)
        H = self.Phi.t() @ self.Phi / self._sigma2() + self.prior.precision(eye)
        return 0.5 * (H + H.t())

    def posterior_cov_params(self) -> Tensor:
        """Dense ``H⁻¹ = Σ − Σ Φᵀ K⁻¹ Φ Σ``, ``[d_θ, d_θ]`` (tiny ``d_θ`` only)."""
        eye = torch.eye(self.d_theta, dtype=DTYPE, device=self.J.device)
        PS = self.phi_sigma()
        W = torch.linalg.solve_triangular(self._chol(), PS, upper=False)
        C = self.prior.cov(eye) - W.t() @ W
        return 0.5 * (C + C.t())

    def __repr__(self) -> str:
        return f"ExactPosterior(d_x={self.d_x}, d_y={self.d_y}, d_theta={self.d_theta})"
