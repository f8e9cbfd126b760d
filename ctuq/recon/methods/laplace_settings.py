"""The settings of the linearised Laplace method (``[uncertainty.laplace]``).

Apart from the method (:mod:`ctuq.recon.methods.laplace`) so that the
evidence options (:mod:`ctuq.recon.evidence`) can default to them without
importing the method that uses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctuq.fields import setting, validate
from ctuq.posterior.prior_kinds import PRIORS

__all__ = ["LaplaceSettings"]


@dataclass(frozen=True)
class LaplaceSettings:
    """Settings of the linearised Laplace method (``[uncertainty.laplace]``; the
    same keys directly in ``[uncertainty]`` are read as these too).

    Parameters
    ----------
    prior : {'matern', 'ard', 'gprior'}
        Block prior (:data:`ctuq.posterior.prior_kinds.PRIORS`): Matérn-½ filter
        covariance per 3×3 block (reference), isotropic per-block ARD, or the
        g-prior. Default ``'gprior'`` (better calibrated in every
        measurement, see ``docs/evidence.md``).
    sampler : {'cg', 'sto'}
        Matheron samples with preconditioned CG in observation space, or
        sample-then-optimise in parameter space. Default ``'cg'``.
    n_samples : int
        Posterior samples per EM step (k). Default 16.
    em_steps : int
        Maximum EM steps. Default 6.
    em_tol : float
        Stop when every log-hyperparameter moves less than this (a relative
        change) for ``em_patience`` consecutive steps. Default 0.02.
    em_patience : int
        Consecutive EM steps below ``em_tol`` before the EM stops. Default 1.
    initial_scale : {'given', 'sketch'}
        The prior scale of the first E-step: the initial prior's (``'given'``:
        the g-prior's ``mean(ỹ²)/d_θ``) or the scale that best explains the
        data's projections on the first Nyström sketch's eigenvectors
        (``'sketch'``, CG only, no extra products;
        :class:`~ctuq.posterior.em.EMOptions`). Default ``'given'``.
    initial_noise : {'given', 'residual'}
        The noise variance of the first E-step when it is learned: the
        given (or estimated) level, or the mean square of the fit's own
        whitened residual (``'residual'``, MacKay's update before any
        parameter counts; :class:`~ctuq.posterior.em.EMOptions`). Default
        ``'given'``.
    em_acceleration : {'none', 'anderson'}
        Run each E-step at the Anderson mixing of the last M-steps' results
        (same fixed point, fewer E-steps; :class:`~ctuq.posterior.em.EMOptions`
        ``acceleration``). A mixed point whose E-step's solves stall is
        rejected and the mixing stops (it had diverged on a 128² scan at I0
        1e5 without that guard; docs/speed.md). Default ``'none'``.
    update : {'mackay', 'em'}
        M-step of the per-block variances. Default ``'mackay'``.
    learn_noise : bool
        Update σ² in the M-step; when False σ² stays at the known noise
        variance. Default False when the noise level is known, else True
        (``None``: decide by that rule).
    predcp : bool
        TV-PredCP hyperprior (the EM then maximises evidence + its
        log-density, a MAP-II). Default False: chosen on the validation
        split, where it narrowed the posterior, lowered the log-likelihood and
        doubled the posterior time without changing the coverage once the
        model error is added (docs/defaults.md).
    predcp_scale : float
        Hyperprior weight ``predcp_scale · d_y · γ_ref`` (reference: 1 at 28²). Default 1.
    predcp_samples : int
        Samples of the reparameterised κ estimator. Default 32.
    cg_tol : float
        Relative residual of the CG solves. Default 1e-3.
    cg_max_iter : int
        CG iteration cap. Default 200.
    cg_refine : int
        Rounds of float64 refinement after each CG solve, at most: the
        residual is recomputed in double precision and the correction solved
        again until every sample's error seen through the data is below a
        tenth of the noise's norm. At low noise the float32 solve alone
        leaves that error at the noise's size or above while it reports
        convergence (docs/dip.md §21). Costs one float64 product per solve,
        and a second solve where it refines; needs the matrix backend of the
        ray transform (skipped with a log note on the ASTRA one). Default 0
        (off); the ``dip-64`` preset: 2.
    cg_refine_stages : {'all', 'predictive'}
        Which solves ``cg_refine`` refines: every one (the EM's and the
        predictive draws'), or the predictive draws only, which make the
        std (on a 64² validation scan at 1 % noise the EM's hyperparameters
        came out the same to four digits either way while the predictive
        draws' error made the posterior std 30 % too wide; docs/dip.md §21).
        Default ``'all'``; the ``dip-64`` preset: ``'predictive'``.
    preconditioner_rank : int
        Rank of the Nyström preconditioner (with ``preconditioner_max_rank``
        the first rank tried). Default 100 (the presets for 64² and larger
        raise it, see :mod:`ctuq.recon.presets`).
    preconditioner_max_rank : int or None
        Adaptive rank: the rank doubles, keeping the products already made,
        up to this while the smallest kept eigenvalue of ``Φ Σ Φᵀ`` exceeds
        ``preconditioner_max_ratio · σ²`` (low noise needs a larger rank for
        CG to converge, high noise a smaller one). Default None: the rank
        stays ``preconditioner_rank``.
    preconditioner_max_ratio : float or None
        That bound on ``λ_r / σ²``. Default 100. None: the rank grows only on
        ``preconditioner_grow_after``.
    preconditioner_grow_after : int or None
        Adaptive rank, on the solves themselves: a CG solve still above
        ``cg_tol`` after this many iterations (or stagnating earlier) continues
        from its best iterate with twice the rank (at most
        ``preconditioner_max_rank``, whose iterations cap is then
        ``cg_max_iter``); the grown preconditioner is kept for the later
        solves. Default None: off.
    sto_batch_size : int or None
        ``sampler = 'sto'``: projection angles per sample-then-optimise step
        (mini-batched; the data term is rescaled so the gradient is
        unbiased, and every step of ``sto_iterations`` runs). Default None:
        all angles (full batch, stopping early at its tolerance).
    sto_iterations : int
        ``sampler = 'sto'``: most steps per solve. Default 1000.
    tv_curvature : float
        ``κ``: the predictive samples (and so the std) come from the posterior
        with the TV term's curvature, ``κ`` times the fit's own TV weight,
        added after the EM (:mod:`ctuq.recon.tv_curvature`): the std shrinks
        where the fit is flat and stays across its edges. Default 0 (off).
    mean : {'dip', 'linear', 'linear-heldout'}
        The reconstruction shown, the centre of the samples: the DIP's
        output ``f(θ̃)`` (the linearisation point), or the posterior mean of
        the linearised model, ``f(θ̃) + J (θ* − θ̃)`` (``θ*`` the mode the EM
        computes at its final hyperparameters: one Gauss–Newton step of the
        data fit under the fitted prior, no extra solve), or ``'linear-heldout'``:
        the DIP output plus that step shortened to the length in ``[0, 1]``
        whose step of the held-out fit best predicts the left-out projections
        (needs ``model_error = 'heldout'``; one more CG solve). Default ``'dip'``.
    """

    prior: str = setting("gprior", kind=str, choices=tuple(PRIORS),
                         doc="Block prior: " + ", ".join(PRIORS) + ".")
    sampler: str = setting("cg", kind=str, choices=("cg", "sto"),
                           doc="Posterior sampler: cg (Matheron) or sto.")
    n_samples: int = setting(16, kind=int, minimum=1, maximum=10_000,
                             doc="Posterior samples per EM step.")
    em_steps: int = setting(6, kind=int, minimum=1, maximum=1000, doc="Maximum EM steps.")
    em_tol: float = setting(0.02, kind=float, minimum=0, maximum=1e6,
                            doc="Stop when every log-hyperparameter moves less.")
    em_patience: int = setting(1, kind=int, minimum=1, maximum=1000,
                               doc="Consecutive EM steps below em_tol before stopping.")
    initial_scale: str = setting("given", kind=str, choices=("given", "sketch"),
                                 doc="Prior scale of the first E-step: the initial prior's, "
                                     "or the evidence of the data on the first sketch.")
    initial_noise: str = setting("given", kind=str, choices=("given", "residual"),
                                 doc="Noise variance of the first E-step (when learned): the "
                                     "given level, or the fit's residual.")
    em_acceleration: str = setting("none", kind=str, choices=("none", "anderson"),
                                   doc="Anderson mixing of the EM's steps (same fixed point).")
    update: str = setting("mackay", kind=str, choices=("mackay", "em"),
                          doc="M-step of the per-block variances.")
    learn_noise: bool | None = setting(None, kind=bool,
                                       doc="Update the noise variance (default: when unknown).")
    predcp: bool = setting(False, kind=bool, doc="TV-PredCP hyperprior (MAP-II).")
    predcp_scale: float = setting(1.0, kind=float, minimum=0, maximum=1e6,
                                  doc="Weight of the TV-PredCP hyperprior.")
    predcp_samples: int = setting(32, kind=int, minimum=1, maximum=10_000,
                                  doc="Samples of the PredCP estimator.")
    cg_tol: float = setting(1e-3, kind=float, minimum=0, maximum=1.0,
                            doc="Relative residual of the CG solves.")
    cg_max_iter: int = setting(200, kind=int, minimum=1, maximum=100_000,
                               doc="CG iteration cap.")
    cg_refine: int = setting(0, kind=int, minimum=0, maximum=100,
                             doc="Rounds of float64 refinement after each CG solve "
                                 "(0: off).")
    cg_refine_stages: str = setting("all", kind=str, choices=("all", "predictive"),
                                    doc="Which solves cg_refine refines: all, or the "
                                        "predictive draws only.")
    preconditioner_rank: int = setting(100, kind=int, minimum=1, maximum=100_000,
                                       doc="Rank of the Nystrom preconditioner.")
    preconditioner_max_rank: int | None = setting(
        None, kind=int, minimum=1, maximum=100_000,
        doc="Adaptive Nystrom rank: double it up to this while lambda_r/sigma^2 is above "
            "preconditioner_max_ratio (default: fixed rank).")
    preconditioner_max_ratio: float | None = setting(100.0, kind=float, minimum=0,
                                                     maximum=1e12, optional=True,
                                                     doc="Bound on lambda_r/sigma^2 of the "
                                                         "adaptive rank (none: off).")
    preconditioner_grow_after: int | None = setting(
        None, kind=int, minimum=1, maximum=100_000,
        doc="Adaptive Nystrom rank: double it when a CG solve is still above cg_tol after "
            "this many iterations (default: off).")
    sto_batch_size: int | None = setting(None, kind=int, minimum=1, maximum=10**7,
                                         doc="sto: projection angles per step (default: all).")
    sto_iterations: int = setting(1000, kind=int, minimum=1, maximum=10**7,
                                  doc="sto: most steps per solve.")
    tv_curvature: float = setting(0.0, kind=float, minimum=0, maximum=1e6,
                                  doc="kappa: the TV term's curvature, kappa times the fit's TV "
                                      "weight, in the posterior of the predictive samples "
                                      "(0: off).")
    mean: str = setting("dip", kind=str, choices=("dip", "linear", "linear-heldout"),
                        doc="Reconstruction shown: the DIP output, the linearised "
                            "model's posterior mean, or the DIP output plus its step at "
                            "the length the held-out projections choose.")

    def __post_init__(self):
        validate(self, prefix="uncertainty.laplace")
