"""The exact evidence of a linearised Gaussian model and its dense sampler (docs/method.md §9).

:class:`EvidenceOracle` evaluates the exact float64 evidence (dense ``Φ``,
block Gram matrices ``Φ_b C_b Φ_bᵀ`` so that one evaluation costs one
``d_y³`` Cholesky), the exact ``γ_b``, ``θ*`` and per-pixel variance, and
finds the exact optimum by L-BFGS on the log-hyperparameters.
:class:`DenseSampler` draws exact Matheron samples from the same ``Φ``: the
E-step of the exact reference (no solver error, only Monte-Carlo error).
Small problems only (28² images).
"""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.posterior.oracle import ExactPosterior
from ctuq.posterior.priors import BlockPrior, GaussianPrior
from ctuq.posterior.samples import PosteriorSample, SamplerState

__all__ = ["EvidenceOracle", "DenseSampler"]


class EvidenceOracle:
    """Exact float64 evidence of the linearised model and its optimum (small problems).

    The dense ``Φ`` comes from :class:`ctuq.posterior.oracle.ExactPosterior`; the
    block Gram matrices ``G_b = Φ_b C_b Φ_bᵀ`` (``C_b`` at the prior's current
    lengthscales) are formed once, so that ``K = Σ_b a_b G_b + σ² I`` costs
    ``B d_y²`` plus one ``d_y³`` Cholesky per evaluation. With
    ``lengthscales=True`` the kernel is rebuilt from ``Φ`` at every
    evaluation instead (``d_y² d_θ``).

    Parameters
    ----------
    likelihood : LinearGaussianLikelihood
        The model and its data.
    prior : GaussianPrior
        Its block structure and (fixed) lengthscales; its hyperparameters are
        the starting point of :meth:`optimize` and are not modified.
    exact : ExactPosterior, optional
        Reuse an existing dense oracle (its ``Φ`` and ``ỹ``).
    """

    def __init__(self, likelihood, prior: GaussianPrior, *,
                 exact: ExactPosterior | None = None):
        self.likelihood, self.lin, self.prior = likelihood, likelihood.lin, prior
        if exact is None:
            exact = ExactPosterior(likelihood, prior, 1.0)
        self.exact = exact
        self.Phi = exact.Phi
        self.y_tilde = exact.y_tilde
        self.d_y = int(self.Phi.shape[0])
        with torch.no_grad():
            a = prior.variances.detach().to(torch.float64).to(self.Phi.device)
            ps = prior.cov(self.Phi)  # Φ Σ
            self.grams = torch.stack([
                (ps[:, sl] @ self.Phi[:, sl].t()) / a[i]
                for i, sl in enumerate(prior.block_slices.values())])  # [B, d_y, d_y]
            self.grams = 0.5 * (self.grams + self.grams.transpose(1, 2))
        self._eye = torch.eye(self.d_y, dtype=torch.float64, device=self.Phi.device)
        self._l_built = (prior.log_l.detach().clone() if isinstance(prior, BlockPrior)
                         else None)

    def kernel_for(self, prior: GaussianPrior, noise_var) -> Tensor:
        """``K`` for a prior with this oracle's block structure (fast path while its
        lengthscales are those the Grams were built with)."""
        log_noise = torch.as_tensor(noise_var, dtype=torch.float64,
                                    device=self.Phi.device).log()
        if self._l_built is not None and not torch.equal(
                prior.log_l.detach().to(self._l_built.device), self._l_built):
            return self.kernel(None, log_noise, prior)
        log_a = prior.variances.detach().double().to(self.Phi.device).log()
        return self.kernel(log_a, log_noise)

    # -- evaluation ------------------------------------------------------------------
    def kernel(self, log_a: Tensor, log_noise: Tensor, prior: GaussianPrior | None = None
               ) -> Tensor:
        """``K`` for block log-variances ``log_a`` and ``log σ²`` (differentiable)."""
        if prior is not None:  # rebuild from Φ (lengthscales may differ)
            ps = prior.cov(self.Phi)
            K = ps @ self.Phi.t()
            K = 0.5 * (K + K.t())
        else:
            K = torch.einsum("b,bij->ij", log_a.exp(), self.grams)
        return K + log_noise.exp() * self._eye

    def log_evidence(self, a=None, noise_var=None, *, prior: GaussianPrior | None = None
                     ) -> Tensor:
        """``log p(y)`` at block variances ``a`` (default: the prior's) and ``σ²``.

        ``a`` and ``noise_var`` may be tensors (differentiable); with
        ``prior`` given the kernel is rebuilt from it (lengthscales included).
        """
        log_a, log_noise = self._logs(a, noise_var)
        K = self.kernel(log_a, log_noise, prior)
        L = torch.linalg.cholesky(K)
        w = torch.linalg.solve_triangular(L, self.y_tilde.unsqueeze(1), upper=False)
        return (-0.5 * w.square().sum() - torch.log(torch.diagonal(L)).sum()
                - 0.5 * self.d_y * math.log(2 * math.pi))

    def _logs(self, a, noise_var) -> tuple[Tensor, Tensor]:
        dev = self.Phi.device
        if a is None:
            log_a = self.prior.variances.detach().double().to(dev).log()
        else:
            log_a = torch.as_tensor(a, dtype=torch.float64, device=dev).log()
        if noise_var is None:
            raise InputError("noise variance needed", field="noise_var")
        log_noise = torch.as_tensor(noise_var, dtype=torch.float64, device=dev).log()
        return log_a, log_noise

    def gamma(self, a=None, noise_var=None) -> Tensor:
        """Exact ``γ_b = a_b Tr(K⁻¹ G_b)`` per block, ``[B]``."""
        log_a, log_noise = self._logs(a, noise_var)
        with torch.no_grad():
            L = torch.linalg.cholesky(self.kernel(log_a, log_noise))
            kinv = torch.cholesky_inverse(L)
            return log_a.exp() * torch.einsum("ij,bji->b", kinv, self.grams)

    def block_quadratics_star(self, a=None, noise_var=None) -> Tensor:
        """Exact ``‖θ*_b‖²_{C_b⁻¹} = a_b² αᵀ G_b α`` (``α = K⁻¹ỹ``) per block, ``[B]``."""
        log_a, log_noise = self._logs(a, noise_var)
        with torch.no_grad():
            L = torch.linalg.cholesky(self.kernel(log_a, log_noise))
            alpha = torch.cholesky_solve(self.y_tilde.unsqueeze(1), L).squeeze(1)
            return log_a.exp().square() * torch.einsum("i,bij,j->b", alpha, self.grams, alpha)

    def posterior_variance(self, a=None, noise_var=None) -> Tensor:
        """Exact per-pixel posterior variance ``diag(J H⁻¹ Jᵀ)`` at ``(a, σ²)``, ``[H, W]``.

        ``diag(J Σ Jᵀ) − diag(J Σ Φᵀ K⁻¹ Φ Σ Jᵀ)`` from per-block pieces
        ``J_b C_b Φ_bᵀ`` and ``diag(J_b C_b J_bᵀ)`` formed once (at the
        Grams' lengthscales), so a new ``(a, σ²)`` costs one ``d_y³`` solve.
        """
        log_a, log_noise = self._logs(a, noise_var)
        with torch.no_grad():
            if not hasattr(self, "_jpieces"):
                J = self.exact.J
                a0 = self.prior.variances.detach().to(torch.float64).to(J.device)
                js = self.prior.cov(J)  # J Σ (rows)
                self._jpieces = torch.stack([
                    js[:, sl] @ self.Phi[:, sl].t() / a0[i]
                    for i, sl in enumerate(self.prior.block_slices.values())])  # [B, d_x, d_y]
                self._jdiag = torch.stack([
                    (js[:, sl] * J[:, sl]).sum(1) / a0[i]
                    for i, sl in enumerate(self.prior.block_slices.values())])  # [B, d_x]
            av = log_a.exp()
            M = torch.einsum("b,bij->ij", av, self._jpieces)  # J Σ Φᵀ
            L = torch.linalg.cholesky(self.kernel(log_a, log_noise))
            W = torch.linalg.solve_triangular(L, M.t(), upper=False)
            var = av @ self._jdiag - W.square().sum(0)
        return var.reshape(self.lin.image_shape)

    # -- the optimum ------------------------------------------------------------------
    def optimize(self, noise_var: float, *, learn_noise: bool = True,
                 lengthscales: bool = False, max_iter: int = 500, tol: float = 1e-8,
                 a0=None) -> dict:
        """The exact evidence optimum over ``log a_b`` (and ``log σ²``, ``log ℓ_b``) by L-BFGS.

        Parameters
        ----------
        noise_var : float
            Initial (or, with ``learn_noise=False``, fixed) ``σ²``.
        learn_noise : bool
        lengthscales : bool
            Also optimise the Matérn lengthscales (slow path, rebuilds ``K``).
        max_iter : int
            L-BFGS iterations.
        tol : float
            Gradient tolerance (of ``−log p / d_y``). Default 1e-8.
        a0 : array_like, optional
            Initial variances (default: the prior's).

        Returns
        -------
        dict
            ``a_b`` (list), ``l_b`` (list or None), ``sigma2``, ``log_evidence``,
            ``gamma`` (per block, list), ``iterations``, ``seconds``, ``grad_norm``.
        """
        t0 = time.perf_counter()
        dev = self.Phi.device
        start = self.prior.variances.detach().double() if a0 is None else \
            torch.as_tensor(a0, dtype=torch.float64)
        log_noise = torch.tensor(math.log(noise_var), dtype=torch.float64, device=dev,
                                 requires_grad=learn_noise)
        work = None
        if lengthscales and isinstance(self.prior, BlockPrior):
            work = copy.deepcopy(self.prior)
            with torch.no_grad():
                work.log_a.copy_(start.log().to(work.log_a.device))
            log_a = work.log_a
            params = [work.log_a, work.log_l]
        else:
            log_a = start.to(dev).log().clone().requires_grad_(True)
            params = [log_a]
        if learn_noise:
            params.append(log_noise)
        opt = torch.optim.LBFGS(params, lr=1, max_iter=max_iter, tolerance_grad=tol,
                                tolerance_change=1e-14, history_size=50,
                                line_search_fn="strong_wolfe")
        n_eval = [0]

        def neg() -> Tensor:
            if work is not None:
                return -self._log_evidence_prior(work, log_noise)
            return self._neg(log_a, log_noise)

        def closure():
            opt.zero_grad()
            n_eval[0] += 1
            if work is None:  # analytic gradient on the fast path
                with torch.no_grad():
                    value, ga, gn = self._neg_and_grad(log_a, log_noise)
                log_a.grad = ga / self.d_y
                if learn_noise:
                    log_noise.grad = gn.reshape(()) / self.d_y
                return value / self.d_y
            loss = neg() / self.d_y
            loss.backward()
            return loss

        opt.step(closure)
        loss = closure()
        with torch.no_grad():
            grad = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
            a = log_a.detach().exp()
            s2 = float(log_noise.detach().exp())
            le = -float(loss) * self.d_y
        if work is not None:
            work.clear_cache()
            gamma = EvidenceOracle(self.likelihood, work, exact=self.exact).gamma(a, s2)
            ls = [float(v) for v in work.lengthscales.detach()]
        else:
            gamma = self.gamma(a, s2)
            ls = None
        return {"a_b": [float(v) for v in a], "l_b": ls, "sigma2": s2, "log_evidence": le,
                "gamma": [float(v) for v in gamma], "iterations": n_eval[0],
                "grad_norm": float(grad.norm()) * self.d_y, "seconds": time.perf_counter() - t0}

    def _neg_and_grad(self, log_a: Tensor, log_noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``−log p`` and its gradient in ``log a_b`` and ``log σ²`` (fast path, closed form):
        ``∂/∂log a_b = −½ a_b (αᵀ G_b α − Tr(K⁻¹ G_b))``, ``∂/∂log σ² = −½ σ² (αᵀα − Tr K⁻¹)``."""
        a, s2 = log_a.exp(), log_noise.exp()
        L = torch.linalg.cholesky(self.kernel(log_a, log_noise))
        alpha = torch.cholesky_solve(self.y_tilde.unsqueeze(1), L).squeeze(1)
        kinv = torch.cholesky_inverse(L)
        value = (0.5 * (self.y_tilde @ alpha) + torch.log(torch.diagonal(L)).sum()
                 + 0.5 * self.d_y * math.log(2 * math.pi))
        quad = (self.grams @ alpha) @ alpha
        tr = (self.grams * kinv).sum((1, 2))  # K⁻¹ and G_b are symmetric
        ga = -0.5 * a * (quad - tr)
        gn = -0.5 * s2 * (alpha @ alpha - kinv.diagonal().sum())
        return value, ga, gn

    def _neg(self, log_a: Tensor, log_noise: Tensor) -> Tensor:
        K = self.kernel(log_a, log_noise)
        L = torch.linalg.cholesky(K)
        w = torch.linalg.solve_triangular(L, self.y_tilde.unsqueeze(1), upper=False)
        return (0.5 * w.square().sum() + torch.log(torch.diagonal(L)).sum()
                + 0.5 * self.d_y * math.log(2 * math.pi))

    def _log_evidence_prior(self, prior, log_noise) -> Tensor:
        # everything from the prior module (differentiable in its parameters)
        K = self.kernel(None, log_noise, prior)
        L = torch.linalg.cholesky(K)
        w = torch.linalg.solve_triangular(L, self.y_tilde.unsqueeze(1), upper=False)
        return (-0.5 * w.square().sum() - torch.log(torch.diagonal(L)).sum()
                - 0.5 * self.d_y * math.log(2 * math.pi))


class DenseSampler:
    """Exact float64 Matheron samples from the dense ``Φ`` of an :class:`EvidenceOracle`.

    ``θ* = Σ Φᵀ K⁻¹ ỹ`` and ``z_j = θ⁰_j − Σ Φᵀ K⁻¹ (Φ θ⁰_j + σ e_j)`` with a
    Cholesky factor of ``K`` (the oracle's block Grams while the prior's
    lengthscales are those the oracle was built with, else ``K`` is rebuilt
    from ``Φ``). The E-step of the exact reference: no solver error, only
    Monte-Carlo error. Returns :class:`~ctuq.posterior.samples.PosteriorSample`
    (``info['method'] = 'dense'``); a warm start reuses its base draws.

    It has the ``sample`` method of the samplers (the other keywords are
    accepted and ignored), so the EM loop takes it like any other sampler;
    tests and benchmarks build it, the library never does. The ``likelihood``
    argument must be the oracle's (only its sizes are checked: the dense
    ``Φ`` and ``ỹ`` are the oracle's).
    """

    method = "dense"
    options = None

    def __init__(self, oracle: "EvidenceOracle"):
        self.oracle = oracle

    def sample(self, likelihood, prior: GaussianPrior, noise_var: float, k: int,
               generator: torch.Generator | None = None, *,
               warm_start: PosteriorSample | None = None, redraw: bool = False,
               **_ignored) -> PosteriorSample:
        if (likelihood.num_params, likelihood.d_obs) != (self.oracle.prior.num_params,
                                                         self.oracle.d_y):
            raise InputError("the dense sampler samples its oracle's likelihood only",
                             field="likelihood")
        t0 = time.perf_counter()
        orc = self.oracle
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        dev, dt = orc.Phi.device, torch.float64
        if warm_start is not None and not redraw and warm_start.k == k \
                and warm_start.state.method == "dense":
            u, e = warm_start.state.base_u, warm_start.state.base_e
        else:
            u = torch.randn(k, prior.num_params, generator=gen, dtype=dt).to(dev)
            e = torch.randn(k, orc.d_y, generator=gen, dtype=dt).to(dev)
        with torch.no_grad():
            K = orc.kernel_for(prior, noise_var)
            L = torch.linalg.cholesky(K)
            theta0 = prior.cov_sqrt(u)
            rhs = torch.cat([orc.y_tilde.unsqueeze(0),
                             theta0 @ orc.Phi.t() + math.sqrt(noise_var) * e])
            X = torch.cholesky_solve(rhs.t(), L).t()
            W = prior.cov(X @ orc.Phi)
        theta_star, z = W[0], theta0 - W[1:]
        info = {"method": "dense", "iterations": 0, "converged": True,
                "residuals": torch.zeros(k + 1), "time": time.perf_counter() - t0, "k": k}
        f32 = torch.float32
        return PosteriorSample(theta_star.to(f32), z.to(f32), theta0.to(f32), info,
                               SamplerState("dense", u, e, X))

