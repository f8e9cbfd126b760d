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

__all__ = ["UncertaintyMethod", "UncertaintyOutcome", "NoSettings"]


@dataclass(frozen=True)
class NoSettings:
    """The settings of a method that has none."""

    def __post_init__(self):
        validate(self)


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
    timings : dict
        Seconds per sub-stage.
    refit : bool
        The reconstruction is not the DIP fit's (the result then has
        ``psnr_dip`` beside ``psnr`` with a ground truth).
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
    timings: dict = field(default_factory=dict)
    refit: bool = False

    @property
    def std(self) -> Tensor:
        return self.variance.sqrt()


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
