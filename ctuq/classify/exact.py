"""The classifier's exact dense oracle: full-GGN linearised Laplace in float64 (docs/method.md §9).

Parameter-space (``d_θ × d_θ``), with the Laplace evidence at the fixed
MAP ``θ̂``: the classification counterpart of
:class:`ctuq.posterior.oracle.ExactPosterior`, whose observation space
(``N·C`` here) would be the larger one.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.posterior import BlockPrior, ClassifierLinearization, GaussianPrior, b_mul_jacobian
from ctuq.progress import check_cancel, emit_progress
from ctuq.classify.predictive import gaussian_mc_predictive, probit_predictive

__all__ = ["ExactLLA"]


def _diagonal_structure(prior: GaussianPrior) -> tuple[Tensor, Tensor]:
    """``(c, block_index)`` with ``Σ_ii = a_{b(i)} c_i`` for diagonal priors."""
    if isinstance(prior, BlockPrior) and prior.kind != "iso":
        if any(prior.matern_blocks):
            raise InputError("the exact classifier LLA needs a diagonal prior ('ard' or "
                             "'gprior')", field="prior")
    idx = torch.zeros(prior.num_params, dtype=torch.long)
    for b, sl in enumerate(prior.block_slices.values()):
        idx[sl] = b
    with torch.no_grad():
        a = prior.variances.detach().double().cpu()
        diag = prior.cov(torch.ones(1, prior.num_params, dtype=torch.float64,
                                    device=prior._device()))[0].cpu()
    return diag / a[idx], idx


class ExactLLA:
    """Dense float64 full-GGN linearised Laplace (small classifiers: ``d_θ`` ≲ 5 000).

    Parameters
    ----------
    clin : ClassifierLinearization
    x : Tensor, shape (N, 1, H, W)
        Training inputs.
    y : Tensor, shape (N,)
        Labels (for the likelihood term of the evidence).

    Attributes
    ----------
    G : Tensor, shape (d_θ, d_θ)
        ``Σ_n J_nᵀ Λ_n J_n`` in float64.
    log_lik : float
        ``Σ_n log p(y_n | x_n, θ̂)``.
    seconds_ggn : float
    """

    def __init__(self, clin: ClassifierLinearization, x: Tensor, y: Tensor, *,
                 progress=None, cancel=None):
        t0 = time.perf_counter()
        self.clin = clin
        d = clin.num_params
        self.G = torch.zeros(d, d, dtype=torch.float64)
        log_lik = 0.0
        n, done = x.shape[0], 0
        for logits, J in self._jacobian_chunks(x, cancel):  # J: [n_i, C, d]
            BJ = b_mul_jacobian(torch.softmax(logits, -1), J).reshape(-1, d)
            self.G.addmm_(BJ.t(), BJ)
            lp = torch.log_softmax(logits, -1)
            yi = y[done:done + len(lp)]
            log_lik += float(lp[torch.arange(len(lp)), yi].sum())
            done += len(lp)
            emit_progress(progress, "exact", done, n, "GGN")
        self.G = 0.5 * (self.G + self.G.t())
        self.log_lik = log_lik
        self.theta = clin.theta_hat.double().cpu()
        self.seconds_ggn = time.perf_counter() - t0
        self._chol: tuple | None = None

    def _jacobian_chunks(self, x: Tensor, cancel=None):
        """``(f(x_i, θ̂), J(x_i))`` in float64 on the CPU, per chunk of the inputs (in order)."""
        step = max(1, self.clin.data_chunk // 8)
        for i in range(0, x.shape[0], step):
            check_cancel(cancel, "exact GGN")
            xi = x[i:i + step]
            yield self._logits64(xi), self.clin.jacobian(xi, torch.float64).cpu()

    @staticmethod
    def _prior_diagonal(prior: GaussianPrior) -> tuple[Tensor, Tensor]:
        """The prior's diagonal ``Σ_ii`` ``[d_θ]`` (float64, CPU) and each entry's block."""
        c, idx = _diagonal_structure(prior)
        return prior.variances.detach().double().cpu()[idx] * c, idx

    def _logits64(self, x: Tensor) -> Tensor:
        clin = self.clin
        fixed = {k: v.double() if v.is_floating_point() else v for k, v in clin._fixed.items()}
        with torch.no_grad():
            return clin._f_raw(clin.theta_hat.double(), fixed,
                               x.to(clin.device, torch.float64)).cpu()

    # -- evidence ---------------------------------------------------------------
    def log_evidence(self, log_a: Tensor, prior: GaussianPrior) -> Tensor:
        """Laplace evidence at ``θ̂`` for block variances ``exp(log_a)`` (differentiable).

        ``log p(D|θ̂) − ½ θ̂ᵀΣ⁻¹θ̂ − ½ log|Σ| − ½ log|G + Σ⁻¹|``.
        """
        c, idx = _diagonal_structure(prior)
        var = log_a.exp()[idx] * c
        H = self.G + torch.diag(1.0 / var)
        L = torch.linalg.cholesky(H)
        return (self.log_lik - 0.5 * (self.theta.square() / var).sum() - 0.5 * var.log().sum()
                - torch.log(torch.diagonal(L)).sum())

    def optimize_prior(self, prior: GaussianPrior, *, max_iter: int = 100,
                       tol: float = 1e-7) -> dict:
        """The exact evidence optimum over ``log a_b`` (L-BFGS); sets ``prior`` to it.

        Returns
        -------
        dict
            ``variances`` (list), ``log_evidence``, ``gamma`` (exact ``γ_b``,
            list), ``evaluations``, ``seconds``, ``grad_norm``.
        """
        t0 = time.perf_counter()
        log_a = prior.variances.detach().double().cpu().log().clone().requires_grad_(True)
        opt = torch.optim.LBFGS([log_a], lr=1, max_iter=max_iter, tolerance_grad=tol,
                                tolerance_change=1e-12, history_size=20,
                                line_search_fn="strong_wolfe")
        n_eval = [0]
        scale = float(max(1, self.theta.numel()))  # objective per parameter

        def closure():
            opt.zero_grad()
            n_eval[0] += 1
            loss = -self.log_evidence(log_a, prior) / scale
            loss.backward()
            return loss

        opt.step(closure)
        loss = closure().detach()
        prior.set_hyperparameters(variances=log_a.detach().exp())
        gamma = self.gamma(prior)
        return {"variances": log_a.detach().exp().tolist(),
                "log_evidence": -float(loss) * scale, "gamma": gamma.tolist(),
                "evaluations": n_eval[0], "seconds": time.perf_counter() - t0,
                "grad_norm": float(log_a.grad.norm())}

    # -- posterior --------------------------------------------------------------
    def hessian(self, prior: GaussianPrior) -> Tensor:
        """``H = G + Σ⁻¹``, ``[d_θ, d_θ]``."""
        return self.G + torch.diag(1.0 / self._prior_diagonal(prior)[0])

    def cholesky(self, prior: GaussianPrior) -> Tensor:
        """Lower Cholesky factor of :meth:`hessian` (cached per hyperparameters)."""
        key = tuple(prior.variances.detach().double().cpu().tolist())
        if self._chol is None or self._chol[0] != key:
            self._chol = (key, torch.linalg.cholesky(self.hessian(prior)))
        return self._chol[1]

    def covariance(self, prior: GaussianPrior) -> Tensor:
        """``H⁻¹``, ``[d_θ, d_θ]``."""
        return torch.cholesky_inverse(self.cholesky(prior))

    def gamma(self, prior: GaussianPrior) -> Tensor:
        """Exact ``γ_b = d_b − Tr(Σ_b⁻¹ H⁻¹_{bb})``, ``[B]``."""
        var, idx = self._prior_diagonal(prior)
        per = self.covariance(prior).diagonal() / var
        return prior.block_dims - torch.zeros(prior.num_blocks, dtype=torch.float64
                                              ).index_add_(0, idx, per)

    def solve_whitened(self, prior: GaussianPrior, rhs: Tensor) -> Tensor:
        """``(I + Lᵀ G L)⁻¹ rhs`` for whitened right-hand sides ``[k, d_θ]`` (STO's system)."""
        Ls = prior.cov_sqrt(torch.eye(prior.num_params, dtype=torch.float64,
                                      device=prior._device())).t().cpu()  # rows → columns
        Hw = torch.eye(prior.num_params, dtype=torch.float64) + Ls.t() @ self.G @ Ls
        return torch.linalg.solve(Hw, rhs.double().cpu().t()).t()

    def function_covariance(self, prior: GaussianPrior, x: Tensor) -> tuple[Tensor, Tensor]:
        """``f(x, θ̂)`` ``[n, C]`` and ``Σ(x) = J(x) H⁻¹ J(x)ᵀ`` ``[n, C, C]`` (float64)."""
        L = self.cholesky(prior)
        means, covs = [], []
        for f, J in self._jacobian_chunks(x):
            n, C, d = J.shape
            W = torch.linalg.solve_triangular(L, J.reshape(n * C, d).t(), upper=False)
            W = W.t().reshape(n, C, d)
            covs.append(W @ W.transpose(1, 2))
            means.append(f)
        return torch.cat(means), torch.cat(covs)

    def prior_scale_basis(self, prior: GaussianPrior) -> tuple[Tensor, Tensor]:
        """``(W, lam)`` with ``(G + c Σ⁻¹)⁻¹ = W diag(1 / (lam + c)) Wᵀ`` for all ``c > 0``.

        ``Σ^{1/2} G Σ^{1/2} = U diag(lam) Uᵀ`` (one symmetric eigendecomposition),
        ``W = Σ^{1/2} U``: the posterior for any multiple of the prior precision
        without a new factorisation (:func:`tune_prior_scale`).

        Returns
        -------
        W : Tensor, shape (d_θ, d_θ), float64
        lam : Tensor, shape (d_θ,), float64 (clamped at 0)
        """
        sd = self._prior_diagonal(prior)[0].sqrt()
        lam, U = torch.linalg.eigh(sd[:, None] * self.G * sd[None, :])
        return sd[:, None] * U, lam.clamp_min(0)

    def prior_scale_factor(self, W: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """``f(x, θ̂)`` ``[n, C]`` and ``K = J(x) W`` ``[n, C, d_θ]`` (float64) for
        :func:`scaled_prior_covariance`."""
        means, ks = zip(*((f, J @ W) for f, J in self._jacobian_chunks(x)))
        return torch.cat(means), torch.cat(ks)

    def predict(self, prior: GaussianPrior, x: Tensor, method: str = "mc",
                n_samples: int = 1000, generator: torch.Generator | None = None) -> Tensor:
        """Predictive probabilities ``[n, C]`` by ``'mc'`` over the exact Gaussian or ``'probit'``."""
        f, cov = self.function_covariance(prior, x)
        if method == "probit":
            return probit_predictive(f, cov.diagonal(dim1=-2, dim2=-1))
        if method == "mc":
            return gaussian_mc_predictive(f, cov, n_samples, generator)
        raise InputError(f"must be 'mc' or 'probit', got {method!r}", field="predictive")
