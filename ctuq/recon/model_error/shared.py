"""The DIP fit on all angles, sharing work with the held-out fit when asked.

With ``[uncertainty] dip_from_heldout = f > 0`` and the held-out model-error
term, the held-out fit (on the kept angles, from the seeded initialisation)
runs first, and the fit on all angles continues from its weights for ``f``
times the DIP iterations, with a fresh optimiser, on the last ``f`` of the
fit's own learning-rate schedule (:func:`continued_config`). The held-out
residual stays honest: the fit that predicts the held-out rows has never
seen them. Otherwise the fit on all angles is the
usual one from the seeded initialisation. With ``dip.net_input = 'auto'`` the
held-out term fits once per candidate input first and the fit on all angles takes
the input whose held-out fit predicted the left-out rows best (docs/dip.md §15).
With two separate fits and a known noise level, the held-out fit runs beside
the fit on all angles where the CPU has two threads or more
(``ModelErrorTerm.beside_fit``; docs/speed.md).
"""

from __future__ import annotations

__all__ = ["dip_fit", "continued_config"]


def dip_fit(problem, term=None, *, progress=None, cancel=None):
    """The DIP fit on all angles of ``problem`` (a :class:`~ctuq.recon.dip.DIPResult`).

    Parameters
    ----------
    problem : ReconstructionProblem
        ``y``, ``op``, ``dip`` (settings), ``noise``, ``uncertainty``.
    term : ModelErrorTerm, optional
        The run's model-error term; only a term that makes a fit first
        (``makes_fit_first``, the held-out one:
        :meth:`~ctuq.recon.model_error.terms.ModelErrorTerm.fit_first`) shares
        it, and only when ``dip_from_heldout > 0`` or ``dip.net_input = 'auto'``;
        otherwise a term's fit that can run beside this one does
        (:meth:`~ctuq.recon.model_error.terms.ModelErrorTerm.beside_fit`).
    progress, cancel : callable, optional
    """
    import torch

    from ctuq.recon.dip import AUTO, fit_dip
    from ctuq.recon.provenance import keeping_threads, side_by_side

    share = float(problem.uncertainty.dip_from_heldout)
    auto = problem.dip.net_input == AUTO  # the held-out fits choose the input
    held = (term.fit_first(problem, progress=progress, cancel=cancel)
            if (share > 0 or auto) and term is not None and term.makes_fit_first else None)
    config, init_state = problem.dip, None
    if held is not None:
        config = config.with_(net_input=held.config.net_input)  # as 'auto' chose
        if share > 0:  # continued from the held-out fit; else a fit of its own
            config, init_state = continued_config(config, share), held.state_dict

    def fit(report=progress):
        return fit_dip(problem.y, problem.op, config, noise_std=problem.noise.std,
                       ray_variance=problem.noise.ray_variance, progress=report,
                       cancel=cancel, init_state=init_state)

    beside = term.beside_fit(problem, cancel=cancel) \
        if held is None and term is not None else None
    if beside is None:
        return fit()
    # two separate fits: the held-out one on a thread of its own (its result kept by the term)
    return side_by_side([lambda: fit(keeping_threads(progress)), beside],
                        torch.get_num_threads())[0]


def continued_config(dip_config, share: float):
    """The DIP settings of a fit continued from the held-out fit's weights.

    ``share`` of the iterations, on the last ``share`` of the full fit's
    learning-rate schedule: the rate starts where a full fit would be that
    many steps before its end and decays to the same floor. A restart at the
    peak rate undoes the held-out fit's settling (PSNR down by up to 2.4 dB
    on a validation scan, docs/speed.md); warm-up steps are dropped (the
    weights are already trained).

    Parameters
    ----------
    dip_config : DIPConfig
        The run's DIP settings.
    share : float
        In (0, 1]: the fraction of ``dip_config.iterations`` to run.

    Returns
    -------
    DIPConfig
    """
    from ctuq.recon.dip import lr_factor

    n = int(dip_config.iterations)
    m = max(1, round(n * float(share)))
    start = lr_factor(dip_config)(max(n - m, int(dip_config.warmup)))
    floor = float(dip_config.lr_min_factor)
    return dip_config.with_(iterations=m, warmup=0, lr=float(dip_config.lr) * start,
                            lr_min_factor=min(1.0, floor / start) if start > 0 else 1.0)
