"""The DIP fit on all angles, sharing work with the held-out fit when asked.

With ``[uncertainty] dip_from_heldout = f > 0`` and the held-out model-error
term, the held-out fit (on the kept angles, from the seeded initialisation)
runs first, and the fit on all angles continues from its weights for ``f``
times the DIP iterations, with a fresh optimiser and learning-rate
schedule. The held-out residual stays honest: the fit that predicts the
held-out rows has never seen them. Otherwise the fit on all angles is the
usual one from the seeded initialisation.
"""

from __future__ import annotations

__all__ = ["dip_fit"]


def dip_fit(problem, term=None, *, progress=None, cancel=None):
    """The DIP fit on all angles of ``problem`` (a :class:`~ctuq.recon.dip.DIPResult`).

    Parameters
    ----------
    problem : ReconstructionProblem
        ``y``, ``op``, ``dip`` (settings), ``noise``, ``uncertainty``.
    term : ModelErrorTerm, optional
        The run's model-error term; only a term with ``fit_first`` (the
        held-out one) shares its fit, and only when ``dip_from_heldout > 0``.
    progress, cancel : callable, optional
    """
    from ctuq.recon.dip import fit_dip

    share = float(problem.uncertainty.dip_from_heldout)
    first = getattr(term, "fit_first", None)
    if share <= 0 or first is None:
        return fit_dip(problem.y, problem.op, problem.dip, noise_std=problem.noise.std,
                       ray_variance=problem.noise.ray_variance, progress=progress,
                       cancel=cancel)
    held = first(problem, progress=progress, cancel=cancel)
    config = problem.dip.with_(iterations=max(1, round(int(problem.dip.iterations) * share)))
    return fit_dip(problem.y, problem.op, config, noise_std=problem.noise.std,
                   ray_variance=problem.noise.ray_variance, progress=progress, cancel=cancel,
                   init_state=held.state_dict)
