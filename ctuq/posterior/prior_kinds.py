"""The kinds of Gaussian prior by name (:data:`PRIORS`): how each is built and what it has.

Settings name a prior kind (``[uncertainty.laplace] prior``, a classifier
benchmark's ``prior``); clients ask the kind for its properties
(:attr:`PriorKind.has_lengthscale`, :attr:`PriorKind.uses_likelihood`) and a
built prior for its own (:attr:`~ctuq.posterior.priors.GaussianPrior.lengthscale_blocks`)
instead of comparing names. A new prior is its class
(:mod:`ctuq.posterior.priors`) and one line in :data:`PRIORS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ctuq.errors import InputError
from ctuq.posterior.linearize import Linearization
from ctuq.posterior.priors import BlockPrior, GaussianPrior, GPrior

__all__ = ["PriorKind", "PRIORS", "PRIOR_KINDS", "prior_kind", "build_prior"]


def _blocks_of(source):
    """The block layout of a likelihood (its ``lin``) or of a linearisation itself."""
    return source if isinstance(source, Linearization) else getattr(source, "lin", source)


@dataclass(frozen=True)
class PriorKind:
    """One kind of prior in :data:`PRIORS`: how to build it and what it has.

    Attributes
    ----------
    name : str
        The name in settings (``[uncertainty.laplace] prior``).
    build : callable
        ``build(source, variance, lengthscale, *, generator=None, **options)``
        → :class:`GaussianPrior`; ``source`` is the likelihood (or, for a
        kind that does not use it, a linearisation).
    has_lengthscale : bool
        Its covariance has lengthscales ``ℓ_b`` that an M-step or a
        hyperprior may learn (:attr:`GaussianPrior.lengthscale_blocks`).
    uses_likelihood : bool
        Built from the likelihood's ``Φ`` (not only the block layout); its
        initial variance is then put on the data's scale by clients.
    classifier : bool
        Offered for classifiers (:mod:`ctuq.classify`).
    doc : str
    """

    name: str
    build: Callable
    has_lengthscale: bool = False
    uses_likelihood: bool = False
    classifier: bool = True
    doc: str = ""


def _build_block(kind: str):
    def build(source, variance=1.0, lengthscale=0.1, *, generator=None, **options):
        return BlockPrior(_blocks_of(source), kind=kind, variance=variance,
                          lengthscale=lengthscale)
    return build


def _build_gprior(source, variance=1.0, lengthscale=None, *, generator=None, **options):
    return GPrior.from_likelihood(source, g=variance, generator=generator, **options)


#: The kinds of prior by name. A new prior: its class in this module and one line here.
PRIORS: dict[str, PriorKind] = {k.name: k for k in (
    PriorKind("matern", _build_block("matern"), has_lengthscale=True, classifier=False,
              doc="Matérn-½ filter covariance per block (reference)."),
    PriorKind("ard", _build_block("iso"), doc="Isotropic per-block ARD."),
    PriorKind("gprior", _build_gprior, uses_likelihood=True,
              doc="g-prior: one variance on Φ's column scales."),
)}
#: Their names.
PRIOR_KINDS = tuple(PRIORS)


def prior_kind(name: str) -> PriorKind:
    """``PRIORS[name]``; an unknown name is an InputError naming ``prior``."""
    try:
        return PRIORS[name]
    except (KeyError, TypeError):
        raise InputError(f"must be one of {', '.join(PRIORS)}, got {name!r}",
                         field="prior") from None


def build_prior(likelihood, kind: str, variance: float = 1.0, lengthscale: float = 0.1, *,
                generator: torch.Generator | None = None, **gprior_options) -> GaussianPrior:
    """A prior of kind ``kind`` over the likelihood's linearised parameters, on its device.

    Parameters
    ----------
    likelihood : Likelihood
        Its linearisation gives the blocks; the g-prior's scales come from its ``Φ``.
    kind : str
        A name of :data:`PRIORS` (``'matern'``, ``'ard'``, ``'gprior'``).
    variance : float, optional
        Initial ``a_b`` (every block) or ``g``. Default 1 (reference).
    lengthscale : float, optional
        Initial Matérn ``ℓ_b``. Default 0.1 (reference).
    generator : torch.Generator, optional
        The g-prior's probes.
    **gprior_options
        Passed to :meth:`GPrior.from_likelihood` (``exact``, ``n_probes``, ``floor``).
    """
    return prior_kind(kind).build(likelihood, variance, lengthscale, generator=generator,
                                  **gprior_options)
