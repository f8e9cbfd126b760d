"""MC dropout, the papers' baseline (:mod:`ctuq.recon.mc_dropout`): the pipeline's DIP+TV
fit is made with ``Dropout2d(p)`` after every 3×3 convolution, and the
reconstruction and std are the mean and spread of stochastic forward passes
with dropout kept active (``[uncertainty] predictive_samples`` of them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ctuq.fields import setting, validate
from ctuq.recon.methods.base import UncertaintyMethod, UncertaintyOutcome
from ctuq.recon.posterior_handle import PosteriorHandle

__all__ = ["MCDropoutSettings", "MCDropoutMethod", "MCDropoutPosterior"]


@dataclass(frozen=True)
class MCDropoutSettings:
    """Settings of MC dropout (``[uncertainty.mc_dropout]``).

    Parameters
    ----------
    dropout : float
        ``Dropout2d`` probability of the fit and the passes. Default 0.05
        (the papers' baseline).
    batch_size : int
        Passes evaluated together. Default 16.
    """

    dropout: float = setting(0.05, kind=float, greater_than=0, maximum=0.95,
                             doc="Dropout2d probability (fit and passes).")
    batch_size: int = setting(16, kind=int, minimum=1, maximum=10_000,
                              doc="Stochastic passes evaluated together.")

    def __post_init__(self):
        validate(self, prefix="uncertainty.mc_dropout")


class MCDropoutPosterior(PosteriorHandle):
    """The dropout-active network's passes (``result.posterior`` of an MC-dropout run).

    Parameters
    ----------
    model : nn.Module
        The fitted network with its dropout layers.
    net_input : Tensor, shape (1, C, H, W)
    mean : ndarray, shape (H, W)
        The reconstruction (the mean of the pipeline's passes).
    batch_size : int
    seed : int
    """

    min_samples = 2

    def __init__(self, model, net_input, mean, *, batch_size: int = 16, seed: int = 0):
        super().__init__(mean, seed=seed)
        self.model, self.net_input, self.batch_size = model, net_input, int(batch_size)

    def posterior_draws(self, n: int, seed: int) -> np.ndarray:
        from ctuq.recon.mc_dropout import mc_dropout_predict

        _, _, samples = mc_dropout_predict(self.model, self.net_input, int(n),
                                           batch_size=self.batch_size, seed=int(seed),
                                           keep_samples=True)
        return samples.reshape(int(n), *self.image_shape).double().numpy()

    def fluctuations(self, n: int, seed: int) -> np.ndarray:
        outs = self.posterior_draws(n, seed)
        return outs - outs.mean(0)


class MCDropoutMethod(UncertaintyMethod):
    """Monte-Carlo dropout: mean and spread of dropout-active passes of the fit."""

    name = "mc-dropout"
    settings_class = MCDropoutSettings
    min_predictive_samples = 2

    def adapt_dip(self, dip_config):
        return dip_config.with_(dropout=float(self.settings.dropout))

    def run(self, problem, dip, *, stages, progress=None, cancel=None) -> UncertaintyOutcome:
        from ctuq.recon.mc_dropout import mc_dropout_predict

        t0 = time.perf_counter()
        k = int(problem.uncertainty.predictive_samples)
        shape = tuple(dip.reconstruction.shape)
        mean, std, samples = mc_dropout_predict(
            dip.model, dip.net_input, k, batch_size=self.settings.batch_size,
            seed=problem.seed + 2, keep_samples=True, progress=progress, cancel=cancel)
        dip.model.eval()
        mean, std = mean.reshape(shape).cpu(), std.reshape(shape).cpu()
        samples = samples.reshape(k, *shape)
        handle = MCDropoutPosterior(dip.model, dip.net_input, mean.numpy(),
                                    batch_size=self.settings.batch_size, seed=problem.seed)
        return UncertaintyOutcome(
            reconstruction=mean, variance=std.double() ** 2, samples=samples,
            fluctuations=samples - samples.mean(0), noise_var=float(problem.noise.std) ** 2,
            posterior=handle,
            hyperparameters={"method": self.name, "dropout": float(self.settings.dropout),
                             "sigma2": float(problem.noise.std) ** 2, "noise_learned": False},
            summary={"mc_dropout": {"dropout": float(self.settings.dropout),
                                    "passes": k}},
            timings={"mc_dropout": time.perf_counter() - t0}, refit=True)
