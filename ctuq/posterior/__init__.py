"""The linearised-Laplace engine, task-agnostic (docs/method.md).

A fitted network is linearised around its weights
(:class:`Linearization`); its data term is a :class:`Likelihood` with a
factor ``Φ`` of the Gauss–Newton matrix (:class:`LinearGaussianLikelihood`
for a linear forward operator such as a ray transform,
:class:`CategoricalLikelihood` for classifiers); a block Gaussian prior
(:class:`BlockPrior`, :class:`GPrior`) completes the posterior
``N(θ*, H⁻¹)``, ``H = ΦᵀΦ/σ² + Σ⁻¹``. Samples come from one of two samplers
(:class:`CGSampler`: Matheron + preconditioned CG; :class:`STOSampler`:
sample-then-optimise); :func:`fit_hyperparameters` tunes the prior (and the
noise) by sample-based EM / MacKay updates, optionally with a client's
:class:`Hyperprior`. :class:`ExactPosterior`, :class:`EvidenceOracle` and
:class:`DenseSampler` are the exact dense references for small problems.

The engine knows nothing of CT or classification: the clients
(:mod:`ctuq.recon`, :mod:`ctuq.classify`) build the likelihood, the prior
and the hyperprior and hand them in.
"""

from ctuq.posterior.categorical import (CategoricalLikelihood, ClassifierLinearization, b_mul,
                                        b_mul_jacobian, bt_mul, lambda_mul)
from ctuq.posterior.em import EMOptions, FittedPosterior, fit_hyperparameters, prior_lists
from ctuq.posterior.evidence_gradient import fit_evidence_gradient
from ctuq.posterior.evidence_oracle import DenseSampler, EvidenceOracle
from ctuq.posterior.likelihood import Likelihood, LinearGaussianLikelihood, dense_matrix
from ctuq.posterior.linearize import (CPU_CHUNK_ELEMENTS, Linearization, ParamBlock,
                                      ParamSegment, auto_chunk_size, select_parameters)
from ctuq.posterior.mstep import (EStepStats, Hyperprior, adam_mstep, closed_form_mstep,
                                  em_update, estep_statistics, expected_log_prior,
                                  mackay_update, noise_update)
from ctuq.posterior.oracle import ExactPosterior
from ctuq.posterior.preconditioner import NystromPreconditioner
from ctuq.posterior.prior_kinds import PRIOR_KINDS, build_prior
from ctuq.posterior.priors import (BlockPrior, GaussianPrior, GPrior, kernel_positions,
                                   matern_half_kernel)
from ctuq.posterior.samples import PosteriorSample, Sampler, SamplerState
from ctuq.posterior.sampling_cg import CGOptions, CGSampler, ObservationKernel, batched_cg
from ctuq.posterior.sampling_sto import STOOptions, STOSampler

__all__ = [
    "Linearization", "ParamBlock", "ParamSegment", "select_parameters", "auto_chunk_size",
    "CPU_CHUNK_ELEMENTS",
    "Likelihood", "LinearGaussianLikelihood", "dense_matrix",
    "CategoricalLikelihood", "ClassifierLinearization", "lambda_mul", "b_mul", "bt_mul",
    "b_mul_jacobian",
    "GaussianPrior", "BlockPrior", "GPrior", "build_prior", "PRIOR_KINDS",
    "matern_half_kernel", "kernel_positions",
    "NystromPreconditioner", "PosteriorSample", "SamplerState", "Sampler",
    "CGOptions", "CGSampler", "ObservationKernel", "batched_cg", "STOOptions", "STOSampler",
    "EMOptions", "FittedPosterior", "fit_hyperparameters", "prior_lists",
    "EStepStats", "estep_statistics", "mackay_update", "em_update", "noise_update",
    "expected_log_prior", "Hyperprior", "adam_mstep", "closed_form_mstep",
    "ExactPosterior", "EvidenceOracle", "DenseSampler", "fit_evidence_gradient",
]
