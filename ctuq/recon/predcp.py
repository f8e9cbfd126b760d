"""TV-PredCP: total variation as a hyperprior on the prior hyperparameters (docs/method.md §7).

TV of the image is not a Gaussian prior, so it enters the linearised model as
a *predictive complexity prior* on the hyperparameters ``ψ_b`` of each prior
block ``b`` (``log a_b`` and, for blocks with a Matérn filter covariance,
``log ℓ_b``)::

    κ_b(ψ_b) = E_{w ~ N(0, Σ_b(ψ_b))} [ TV(x̂ + J_b w) ]
    log p(ψ) = Σ_b [ −λ κ_b(ψ_b) + Σ_{i ∈ ψ_b} log |∂κ_b / ∂ψ_{b,i}| ] + const

with ``x̂`` the DIP reconstruction, ``J_b`` the Jacobian columns of block
``b`` and ``λ`` the scale (below): each ``κ_b`` is exponentially distributed
with rate ``λ``, and the Jacobian turns that into a density of ``ψ_b``. (The
reference code multiplies the Jacobian term by ``λ`` too; with ``λ ≠ 1`` that
is not the density of any prior on ``κ``, so ctuq does not.) The EM uses the
hyperprior as a true MAP-II (:func:`ctuq.posterior.mstep.mackay_map2_update`):
the hyperparameters maximise evidence + ``log p(ψ)``, not the EM's auxiliary
objective.

The estimator (reference choice)
--------------------------------
Draw ``w_n = L_b(ψ) u_n`` with ``u_n ~ N(0, I)`` fixed (common random numbers)
and ``L_b`` the block's Cholesky factor, compute ``x_n = x̂ + J_b w_n`` (one
batched JVP), ``g_n = ∇TV(x_n)`` (autograd of
:func:`ctuq.recon.dip.total_variation`, detached) and ``v_n = J_bᵀ g_n`` (one
batched VJP, detached). Then

    κ̃_b(ψ) = mean_n ⟨L_b(ψ) u_n, v_n⟩

is a cheap function of ``ψ`` whose autograd gradient at the current ``ψ`` is
the reparameterisation gradient of ``E[TV]``, because ``g_n`` is the (a.e.)
gradient of TV at ``x_n``. ``∂κ_b/∂ψ_b`` is taken with ``create_graph=True``
so that ``log|∂κ_b/∂ψ_b|`` can be back-propagated a second time (double
back-propagation). The *value* of ``κ̃`` is ``E[TV(x_n)] − E⟨x̂, g_n⟩``
(TV is positively 1-homogeneous), not ``κ`` itself; the real ``κ_b =
mean_n TV(x_n)`` is reported alongside.

Notes
-----
- ``κ_b`` is a scalar function of a 1- or 2-vector ``ψ_b``, so
  ``|∂κ_b/∂ψ_b|`` is not a square Jacobian: like the reference code we use
  the product of the per-hyperparameter derivatives ("diagonal" form). For a
  block with only ``a_b`` (1×1 convs, ``'ard'``, the g-prior) this is the
  exact change of variables of ``κ_b ~ Exp(λ)``; note ``∂κ̃_b/∂log a_b =
  κ̃_b / 2`` since ``L_b ∝ √a_b``.
- The second derivative misses the distributional part of TV's Hessian (the
  kinks of ``|·|``): with ``g_n`` detached, ``∂²κ̃/∂ψ²`` is the derivative
  of the pathwise estimator, a biased estimate of ``∂²κ/∂ψ²`` when
  ``x̂ ≠ 0``. This is the reference behaviour; the first derivative
  (what the tests check against finite differences) is unbiased.
- Scale: the reference objective is ``mean‖Af − y‖² + γ_ref TV(f)`` and its
  hyperprior weight ``predcp_scale · d_y · γ_ref``. Our DIP uses the
  sum-of-squares data fit, ``‖Af − y‖² + γ TV(f)`` with ``γ = d_y γ_ref``
  (see :mod:`ctuq.recon.dip`), so the same weight is
  ``λ = predcp_scale · γ`` (:func:`predcp_weight`). (A "Bayesian" reading
  of the DIP objective as ``exp(−(‖Af−y‖² + γ TV)/(2σ²))`` would give
  ``γ/(2σ²)``; we keep the reference's weight.)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.posterior import BlockPrior, GaussianPrior, GPrior, Hyperprior, Linearization
from ctuq.recon.baselines import total_variation

__all__ = ["tv_gradient", "predcp_weight", "hyperparameter_tensors", "PredCPOptions",
           "PredCPTerms", "PredCPState", "TVPredCP"]

log = logging.getLogger(__name__)


def tv_gradient(x: Tensor) -> Tensor:
    """A subgradient of :func:`~ctuq.recon.baselines.total_variation` per image, ``[..., H, W]``.

    Autograd of the project's one TV function (``sign`` of the finite
    differences, 0 at ties), detached.
    """
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(total_variation(xr).sum(), xr)
    return g


def predcp_weight(predcp_scale: float, tv_weight: float) -> float:
    """``λ = predcp_scale · γ`` for the DIP's sum-of-squares TV weight ``γ``.

    Equal to the reference's ``predcp_scale · d_y · γ_ref`` (module notes).
    """
    return float(predcp_scale) * float(tv_weight)


def hyperparameter_tensors(prior: GaussianPrior) -> list[tuple[str, Tensor, list[bool]]]:
    """The log-hyperparameters a block's ``ψ_b`` consists of.

    Returns
    -------
    list of (name, parameter, mask)
        ``mask[b]`` says whether block ``b`` depends on that parameter
        (``log_l`` only matters for Matérn blocks).
    """
    if isinstance(prior, BlockPrior):
        out = [("log_a", prior.log_a, [True] * prior.num_blocks)]
        if prior.learns_lengthscale:
            out.append(("log_l", prior.log_l, list(prior.lengthscale_blocks)))
        return out
    if isinstance(prior, GPrior):
        return [("log_g", prior.log_g, [True])]
    raise InputError(f"TV-PredCP does not know the prior {type(prior).__name__}", field="prior")


@dataclass(frozen=True)
class PredCPOptions:
    """Settings of TV-PredCP in the EM (:func:`ctuq.recon.evidence.fit_posterior`).

    Parameters
    ----------
    scale : float
        ``predcp_scale``: ``λ = scale · γ`` (:func:`predcp_weight`; reference 1
        at 28², 50 at 501²); 0 disables the hyperprior. Default 1.
    samples : int
        Reparameterised draws per block for ``κ_b``. Default 32.
    """

    scale: float = 1.0
    samples: int = 32

    def __post_init__(self):
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale)
                and self.scale >= 0):
            raise InputError(f"must be a number >= 0, got {self.scale!r}", field="predcp_scale")
        if not isinstance(self.samples, int) or isinstance(self.samples, bool) \
                or self.samples < 1:
            raise InputError(f"must be an integer >= 1, got {self.samples!r}",
                             field="predcp_samples")


@dataclass
class PredCPTerms:
    """One evaluation of the hyperprior.

    Attributes
    ----------
    log_prior : Tensor
        ``Σ_b (−λ κ̃_b + log|∂κ̃_b/∂ψ_b|)``, 0-d, differentiable in the prior's
        log-hyperparameters with the correct (reparameterised) gradient; its
        value is offset from ``log p(ψ)`` (see the module notes and
        :meth:`TVPredCP.log_density`).
    kappa : Tensor
        ``κ_b = mean_n TV(x̂ + J_b w_n)`` per block, ``[B]`` (detached).
    kappa_se : Tensor
        Its Monte-Carlo standard error per block, ``[B]``.
    dkappa : dict of str to Tensor
        ``∂κ_b/∂ψ`` per hyperparameter tensor (``'log_a'``, ``'log_l'``,
        ``'log_g'``), ``[B]`` each (detached).
    log_jacobian : Tensor
        ``Σ_b Σ_i log|∂κ_b/∂ψ_{b,i}|`` (detached).
    """

    log_prior: Tensor
    kappa: Tensor
    kappa_se: Tensor
    dkappa: dict
    log_jacobian: Tensor


@dataclass
class PredCPState:
    """The network-product part of one hyperprior evaluation (see :meth:`TVPredCP.prepare`).

    Attributes
    ----------
    vs : dict of str to Tensor
        ``J_bᵀ ∇TV(x_n)`` restricted to block ``b``, ``[N, d_b]`` float64.
    kappa, kappa_se : Tensor, shape (B,)
        ``κ_b`` and its standard error (NaN for blocks without the hyperprior).
    """

    vs: dict
    kappa: Tensor
    kappa_se: Tensor


class TVPredCP(Hyperprior):
    """The reparameterised TV-PredCP estimator for every prior block.

    The engine's :class:`~ctuq.posterior.mstep.Hyperprior`: ``log_prob(state)``
    is :attr:`PredCPTerms.log_prior` and the trace reports ``kappa``,
    ``kappa_se``.

    Parameters
    ----------
    lin : Linearization
        Gives ``J`` and ``x̂ = lin.x_hat``.
    prior : GaussianPrior
        :class:`~ctuq.posterior.priors.BlockPrior` or :class:`~ctuq.posterior.priors.GPrior`;
        read at every call (so it can be optimised in place).
    weight : float
        ``λ`` (see :func:`predcp_weight`).
    n_samples : int, optional
        ``N`` reparameterised draws per block. Default 32 (reference 500 at
        28², 20 at 501²).
    generator : torch.Generator, optional
        CPU generator of the standard normals ``u_n`` (drawn once; common
        random numbers across calls). Default seeded with 0.
    x_hat : Tensor, optional
        The image TV is taken around. Default ``lin.x_hat``.
    blocks : sequence of str, optional
        Blocks that get the hyperprior. Default all.
    lengthscales : bool, optional
        Whether ``log ℓ_b`` is part of ``ψ_b`` (its Jacobian factor is
        included) for Matérn blocks. Default True.
    """

    def __init__(self, lin: Linearization, prior: GaussianPrior, weight: float,
                 n_samples: int = 32, generator: torch.Generator | None = None, *,
                 x_hat: Tensor | None = None, blocks=None, lengthscales: bool = True):
        if n_samples < 1:
            raise InputError(f"must be >= 1, got {n_samples}", field="predcp_samples")
        self.lin, self.prior = lin, prior
        self.weight = float(weight)
        self.n_samples = int(n_samples)
        self.x_hat = (lin.x_hat if x_hat is None else x_hat).detach()
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        self.u = torch.randn(self.n_samples, lin.num_params, generator=gen,
                             dtype=torch.float64).to(lin.device)
        names = list(prior.block_names)
        self.blocks = names if blocks is None else [b for b in names if b in set(blocks)]
        self.hyper = [h for h in hyperparameter_tensors(prior)
                      if lengthscales or h[0] != "log_l"]

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """``(name, tensor)`` of the log-hyperparameters ``ψ`` consists of."""
        return [(name, p) for name, p, _ in self.hyper]

    def log_prob(self, state: "PredCPState") -> Tensor:
        """``log p(ψ)`` (offset, see the module notes), differentiable in ``ψ``."""
        return self.terms(state).log_prior

    def report(self, state: "PredCPState") -> dict:
        return {"kappa": [float(v) for v in state.kappa],
                "kappa_se": [float(v) for v in state.kappa_se]}

    def prepare(self) -> "PredCPState":
        """The JVP/VJP pass at the current hyperparameters (``N`` of each per block).

        Returns ``v_{b,n} = J_bᵀ ∇TV(x̂ + J_b L_b u_n)`` (restricted to block
        ``b``) and the plain Monte-Carlo ``κ_b``; :meth:`terms` then evaluates
        the hyperprior for any ``ψ`` near the current one without network
        products (the M-step refreshes this once per EM step).
        """
        lin, prior = self.lin, self.prior
        with torch.no_grad():
            lu = prior.cov_sqrt(self.u.to(lin.dtype))  # [N, d], block-diagonal L
        vs, kap, kap_se = {}, [], []
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        for name, sl in prior.block_slices.items():
            if name not in self.blocks:
                kap.append(nan)
                kap_se.append(nan)
                continue
            with torch.no_grad():
                w = torch.zeros_like(lu)
                w[:, sl] = lu[:, sl]
                x = self.x_hat + lin.jvp(w)  # [N, H, W]
                tv = total_variation(x).double()
            g = tv_gradient(x)
            with torch.no_grad():
                vs[name] = lin.vjp(g)[:, sl].double()
            kap.append(tv.mean().cpu())
            kap_se.append((tv.std() / self.n_samples ** 0.5).cpu() if self.n_samples > 1
                          else nan)
        return PredCPState(vs, torch.stack(kap), torch.stack(kap_se))

    def kappa_tilde(self, state: "PredCPState", per_sample: bool = False) -> Tensor:
        """``κ̃_b(ψ) = mean_n ⟨L_b(ψ) u_n, v_{b,n}⟩``, ``[B]`` (``[N, B]`` per sample),
        differentiable in ψ."""
        lu = self.prior.cov_sqrt(self.u)  # float64, graph to the hyperparameters
        out = []
        for name, sl in self.prior.block_slices.items():
            if name in state.vs:
                out.append((lu[:, sl] * state.vs[name]).sum(1))
            else:
                out.append(lu.new_zeros(lu.shape[0]))
        per = torch.stack(out, dim=1)
        return per if per_sample else per.mean(0)

    def terms(self, state: "PredCPState | None" = None) -> PredCPTerms:
        """The hyperprior at the current ψ, by double back-propagation through ``κ̃``."""
        state = self.prepare() if state is None else state
        with torch.enable_grad():
            kt = self.kappa_tilde(state)
            params = [p for _, p, _ in self.hyper]
            grads = torch.autograd.grad(kt.sum(), params, create_graph=True, allow_unused=True)
            logjac = kt.new_zeros(())
            dk = {}
            active = torch.tensor([b in self.blocks for b in self.prior.block_names])
            for (name, p, mask), g in zip(self.hyper, grads):
                if g is None:
                    continue
                g = g.reshape(-1)
                dk[name] = g.detach().cpu()
                m = torch.tensor(mask) & active[: g.numel()]
                if bool(m.any()):
                    logjac = logjac + torch.log(g[m.to(g.device)].abs().clamp_min(1e-300)).sum()
            # κ_b ~ Exp(λ) per block, changed to the variables ψ: the Jacobian is not
            # scaled by λ (the reference code scales both terms by λ, i.e. uses p(ψ)^λ
            # with an unnormalised Jacobian; docs/method.md §7)
            log_prior = logjac - self.weight * kt.sum()
        return PredCPTerms(log_prior, state.kappa, state.kappa_se, dk, logjac.detach())

    def log_density(self, state: "PredCPState") -> float:
        """``log p(ψ)`` up to ``B log λ``: ``Σ_b (−λ κ_b + log|∂κ_b/∂ψ_b|)`` with the
        plain Monte-Carlo ``κ_b`` (the value :meth:`log_prob` is offset from)."""
        terms = self.terms(state)
        kappa = state.kappa[torch.isfinite(state.kappa)]
        return float(terms.log_jacobian) - self.weight * float(kappa.sum())

    def evaluate(self) -> PredCPTerms:
        """:meth:`prepare` and :meth:`terms` at the current hyperparameters."""
        return self.terms(self.prepare())

    def dkappa_samples(self, state: "PredCPState") -> dict:
        """Per-draw derivatives ``∂⟨L_b(ψ) u_n, v_{b,n}⟩/∂ψ`` (name → ``[N, B]``).

        Their mean is ``∂κ̃_b/∂ψ`` and their spread gives its Monte-Carlo
        standard error (used by the tests).
        """
        out = {}
        with torch.enable_grad():
            per = self.kappa_tilde(state, per_sample=True)  # [N, B]
            params = [p for _, p, _ in self.hyper]
            rows = {name: [] for name, _, _ in self.hyper}
            for n in range(per.shape[0]):
                grads = torch.autograd.grad(per[n].sum(), params, retain_graph=True,
                                            allow_unused=True)
                for (name, p, _), g in zip(self.hyper, grads):
                    rows[name].append(torch.zeros(p.numel(), dtype=torch.float64)
                                      if g is None else g.detach().reshape(-1).cpu())
        for name, r in rows.items():
            out[name] = torch.stack(r)
        return out

    def kappa_samples(self, u: Tensor | None = None, blocks=None) -> Tensor:
        """Per-draw ``TV(x̂ + J_b L_b u_n)``, ``[B, N]`` (no gradient; NaN for skipped blocks).

        For checks: the mean over ``n`` is the plain Monte-Carlo ``κ_b``.

        Parameters
        ----------
        u : Tensor, shape (N, d_θ), optional
            Standard normals (default: this estimator's).
        blocks : sequence of str or int, optional
            Only these blocks (default all).
        """
        u = self.u if u is None else u.to(self.lin.device, torch.float64)
        names = self.prior.block_names
        want = set(range(len(names))) if blocks is None else {
            names.index(b) if isinstance(b, str) else int(b) for b in blocks}
        with torch.no_grad():
            lu = self.prior.cov_sqrt(u.to(self.lin.dtype))
            rows = []
            for i, sl in enumerate(self.prior.block_slices.values()):
                if i not in want:
                    rows.append(torch.full((u.shape[0],), float("nan"), dtype=torch.float64,
                                           device=lu.device))
                    continue
                w = torch.zeros_like(lu)
                w[:, sl] = lu[:, sl]
                rows.append(total_variation(self.x_hat + self.lin.jvp(w)).double())
            return torch.stack(rows)
