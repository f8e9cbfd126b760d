"""The fit's own error: an image-space variance beside the posterior's (docs/method.md §8.2).

:mod:`~ctuq.recon.model_error.terms`
    The terms (:class:`~ctuq.recon.model_error.terms.ModelErrorTerm`), their
    registry and :func:`~ctuq.recon.model_error.terms.make_model_error`; what
    each term does is described there.
:mod:`~ctuq.recon.model_error.coefficients`
    :class:`ModelErrorCoefficients` (``t0``, ``s1``, the conformal
    multiplier), their JSON files and the ones ctuq ships per preset, and the
    fits to known truths.
:mod:`~ctuq.recon.model_error.heldout`
    The second fit without some angles and the likelihood of the left-out
    projections.
:mod:`~ctuq.recon.model_error.edges`
    The edge features.
"""

from ctuq.recon.model_error.coefficients import (DEFAULTS_DIR, FILE_FORMAT,
                                                 ModelErrorCoefficients, conformal_scale,
                                                 fit_to_truth, model_error_variance,
                                                 shipped_coefficients)
from ctuq.recon.model_error.edges import edge_mask, edge_strength, neighbour_difference
from ctuq.recon.model_error.heldout import (HeldoutLikelihood, correlated_rows, fit_heldout,
                                            heldout_fit, heldout_likelihood, heldout_split)
from ctuq.recon.model_error.terms import (METHODS, MODEL_ERROR_TERMS, ModelErrorOutcome,
                                          ModelErrorTerm, coefficients_for, heldout_prior,
                                          make_model_error)

__all__ = ["METHODS", "MODEL_ERROR_TERMS", "ModelErrorTerm", "ModelErrorOutcome",
           "make_model_error", "ModelErrorCoefficients", "coefficients_for", "edge_strength",
           "model_error_variance", "fit_to_truth", "fit_heldout", "heldout_fit",
           "heldout_likelihood", "HeldoutLikelihood", "heldout_split", "conformal_scale",
           "shipped_coefficients", "edge_mask", "neighbour_difference", "DEFAULTS_DIR",
           "FILE_FORMAT", "heldout_prior", "correlated_rows"]
