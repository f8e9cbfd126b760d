"""IVON: the Adam DIP fit continued by variational learning (:mod:`ctuq.recon.ivon_dip`).

The std comes from samples of IVON's weight posterior; the reconstruction is
the output of its mean weights. docs/ivon.md has the derivation and the
validation behind the defaults (those of :class:`~ctuq.recon.ivon_dip.IVONDIPConfig`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ctuq.fields import setting, validate
from ctuq.recon.methods.base import UncertaintyMethod, UncertaintyOutcome

__all__ = ["IVONDIPSettings", "IVONMethod"]


@dataclass(frozen=True)
class IVONDIPSettings:
    """Settings of the IVON method (``[uncertainty.ivon]``); the fields of
    :class:`~ctuq.recon.ivon_dip.IVONDIPConfig` that a run may change, with
    its defaults (chosen on validation data, docs/ivon.md §5). The weight
    samples are ``[uncertainty] predictive_samples``; the DIP settings are
    the pipeline's; IVON always starts from the pipeline's Adam fit.
    """

    iterations: int = setting(300, kind=int, minimum=1, maximum=10**7, doc="IVON steps.")
    lr: float = setting(3e-4, kind=float, greater_than=0, maximum=10.0,
                        doc="Peak IVON learning rate (cosine decay).")
    lr_min_factor: float = setting(0.01, kind=float, minimum=0, maximum=1,
                                   doc="Final learning rate as a fraction of lr.")
    hess_init: float = setting(1000.0, kind=float, greater_than=0, maximum=1e12,
                               doc="Initial curvature h0 of the per-measurement loss.")
    ess: float | None = setting(8.0, kind=float, greater_than=0, maximum=1e12,
                                doc="Effective sample size (T = d_y / ess); none: temperature.")
    temperature: float = setting(1.0, kind=float, greater_than=0, maximum=1e12,
                                 doc="Temperature T when ess is not set.")
    prior_precision: float = setting(1.0, kind=float, greater_than=0, maximum=1e12,
                                     doc="Precision of the Gaussian weight prior.")
    beta1: float = setting(0.9, kind=float, minimum=0, maximum=1, doc="Gradient momentum.")
    beta2: float = setting(0.99, kind=float, minimum=0, maximum=1,
                           doc="Hessian averaging.")
    mc_samples: int = setting(1, kind=int, minimum=1, maximum=10_000,
                              doc="Weight samples per IVON step.")
    clip_radius: float = setting(0.01, kind=float, greater_than=0, maximum=1e30,
                                 doc="Element-wise clip of the preconditioned step.")
    unclamped: bool = setting(True, kind=bool,
                              doc="Evaluate without the U-net's pre-sigmoid clamp.")

    def __post_init__(self):
        validate(self, prefix="uncertainty.ivon")


class IVONMethod(UncertaintyMethod):
    """IVON's weight posterior (needs at least 2 weight samples for a std)."""

    name = "ivon"
    settings_class = IVONDIPSettings
    min_predictive_samples = 2

    def run(self, problem, dip, *, stages, progress=None, cancel=None) -> UncertaintyOutcome:
        from ctuq.recon.ivon_dip import PIPELINE_CONFIG, ivon_uncertainty

        k = int(problem.uncertainty.predictive_samples)
        config = PIPELINE_CONFIG.with_(**asdict(self.settings))
        out = ivon_uncertainty(dip, problem.op, problem.y, problem.noise.std,
                               predictive_samples=k, config=config, seed=problem.seed,
                               progress=progress, cancel=cancel)
        summary = dict(out["summary"])
        summary["config"] = {k: v for k, v in summary["config"].items() if k != "dip"}
        return UncertaintyOutcome(
            reconstruction=out["reconstruction"], variance=out["variance"],
            samples=out["samples"], fluctuations=out["image_samples"],
            noise_var=float(problem.noise.std) ** 2, posterior=out["posterior"],
            hyperparameters=out["hyperparameters"], trace=[], summary={"ivon": summary},
            timings=out["timings"], refit=True)
