"""The classification client of the posterior engine (docs/method.md §11).

A MAP classifier (:mod:`~ctuq.classify.training`), its linearised Laplace
posterior through the engine's categorical likelihood
(:mod:`~ctuq.classify.laplace`), predictive distributions
(:mod:`~ctuq.classify.predictive`), the exact dense oracle
(:mod:`~ctuq.classify.exact`), baselines (:mod:`~ctuq.classify.baselines`),
metrics (:mod:`~ctuq.classify.metrics`) and the benchmark
(:mod:`~ctuq.classify.bench`). The names used most are re-exported here::

    import ctuq.classify as C
    C.train_map(net, x, y); clin = C.ClassifierLinearization(net, x)
"""

from ctuq.classify.baselines import (LAPLACE_TORCH_STRUCTURES, LAPLACE_TORCH_SUBSETS,
                                     laplace_torch_available, laplace_torch_fit,
                                     mc_dropout_predict)
from ctuq.classify.exact import ExactLLA
from ctuq.classify.laplace import (CLASSIFIER_STO, PRIORS, build_prior, fit_prior, gprior_for,
                                   last_layer_filter, linear_logits, linear_mode, sample_sto)
from ctuq.classify.predictive import (function_samples, gaussian_deviations,
                                      gaussian_mc_predictive, mc_predictive, probit_predictive,
                                      sample_function_variance, scaled_mc_predictive,
                                      scaled_predictive_nll, scaled_prior_covariance,
                                      tune_predictive_scale, tune_prior_scale, tune_temperature)
from ctuq.classify.training import train_map
from ctuq.posterior import (CategoricalLikelihood, ClassifierLinearization, STOOptions, b_mul,
                            bt_mul, lambda_mul)

__all__ = [
    "train_map", "ClassifierLinearization", "CategoricalLikelihood", "lambda_mul", "b_mul",
    "bt_mul", "STOOptions", "CLASSIFIER_STO", "PRIORS", "build_prior", "gprior_for",
    "sample_sto", "fit_prior", "linear_mode", "linear_logits", "last_layer_filter",
    "function_samples", "mc_predictive", "scaled_mc_predictive", "scaled_predictive_nll",
    "tune_predictive_scale", "tune_temperature", "gaussian_deviations",
    "scaled_prior_covariance", "tune_prior_scale", "probit_predictive",
    "gaussian_mc_predictive", "sample_function_variance", "ExactLLA", "mc_dropout_predict",
    "laplace_torch_available", "laplace_torch_fit", "LAPLACE_TORCH_SUBSETS",
    "LAPLACE_TORCH_STRUCTURES",
]
