"""The interface of an uncertainty method and the outcome every method returns.

A method (:class:`UncertaintyMethod`) runs after the pipeline's DIP+TV fit on
one :class:`~ctuq.recon.problem.ReconstructionProblem` and returns an
:class:`UncertaintyOutcome`; its settings are a dataclass declared with
:func:`ctuq.fields.setting` (checked like every other setting), read from the
TOML sub-table ``[uncertainty.<table>]``. The registry and
:func:`~ctuq.recon.methods.make_method` are in :mod:`ctuq.recon.methods`;
``docs/method.md`` ("Adding an uncertainty method") has a worked example.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

from torch import Tensor

from ctuq.fields import validate

__all__ = ["UncertaintyMethod", "UncertaintyOutcome", "MeanStep", "NoSettings"]


@dataclass(frozen=True)
class NoSettings:
    """The settings of a method that has none."""

    def __post_init__(self):
        validate(self)


@dataclass
class MeanStep:
    """A step from the DIP output that a method's image takes: ``x = x_dip + length · step``.

    Attributes
    ----------
    step : Tensor, shape (H, W)
        The step for the pipeline's DIP fit.
    of_fit : callable
        ``of_fit(dip, op, y, ray_variance) -> Tensor (H, W)``: the same step
        for another DIP fit of the scan, to the rows ``y`` of ``op`` (the
        held-out model error's fit without the left-out angles).
    length : float or None
        The length taken (1: the whole step). None: chosen by the held-out
        model error, the length in ``[0, 1]`` whose step of the held-out fit
        best predicts the left-out projections
        (:func:`~ctuq.recon.model_error.heldout.heldout_step_length`); until
        then the reconstruction takes the whole step.
    """

    step: Tensor
    of_fit: Callable
    length: float | None = 1.0


@dataclass
class UncertaintyOutcome:
    """What an uncertainty method returns; the same for every method.

    Attributes
    ----------
    reconstruction : Tensor, shape (H, W)
        The reconstruction shown (the DIP output, or the method's own).
    variance : Tensor, shape (H, W)
        The posterior's per-pixel variance (float64 on the CPU), without the
        model error.
    samples : Tensor, shape (k, H, W), or None
        A few posterior image samples (``reconstruction`` + fluctuation, or
        the method's own draws); the first ``stored_samples`` are kept in
        the result file.
    fluctuations : Tensor, shape (k, H, W), or None
        The samples minus their centre (zero-mean; the patch metrics).
    noise_var : float
        ``σ²`` of the measurements the method ended with (learned or known).
    posterior : PosteriorHandle
        The in-memory posterior (:mod:`ctuq.recon.posterior_handle`).
    hyperparameters : dict
        JSON-able; the result's ``hyperparameters``.
    trace : list of dict
        The EM trace (empty for a method without one).
    summary : dict
        JSON-able entries added to the result's effective config (e.g.
        ``{'evidence': ...}``).
    diagnostics : dict
        JSON-able results of the method's own solves that are not settings
        (e.g. ``predictive_data_error``); read by the result's stage record,
        kept out of the effective config.
    timings : dict
        Seconds per sub-stage.
    refit : bool
        The reconstruction is not the DIP fit's (the result then has
        ``psnr_dip`` beside ``psnr`` with a ground truth).
    mean_step : MeanStep, optional
        The step from the DIP output the reconstruction takes (the model
        error is then that of the DIP fit plus the step, the held-out fit's
        own step included). None (default): no step.
    """

    reconstruction: Tensor
    variance: Tensor
    samples: Tensor | None
    fluctuations: Tensor | None
    noise_var: float
    posterior: object
    hyperparameters: dict = field(default_factory=dict)
    trace: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    refit: bool = False
    mean_step: MeanStep | None = None

    @property
    def std(self) -> Tensor:
        return self.variance.sqrt()

    def recentre(self, reconstruction: Tensor) -> None:
        """Show ``reconstruction`` instead (the samples and the posterior's mean move with it)."""
        shift = reconstruction - self.reconstruction
        self.reconstruction = reconstruction
        if self.samples is not None:
            self.samples = self.samples + shift.to(self.samples)
        if getattr(self.posterior, "mean", None) is not None:
            self.posterior.mean = (self.posterior.mean + shift.cpu().numpy()).astype(
                self.posterior.mean.dtype)


class UncertaintyMethod:
    """An uncertainty method of the pipeline.

    Subclasses set :attr:`name` (``[uncertainty] method``), :attr:`settings_class`
    and implement :meth:`run`.

    Parameters
    ----------
    settings : settings_class instance, optional
        Default: ``settings_class()``.
    """

    #: ``[uncertainty] method = name``.
    name: ClassVar[str] = ""
    #: The TOML sub-table of the settings (default: ``name`` with ``-`` as ``_``).
    table: ClassVar[str] = ""
    #: A dataclass declared with :func:`ctuq.fields.setting`.
    settings_class: ClassVar[type] = NoSettings
    #: The std is the one ctuq's shipped model-error calibrations were fitted with.
    shipped_calibration: ClassVar[bool] = False
    #: Fewest ``predictive_samples`` the method can make a std from.
    min_predictive_samples: ClassVar[int] = 1

    def __init__(self, settings=None):
        self.settings = self.settings_class() if settings is None else settings

    @classmethod
    def table_name(cls) -> str:
        return cls.table or cls.name.replace("-", "_")

    @classmethod
    def required_model_error(cls, settings) -> str | None:
        """The model-error term these settings need (checked with the settings), or None."""
        return None

    def adapt_dip(self, dip_config):
        """The DIP settings of the pipeline's fit for this method (default: unchanged)."""
        return dip_config

    def run(self, problem, dip, *, stages, progress: Callable | None = None,
            cancel: Callable[[], bool] | None = None) -> UncertaintyOutcome:
        """The posterior after the DIP fit.

        Parameters
        ----------
        problem : ReconstructionProblem
            Operator, data, noise model, resolved settings
            (``problem.uncertainty.predictive_samples``...).
        dip : DIPResult
            The pipeline's fit (with :meth:`adapt_dip`'s settings).
        stages : StageRunner
            Runs or resumes a checkpointed sub-stage
            (:class:`ctuq.recon.stages.StageRunner`).
        progress, cancel : callable, optional
        """
        raise NotImplementedError
