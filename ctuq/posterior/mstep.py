"""E-step statistics, M-step updates and the hyperprior interface (docs/method.md §6–7).

The linearised model has the evidence

    log p(ỹ | Σ, σ²) = −½ ỹᵀ K⁻¹ ỹ − ½ log|K| − (d_y/2) log 2π,   K = Φ Σ Φᵀ + σ² I.

``log|K|`` cannot be estimated from posterior samples, so the
hyperparameters are tuned by fixed-point iterations that only need traces,
which samples do estimate (the loop: :mod:`ctuq.posterior.em`).

Statistics (:func:`estep_statistics`)
    per block ``b`` with ``Σ_b = a_b C_b``: ``‖θ*_b‖²_{C_b⁻¹}``,
    ``S_b = mean_k ‖z_{k,b}‖²_{C_b⁻¹}`` and the effective number of
    parameters ``γ_b = Tr(K⁻¹ Φ_b Σ_b Φ_bᵀ)``, estimated (``estimator``) as

    - ``'matheron'`` (default): ``γ̂_b = mean_k ‖θ⁰_{k,b} − z_{k,b}‖²_{Σ_b⁻¹}``
      with ``θ⁰_k`` the prior draw behind sample ``k``. Because
      ``θ⁰ − z = Σ Φᵀ r`` with ``r = K⁻¹(Φθ⁰ + ε) ~ N(0, K⁻¹)``, this is
      ``rᵀ Φ_b Σ_b Φ_bᵀ r``, unbiased for ``γ_b`` with variance at most
      ``2 γ_b / k`` (the eigenvalues of ``K^{-½} Φ_b Σ_b Φ_bᵀ K^{-½}`` are
      below 1): relative error ``≤ √(2 / (k γ_b))``, whatever ``d_b``.
    - ``'prior'``: ``γ̂_b = d_b − S_b / a_b``; unbiased too, but its variance
      is about ``2 (d_b − γ_b) / k``: useless for blocks with ``γ_b`` of a few
      and ``d_b`` in the thousands (measured: ±8 for ``γ_b ≈ 3``,
      ``d_b = 1152``, ``k = 32``).
    - ``'phi'``: ``mean_k ⟨z_{k,b}, (ΦᵀΦ z_k)_b⟩ / σ²`` (from ``H⁻¹H = I``);
      unbiased, but the cross-block terms make it the noisiest of the three
      on U-nets; kept for comparison.

    The total ``γ̂`` (what the noise update uses): with ``'matheron'`` the sum of the
    block estimates (``Σ_b γ_b = γ``), else ``mean_k ‖Φ z_k‖² / σ²`` (the sampling paper's).
    Both are unbiased for exact samples, but the second divides the solve's error in
    ``Φ z`` by ``σ²``: at low noise a CG solve at tolerance 1e-3 biased it by +19 % and
    made its per-sample spread 3.5× the exact samples' bound, where the Matheron sum
    did not move (a realistic 64² scan at I0 1e5, docs/speed.md).
Closed-form updates
    MacKay :func:`mackay_update` ``a_b ← ‖θ*_b‖²_{C_b⁻¹} / γ̂_b`` or EM
    :func:`em_update` ``a_b ← (‖θ*_b‖²_{C_b⁻¹} + S_b) / d_b``; noise
    :func:`noise_update`, MacKay ``σ² ← ‖ỹ − Φθ*‖² / (d_y − γ)`` or EM
    ``σ² ← (‖ỹ − Φθ*‖² + mean_k ‖Φ z_k‖²) / d_y``.
M-step (:func:`closed_form_mstep`, the loop's default)
    the update of ``a_b``: closed form, or with a :class:`Hyperprior` the
    MAP-II fixed point ``a_b = ‖θ*_b‖² / (γ̂_b − 2 ∂log p/∂log a_b)``
    (:func:`mackay_map2_update`); then, for learned Matérn lengthscales, a
    few Adam steps on ``Q(ψ) + log p(ψ)`` over ``log ℓ`` (:func:`adam_mstep`),
    with ``Q(ψ) = −½ log|Σ| − ½ (‖θ*‖²_{Σ⁻¹} + mean_k ‖z_k‖²_{Σ⁻¹})``
    (:func:`expected_log_prior`); then the noise update.

An M-step is any callable with the signature of :func:`closed_form_mstep`:
it receives the E-step's statistics (``θ*``, ``γ̂``, the samples) held fixed
and the hyperprior, so it may iterate to its own fixed point, asking the
hyperprior for ``log p(ψ)`` and its gradient per block
(:meth:`Hyperprior.gradient`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.posterior.priors import GaussianPrior
from ctuq.progress import check_cancel

__all__ = ["EStepStats", "estep_statistics", "mackay_update", "em_update", "noise_update",
           "expected_log_prior", "Hyperprior", "adam_mstep", "mackay_map2_update",
           "closed_form_mstep", "VARIANCE_NAMES", "VAR_MIN", "VAR_MAX"]

log = logging.getLogger(__name__)

#: Bounds of the block variances and the noise variance (log-space safety net).
VAR_MIN, VAR_MAX = 1e-12, 1e12


@dataclass
class EStepStats:
    """Sample statistics of one E-step (float64, CPU).

    Attributes
    ----------
    theta_quad : Tensor, shape (B,)
        ``‖θ*_b‖²_{C_b⁻¹}``.
    z_quad : Tensor, shape (k, B)
        ``‖z_{k,b}‖²_{C_b⁻¹}`` per sample.
    gamma_samples : Tensor, shape (k, B)
        Per-sample values whose mean is ``γ̂_b``.
    gamma_hat, gamma_hat_se : Tensor, shape (B,)
        ``γ̂_b`` and its Monte-Carlo standard error (NaN for k = 1).
    gamma_total, gamma_total_se : float
        ``γ̂``, the effective number of parameters of the whole prior, and its
        standard error: the sum of the block estimates with ``'matheron'``, else
        ``mean_k ‖Φ z_k‖² / σ²`` (module docstring).
    gamma_total_samples : Tensor, shape (k,)
        The per-sample values whose mean is ``γ̂``.
    residual_sq : float
        ``‖ỹ − Φ θ*‖²``.
    phi_z_sq : float
        ``mean_k ‖Φ z_k‖²`` (EM's noise update); with ``'matheron'`` its expectation
        ``σ² γ̂`` (``Φ Σ_post Φᵀ = σ² (K − σ² I) K⁻¹``), which does not carry the
        solve's error.
    """

    theta_quad: Tensor
    z_quad: Tensor
    gamma_samples: Tensor
    gamma_hat: Tensor
    gamma_hat_se: Tensor
    gamma_total: float
    gamma_total_se: float
    gamma_total_samples: Tensor
    residual_sq: float
    phi_z_sq: float

    @property
    def residual_norm(self) -> float:
        return math.sqrt(self.residual_sq)


def _mean_se(x: Tensor) -> tuple[Tensor, Tensor]:
    k = x.shape[0]
    mean = x.mean(0)
    se = x.std(0) / math.sqrt(k) if k > 1 else torch.full_like(mean, float("nan"))
    return mean, se


def estep_statistics(likelihood, prior: GaussianPrior, noise_var: float, theta_star: Tensor,
                     z: Tensor, estimator: str = "matheron",
                     theta0: Tensor | None = None,
                     data_residual: Tensor | None = None) -> EStepStats:
    """The sufficient statistics of the M-step from the mode ``θ*`` and samples ``z``.

    Parameters
    ----------
    likelihood : Likelihood
        Gives ``Φ`` and the target ``ỹ`` (without a target the
        observation-space statistics are NaN).
    prior : GaussianPrior
    noise_var : float
        ``σ²`` the samples were drawn with.
    theta_star : Tensor, shape (d_θ,)
        The mode: ``θ*`` of the samples' solve, or the likelihood's ``mode``.
    z : Tensor, shape (k, d_θ)
    estimator : {'matheron', 'prior', 'phi'}
        Estimator of ``γ_b`` (module docstring).
    theta0 : Tensor, shape (k, d_θ), optional
        The prior draws behind ``z`` (needed by ``'matheron'``).
    data_residual : Tensor, optional
        ``ỹ − Φθ*`` from the sampler (:class:`~ctuq.posterior.samples.PosteriorSample`);
        computed from ``θ*`` when None.
    """
    if estimator not in ("matheron", "prior", "phi"):
        raise InputError(f"must be 'matheron', 'prior' or 'phi', got {estimator!r}",
                         field="gamma_estimator")
    if estimator == "matheron" and theta0 is None:
        raise InputError("the 'matheron' estimator needs the prior draws theta0",
                         field="theta0")
    k = z.shape[0]
    if k < 1:
        raise InputError("need at least one posterior sample", field="n_samples")
    with torch.no_grad():
        dims = prior.block_dims
        a = prior.variances.detach().double().cpu()
        theta_quad = prior.block_quadratics(theta_star.reshape(1, -1).double())[0].cpu()
        z_quad = prior.block_quadratics(z.double()).cpu()
        residual_sq, phi_z, phi_z_sq = float("nan"), None, torch.full((k,), float("nan"),
                                                                       dtype=torch.float64)
        if likelihood.target is not None:
            resid = data_residual if data_residual is not None else \
                likelihood.target - likelihood.phi(theta_star)
            residual_sq = float(resid.double().square().sum())
        # ‖Φz‖² is read by the 'phi' and 'prior' estimators only (k products per E-step)
        if estimator != "matheron" and (likelihood.target is not None or estimator == "phi"):
            phi_z = likelihood.phi(z)  # [k, *obs_shape]
            phi_z_sq = phi_z.double().square().sum(tuple(range(1, phi_z.ndim))).cpu()  # [k]
        if estimator == "matheron":
            per = prior.block_quadratics((theta0.double() - z.double())).cpu() / a
        elif estimator == "phi":
            g = likelihood.phi_t(phi_z)  # Φᵀ Φ z, [k, d_θ]
            prod = (z.double() * g.double())
            per = torch.stack([prod[:, sl].sum(1) for sl in prior.block_slices.values()],
                              dim=1).cpu() / noise_var
        else:
            per = dims - z_quad / a
    gamma_hat, gamma_se = _mean_se(per)
    # Σ_b γ_b = γ; the Matheron sum does not carry the solve's error divided by σ²
    total = per.sum(1) if estimator == "matheron" else phi_z_sq / noise_var
    tot, tot_se = _mean_se(total)
    phi_z_mean = noise_var * float(tot) if estimator == "matheron" else float(phi_z_sq.mean())
    return EStepStats(theta_quad, z_quad, per, gamma_hat, gamma_se, float(tot), float(tot_se),
                      total, residual_sq, phi_z_mean)


def mackay_update(theta_quad: Tensor, gamma_hat: Tensor, dims: Tensor,
                  gamma_floor: float = 1e-3) -> Tensor:
    """MacKay's fixed point ``a_b ← ‖θ*_b‖²_{C_b⁻¹} / γ̂_b``, ``γ̂_b`` clipped to ``[floor, d_b]``."""
    g = torch.minimum(gamma_hat.clamp_min(gamma_floor), dims)
    return (theta_quad / g).clamp(VAR_MIN, VAR_MAX)


def em_update(theta_quad: Tensor, z_quad_mean: Tensor, dims: Tensor) -> Tensor:
    """EM's M-step ``a_b ← (‖θ*_b‖²_{C_b⁻¹} + mean_k ‖z_{k,b}‖²_{C_b⁻¹}) / d_b``."""
    return ((theta_quad + z_quad_mean) / dims).clamp(VAR_MIN, VAR_MAX)


def noise_update(stats: EStepStats, d_y: int, update: str = "mackay") -> float:
    """``σ² ← ‖ỹ − Φθ*‖² / (d_y − γ)`` (MacKay) or ``(‖ỹ − Φθ*‖² + mean‖Φz‖²) / d_y`` (EM)."""
    if update == "mackay":
        gamma = min(max(stats.gamma_total, 0.0), d_y - 1.0)
        s2 = stats.residual_sq / (d_y - gamma)
    else:
        s2 = (stats.residual_sq + stats.phi_z_sq) / d_y
    return float(min(max(s2, VAR_MIN), VAR_MAX))


def expected_log_prior(prior: GaussianPrior, theta_star: Tensor, z: Tensor) -> Tensor:
    """``Q(ψ) = −½ log|Σ| − ½ (‖θ*‖²_{Σ⁻¹} + mean_k ‖z_k‖²_{Σ⁻¹})`` (0-d, differentiable).

    The prior part of EM's expected complete-data log-likelihood with the
    posterior expectation estimated from the samples (constants dropped).
    """
    t = theta_star.reshape(1, -1).double()
    quad = prior.quadratic(t)[0] + prior.quadratic(z.double()).mean()
    return -0.5 * (prior.logdet() + quad)



class Hyperprior:
    """A prior ``p(ψ)`` on the log-hyperparameters ``ψ_b`` (``log a_b``, ``log ℓ_b``) of a prior.

    The client builds it (CT: :class:`ctuq.recon.predcp.TVPredCP`) and hands
    it to the EM loop. Subclasses implement :meth:`named_parameters`,
    :meth:`prepare` and :meth:`log_prob`; :meth:`gradient` and
    :meth:`report` have defaults.

    Attributes
    ----------
    weight : float
        The hyperprior's scale (reported; 0 means no effect).
    """

    weight: float = 0.0

    def named_parameters(self) -> list[tuple[str, Tensor]]:  # pragma: no cover - abstract
        """The prior's log-hyperparameter tensors ``ψ`` consists of (``'log_a'``,
        ``'log_l'``, ``'log_g'``), each ``[B]`` (``[1]`` for the g-prior)."""
        raise NotImplementedError

    def parameters(self) -> list[Tensor]:
        """The tensors of :meth:`named_parameters` (what an M-step moves)."""
        return [p for _, p in self.named_parameters()]

    def prepare(self):  # pragma: no cover - abstract
        """The expensive part at the current ``ψ`` (e.g. network products); the state
        lets :meth:`log_prob` be evaluated cheaply for ``ψ`` near it."""
        raise NotImplementedError

    def log_prob(self, state) -> Tensor:  # pragma: no cover - abstract
        """``log p(ψ)`` up to a constant, 0-d, differentiable in :meth:`parameters`."""
        raise NotImplementedError

    def gradient(self, state) -> dict:
        """``∂ log p(ψ) / ∂ψ`` per hyperparameter tensor: name → ``[B]`` (detached)."""
        named = self.named_parameters()
        with torch.enable_grad():
            value = self.log_prob(state)
            grads = torch.autograd.grad(value, [p for _, p in named], allow_unused=True)
        return {name: (torch.zeros_like(p) if g is None else g).detach().reshape(-1).cpu()
                for (name, p), g in zip(named, grads)}

    def report(self, state) -> dict:
        """JSON-able entries for the EM trace (e.g. the estimated complexities)."""
        return {}


def adam_mstep(prior: GaussianPrior, theta_star: Tensor, z: Tensor, params: list[Tensor],
               hyperprior: Hyperprior | None, steps: int, lr: float,
               cancel=None) -> dict:
    """A few Adam steps on ``Q(ψ) + log p(ψ)`` over ``params`` (in place).

    The hyperprior's expensive part (:meth:`Hyperprior.prepare`) is computed
    once, at the M-step's starting point.

    Returns
    -------
    dict
        Empty without a hyperprior; else its :meth:`~Hyperprior.report` and
        ``log_hyperprior`` (its value at the last step).
    """
    state = hyperprior.prepare() if hyperprior is not None else None
    check_cancel(cancel, "hyperparameter fit")
    for p in prior.parameters():
        # a hyperprior's log-Jacobian differentiates κ in every ψ, also those held fixed
        p.requires_grad_(hyperprior is not None or any(p is q for q in params))
    opt = torch.optim.Adam(params, lr=lr)
    log_hp = None
    try:
        for _ in range(steps):
            check_cancel(cancel, "hyperparameter fit")
            opt.zero_grad(set_to_none=True)
            with torch.enable_grad():
                obj = expected_log_prior(prior, theta_star, z)
                if hyperprior is not None:
                    log_hp = hyperprior.log_prob(state)
                    obj = obj + log_hp
                (-obj).backward()
            opt.step()
            with torch.no_grad():
                for p in params:
                    p.clamp_(math.log(VAR_MIN), math.log(VAR_MAX))
    finally:
        for p in prior.parameters():
            p.requires_grad_(True)
        prior.clear_cache()
    if log_hp is None:
        return {}
    return {**hyperprior.report(state), "log_hyperprior": float(log_hp.detach())}


#: Names of the hyperprior's variance tensors (``log a_b`` of the block priors,
#: ``log g`` of the g-prior); everything else (``log ℓ_b``) is a lengthscale.
VARIANCE_NAMES = ("log_a", "log_g")


def mackay_map2_update(prior: GaussianPrior, stats: EStepStats, hyperprior: Hyperprior, *,
                       iterations: int = 50, tol: float = 1e-4, max_step: float = 1.0,
                       gamma_floor: float = 1e-3, cancel=None) -> dict:
    """MacKay's update with a hyperprior: the MAP-II fixed point of the variances (in place).

    The evidence's gradient in ``log a_b`` is ``½ (‖θ*_b‖²_{C_b⁻¹} / a_b −
    γ_b)`` (zero at MacKay's fixed point ``a_b = ‖θ*_b‖² / γ_b``). With the
    hyperprior's gradient ``h_b = ∂ log p(ψ) / ∂ log a_b`` the stationarity
    condition of evidence + ``log p(ψ)`` becomes

        a_b = ‖θ*_b‖²_{C_b⁻¹} / (γ_b − 2 h_b(a)),

    which is iterated with ``‖θ*_b‖²`` and ``γ̂_b`` held from the E-step and
    ``h_b`` re-evaluated at every iterate (cheaply: the hyperprior's
    expensive part is prepared once, at the E-step's ``ψ``). Each iterate
    moves ``log a_b`` by at most ``max_step``; a denominator at or below
    ``gamma_floor`` (the hyperprior pushes ``a_b`` up faster than the
    evidence pulls it back) takes the full ``max_step`` up. Alternated with
    E-steps, the fixed point is a stationary point of ``log p(y | ψ) + log
    p(ψ)`` (docs/method.md §6): a true MAP-II, unlike Adam steps on EM's
    auxiliary objective, which pull ``a`` back towards the previous E-step.

    Parameters
    ----------
    prior : GaussianPrior
        Its variances are updated in place.
    stats : EStepStats
    hyperprior : Hyperprior
        Must name a variance tensor (:data:`VARIANCE_NAMES`) among its parameters.
    iterations, tol, max_step, gamma_floor : optional
        Inner iterations (default 50), stop when no ``log a_b`` moves more
        than ``tol`` (1e-4), the largest move per iterate (1 in log space),
        the smallest denominator (1e-3).
    cancel : callable, optional

    Returns
    -------
    dict
        ``mstep_iterations`` and the hyperprior's report at the E-step's ``ψ``.
    """
    names = [n for n, _ in hyperprior.named_parameters() if n in VARIANCE_NAMES]
    if len(names) != 1:
        raise InputError("the hyperprior names no variance parameter "
                         f"({', '.join(VARIANCE_NAMES)})", field="hyperprior")
    state = hyperprior.prepare()
    q = stats.theta_quad.double().cpu()
    gam = torch.minimum(stats.gamma_hat.double().cpu().clamp_min(gamma_floor),
                        prior.block_dims.double().cpu())
    lo, hi = math.log(VAR_MIN), math.log(VAR_MAX)
    it = 0
    for it in range(1, iterations + 1):
        check_cancel(cancel, "hyperparameter fit")
        h = hyperprior.gradient(state)[names[0]].double()
        log_a = prior.variances.detach().double().cpu().log()
        denom = gam - 2 * h
        target = torch.where(denom > gamma_floor, q.clamp_min(VAR_MIN).log()
                             - denom.clamp_min(gamma_floor).log(), log_a + max_step)
        step = (target - log_a).clamp(-max_step, max_step)
        prior.set_hyperparameters(variances=(log_a + step).clamp(lo, hi).exp())
        prior.clear_cache()
        if float(step.abs().max()) < tol:
            break
    return {**hyperprior.report(state), "mstep_iterations": it,
            "log_hyperprior": float(hyperprior.log_prob(state).detach())}


def closed_form_mstep(prior: GaussianPrior, stats: EStepStats, theta_star: Tensor, z: Tensor,
                      noise_var: float, *, update: str, learn_noise: bool, d_y: int,
                      params: list[Tensor], hyperprior: Hyperprior | None, steps: int,
                      lr: float, cancel=None) -> tuple[float, dict]:
    """The M-step: the variances, then lengthscales by Adam, then ``σ²``.

    Variances: with ``update='mackay'``, MacKay's update, or with a
    hyperprior its MAP-II fixed point (:func:`mackay_map2_update`); with
    ``update='em'`` EM's closed form, followed with a hyperprior by Adam
    steps on ``Q + log p(ψ)`` over every log-hyperparameter (EM with a
    prior: its fixed points are MAP-II too, reached slowly when ``γ_b ≪
    d_b``). Lengthscales (``log_l`` in ``params``): Adam steps on ``Q`` (+
    ``log p(ψ)``) over them alone, started at the current values; at a
    joint fixed point ``∂Q/∂ log ℓ`` is the evidence's gradient, so the
    lengthscales are stationary for evidence + hyperprior as well.

    Parameters
    ----------
    prior : GaussianPrior
        Updated in place.
    stats : EStepStats
        The E-step's statistics (held fixed).
    theta_star, z : Tensor
        The E-step's mode and samples (for ``Q``).
    noise_var : float
        The current ``σ²``.
    update : {'mackay', 'em'}
    learn_noise : bool
    d_y : int
        Observations, for the noise update.
    params : list of Tensor
        The log-hyperparameter tensors of the Adam steps (none: no Adam steps).
    hyperprior : Hyperprior or None
    steps, lr : int, float
        Adam steps and learning rate (log space).
    cancel : callable, optional

    Returns
    -------
    (float, dict)
        The new ``σ²`` and the Adam step's report (trace entries).
    """
    dims = prior.block_dims
    extra = {}
    if update == "mackay" and hyperprior is not None:
        extra = mackay_map2_update(prior, stats, hyperprior, cancel=cancel)
        variances = {id(p) for n, p in hyperprior.named_parameters() if n in VARIANCE_NAMES}
        params = [p for p in params if id(p) not in variances]
    else:
        if update == "mackay":
            a_new = mackay_update(stats.theta_quad, stats.gamma_hat, dims)
        else:
            a_new = em_update(stats.theta_quad, stats.z_quad.mean(0), dims)
        prior.set_hyperparameters(variances=a_new)
        prior.clear_cache()
    if params and steps > 0:
        extra.update(adam_mstep(prior, theta_star.detach(), z.detach(), params, hyperprior,
                                steps, lr, cancel))
    if learn_noise:
        noise_var = noise_update(stats, d_y, update)
    return noise_var, extra
