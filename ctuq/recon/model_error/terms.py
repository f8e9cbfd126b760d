"""The model-error terms: the fit's own error beside the posterior (docs/method.md §8.2).

The linearised posterior describes how far the weights may move given the
data around the fitted network; it does not contain the fit's own bias
(DIP+TV rounds and blurs edges), and evidence computed on the sinogram that
the network fitted cannot see that bias either. ctuq therefore models the
reconstruction error as (``docs/method.md``, "The fit's own error")::

    x − x̂ = J (θ − θ*) + δ,     δ ~ N(0, diag(s0² + s1² e(x̂)²))

with ``e(x̂)`` the edge strength of the reconstruction (:func:`~ctuq.recon.model_error.edges.edge_strength`)
and ``s0 = t0 · rms(posterior std)``, so that both coefficients ``t0`` and
``s1`` are free of the image's intensity unit. The total per-pixel variance
is ``var_post + s0² + s1² e²``; result files keep the three parts.

Three ways to set the coefficients:

``'heldout'`` (per scan, no ground truth)
    Fit the DIP on the angles without every ``k``-th one; the left-out
    projections ``y_out ~ N(A_out x̂_in, A_out V A_outᵀ + σ² I)``, ``V =
    diag(var_post + s0² + s1² e(x̂_in)²)``, give a likelihood of ``(t0,
    s1)`` (:func:`~ctuq.recon.model_error.heldout.fit_heldout`); the coefficients are then applied to the
    fit on all angles.
``'calibrated'`` (per preset, from simulated scans)
    Maximise the pixel likelihood of known truths over ``(t0, s1)``
    (:func:`~ctuq.recon.model_error.coefficients.fit_to_truth`); ``ctuq calibrate`` writes the result to a small
    JSON file (:class:`~ctuq.recon.model_error.coefficients.ModelErrorCoefficients`) that a config names. ctuq
    ships such files for its presets, fitted on the tuning split.
``'conformal'`` (per preset, from simulated scans)
    Split-conformal scaling of the posterior std (:func:`~ctuq.recon.model_error.coefficients.conformal_scale`):
    with ``n`` calibration pixels, ``q`` is the ``⌈(n + 1) p⌉``-th smallest
    score ``|x − x̂| / std``; for a new pixel exchangeable with the
    calibration pixels, ``|x − x̂| ≤ q · std`` holds with probability at least
    ``p``. Pixels of one image are not independent and a user's image is not
    drawn from the calibration family, so the guarantee is marginal over
    images like the calibration ones, nothing more.

A term is an object (:class:`ModelErrorTerm`) made by :func:`make_model_error`
from the ``[uncertainty]`` settings: :meth:`~ModelErrorTerm.prepare` reads
what it needs from files before any fit (a missing or bad calibration file
stops a run at once), :meth:`~ModelErrorTerm.variance` gives the variance map
once the posterior's is known. This module is the one place that names the
terms (:data:`MODEL_ERROR_TERMS`); a new term is a subclass and a line there.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.progress import check_cancel, emit_progress
from ctuq.recon.model_error.coefficients import ModelErrorCoefficients, shipped_coefficients
from ctuq.recon.model_error.heldout import (fit_heldout, heldout_data, heldout_fit,
                                            heldout_misfit, heldout_step_length, kept_rows,
                                            preferred_input)
from ctuq.recon.model_error.names import CALIBRATED, CONFORMAL, HELDOUT, NONE
from ctuq.recon.provenance import keeping_threads, side_by_side

__all__ = ["ModelErrorTerm", "ModelErrorOutcome", "NoModelError", "HeldoutTerm",
           "CalibratedTerm", "ConformalTerm", "MODEL_ERROR_TERMS", "METHODS",
           "make_model_error", "coefficients_for", "heldout_prior", "shown_image",
           "FLOOR_CHOICES", "FLOOR_EXCESS", "FLOOR_REJECT_NATS", "fit_record",
           "floor_applies", "floor_rejection", "fit_rule", "EDGE_SHARE", "edge_concentration",
           "textured", "HELDOUT_NOISE_CHOICES", "heldout_noise_scale", "AUTO_INPUT_T",
           "input_fallback", "input_fallback_from_misfits"]

#: ``heldout_calibration_floor``: when the calibration is a lower bound of the held-out fit.
FLOOR_CHOICES = ("checked", "auto", "on", "off")
#: ``'checked'`` floors as ``'auto'`` does, but drops the floor where the held-out
#: projections reject it: their log-likelihood at the floored coefficients more than this
#: many nats below the unfloored fit's. Any threshold from 2 to 16 nats released the same
#: 8 of 20 realistic 64² validation scans (rejections of 44–167 nats; the largest of the
#: others 1.8; on 16 standard scans 3 at 93–300, the others 0): a clear rejection, not a
#: tuned number (docs/defaults.md).
FLOOR_REJECT_NATS = 10.0
#: The choices that floor by the fit's excess (:func:`floor_applies` reads it for them).
_BY_EXCESS = ("auto", "checked")
#: ``'auto'`` floors where the image shown leaves more than this mean squared whitened
#: residual per ray (every ray counted as a degree of freedom, so a fit at the noise
#: level stays below it): the data then hold an excess over the noise model that the
#: held-out residuals share and a free ``t0`` would read as pixel error (docs/defaults.md).
FLOOR_EXCESS = 1.0


#: ``dip.net_input = 'auto'`` takes the TV input over the FBP only where its held-out fit
#: predicts the left-out angles better by more than this many standard errors of the mean
#: per-angle difference (:func:`~ctuq.recon.model_error.heldout.preferred_input`; a one-sided
#: paired t-test near the 5 % level for 7–10 angles). On the 57 validation scans every
#: threshold from 1.84 to 2.9 makes the same choices (docs/dip.md §15).
AUTO_INPUT_T = 2.0


def input_fallback(op, y, out_mask, x_fit, x_input, ray_variance=None, *,
                   t_min: float = AUTO_INPUT_T) -> dict:
    """Whether the network's input image predicts the left-out angles clearly better
    than the held-out DIP fit made from it.

    The DIP+TV fit from the TV image can end worse than that image itself (on
    ellipse phantoms at 128², 1.7–7.5 dB below it); its held-out projections show
    it: ``t`` of :func:`~ctuq.recon.model_error.heldout.preferred_input` with the fit
    as the reference, above ``t_min`` on exactly those validation scans and at
    most 1.85 on every other at 64² and 128² (docs/dip.md §18).

    Parameters
    ----------
    op : RayTransform
        The operator of all angles.
    y : Tensor, shape (n_angles, n_detector)
    out_mask : array of bool, shape (n_angles,)
        The left-out angles.
    x_fit, x_input : Tensor, shape (H, W)
        The held-out fit's image and its network input, both made without the
        left-out rows.
    ray_variance : Tensor, optional
        Per-ray variances of the count noise model. Default None.
    t_min : float, optional
        Default :data:`AUTO_INPUT_T`.

    Returns
    -------
    dict
        ``used`` (bool: the input is clearly better), ``t``, ``t_min`` and
        ``heldout_misfit`` (the mean over the left-out rows, ``fit`` and ``input``).
    """
    return input_fallback_from_misfits(
        *(heldout_misfit(op, y, out_mask, x, ray_variance, per_angle=True)
          for x in (x_fit, x_input)), t_min=t_min)


def input_fallback_from_misfits(fit_misfit, input_misfit, *,
                                t_min: float = AUTO_INPUT_T) -> dict:
    """:func:`input_fallback` from the per-angle misfits of the fit and of its input
    (arrays of shape (n_out,), :func:`~ctuq.recon.model_error.heldout.heldout_misfit`
    with ``per_angle``): also a recorded run's, replayed."""
    per_angle = {"fit": np.asarray(fit_misfit, dtype=np.float64),
                 "input": np.asarray(input_misfit, dtype=np.float64)}
    chosen, t = preferred_input(per_angle, "fit", t_min)
    return {"used": chosen == "input", "t": t["input"], "t_min": float(t_min),
            "heldout_misfit": {k: float(m.mean()) for k, m in per_angle.items()}}


#: ``edge_concentration``: the share of pixels whose gradient it sums.
EDGE_SHARE = 0.1


def edge_concentration(image, share: float = EDGE_SHARE) -> float:
    """How much of an image's gradient its strongest edges carry: in ``(0, 1]``.

    The summed gradient magnitude of the ``share`` of pixels with the largest
    gradient over the sum over all pixels (central differences, ``numpy.gradient``).
    A piecewise-constant image keeps its gradient on its edges (near 1: rectangles
    0.8–1.0, the Shepp–Logan variants 0.8–0.9, digits 0.4–0.5); a textured one
    spreads it over every pixel (photo crops 0.26–0.29; ``share``
    itself for a uniform gradient). Independent of the image's scale and offset;
    a constant image gives 1.

    Parameters
    ----------
    image : array_like, shape (H, W)
    share : float, optional
        The fraction of pixels counted as the strongest edges. Default 0.1.
    """
    x = np.asarray(image, dtype=np.float64)
    gy, gx = np.gradient(x)
    g = np.sort(np.hypot(gx, gy).ravel())[::-1]
    total = g.sum()
    if not total > 0:
        return 1.0
    return float(g[:max(1, int(round(share * g.size)))].sum() / total)


def textured(edges: float | None, threshold: float) -> bool:
    """Whether an image of edge concentration ``edges`` (:func:`edge_concentration`;
    None: not measured) is a texture for ``heldout_texture_threshold = threshold``."""
    return edges is not None and edges < threshold


def fit_record(problem, image) -> dict:
    """The consistency record of ``image`` with every ray a degree of freedom.

    :func:`ctuq.recon.consistency.check_consistency` with the problem's noise model
    (given or estimated, with its per-ray variances and the quarter-pixel
    misregistration tolerance): ``chi2_dof`` is the mean squared whitened residual
    ``Σ r² / m`` over all ``m`` rays, ``verdict`` the check's (``'ok'``/``'misfit'``).
    """
    from ctuq.recon.consistency import check_consistency

    record, _ = check_consistency(problem.y, problem.op, image, problem.noise.variance, {},
                                  noise=problem.noise)
    return record


#: ``heldout_noise``: the noise variance the held-out likelihood reads its residuals with.
HELDOUT_NOISE_CHOICES = ("given", "residual")


def heldout_noise_scale(choice: str, record: dict | None) -> float:
    """The factor on ``σ²`` in the held-out likelihood that ``heldout_noise = choice`` gives.

    ``'given'``: 1 (the noise level of the run). ``'residual'``: the fit's excess
    (``record['chi2_dof']``, :func:`fit_record`) where it is above 1 and the consistency
    check accepts the fit (that record's verdict: the run's noise model, every ray a
    degree of freedom; the result's own check also counts the fit's effective
    parameters, so it can flag a borderline fit this one accepts): the part of the data
    that no image explains (photon noise heavier than its estimate on dense rays, a scan
    discretised otherwise than the projector) is on the held-out rays too and is read
    there as noise, not as pixel error. A fit the check flags (``verdict != 'ok'``: a
    wrong geometry) keeps 1, so that its held-out residuals still widen the interval.
    """
    if choice not in HELDOUT_NOISE_CHOICES:
        raise InputError(f"must be one of {', '.join(HELDOUT_NOISE_CHOICES)}, got {choice!r}",
                         field="uncertainty.heldout_noise")
    if choice == "given" or record is None or record.get("verdict") != "ok":
        return 1.0
    return max(1.0, float(record["chi2_dof"]))


def floor_applies(choice: str, excess: float | None, threshold: float = FLOOR_EXCESS) -> bool:
    """Whether ``heldout_calibration_floor = choice`` floors a fit of ``excess``
    (``chi2_dof`` of :func:`fit_record`; only ``'auto'`` and ``'checked'`` read it, against
    ``threshold``, which tuning varies)."""
    if choice not in FLOOR_CHOICES:
        raise InputError(f"must be one of {', '.join(FLOOR_CHOICES)}, got {choice!r}",
                         field="uncertainty.heldout_calibration_floor")
    if choice in _BY_EXCESS:
        return excess is not None and excess > threshold
    return choice == "on"


def floor_rejection(choice: str) -> float:
    """The nats by which held-out projections must reject the floor of
    ``heldout_calibration_floor = choice`` to drop it: :data:`FLOOR_REJECT_NATS` for
    ``'checked'``, ``inf`` (never) otherwise."""
    return FLOOR_REJECT_NATS if choice == "checked" else math.inf


def fit_rule(choice: str, excess: float | None, edges: float | None = None,
             texture_threshold: float = 0.0, *, threshold: float = FLOOR_EXCESS) -> dict:
    """The keywords of :meth:`~ctuq.recon.model_error.heldout.HeldoutLikelihood.fit` (and
    :func:`~ctuq.recon.model_error.heldout.fit_heldout`) that the held-out settings give.

    Parameters
    ----------
    choice : str
        ``heldout_calibration_floor`` (:data:`FLOOR_CHOICES`).
    excess : float or None
        ``chi2_dof`` of :func:`fit_record` for the image shown (None: not measured).
    edges : float or None, optional
        Its :func:`edge_concentration` (None: not measured, never a texture).
    texture_threshold : float, optional
        ``heldout_texture_threshold`` (0: no image is a texture). Default 0.
    threshold : float, optional
        The excess above which ``'auto'``/``'checked'`` floor. Default :data:`FLOOR_EXCESS`.

    Returns
    -------
    dict
        ``floor`` (:func:`floor_applies`), ``floor_reject`` (:func:`floor_rejection`) and
        ``texture`` (:func:`textured`): one mapping for the pipeline and for every
        offline refit of kept likelihoods, so that a refit is the pipeline's fit.
    """
    return {"floor": floor_applies(choice, excess, threshold),
            "floor_reject": floor_rejection(choice),
            "texture": textured(edges, texture_threshold)}


@dataclass
class ModelErrorOutcome:
    """What a term adds to the posterior.

    Attributes
    ----------
    variance : Tensor, shape (H, W)
        The model-error variance, float64 on the CPU.
    coefficients : ModelErrorCoefficients
        Recorded in the result (``config['model_error']``).
    seconds : float
    reconstruction : Tensor, shape (H, W), or None
        The image whose error this is, when it is not the DIP output: the DIP
        output plus the method's step at its length (chosen here when the method
        left it open, ``coefficients.info['step_length']``), or the network's
        input image where the held-out projections preferred it
        (``heldout_input_fallback``, ``coefficients.info['input_fallback']``).
    """

    variance: Tensor
    coefficients: ModelErrorCoefficients
    seconds: float = 0.0
    reconstruction: Tensor | None = None


class ModelErrorTerm:
    """One way of setting the model-error variance.

    Parameters
    ----------
    settings : UncertaintyConfig
        Read: ``heldout_every``, ``heldout_min_out``, ``heldout_prior_width``,
        ``heldout_calibration_floor``, ``heldout_noise``, ``heldout_correlation_length``,
        ``heldout_iterations``, ``model_error_file``.
    preset : str
        Picks the shipped calibration when no file is named.
    shipped : bool
        Whether the uncertainty method's std is the one ctuq's shipped
        calibrations were fitted with (only then are they used unasked).
    """

    #: The name in ``[uncertainty] model_error`` (set by each subclass).
    name: ClassVar[str] = ""
    #: Needs a calibration (a file, or a shipped one): checked with the settings.
    needs_calibration: ClassVar[bool] = False
    #: Makes a DIP fit before the fit on all angles (:meth:`fit_first`), which
    #: that fit continues from when ``dip_from_heldout > 0``: the image then
    #: depends on the term (read by ``ctuq calibrate`` as well).
    makes_fit_first: ClassVar[bool] = False

    def __init__(self, settings, preset: str, *, shipped: bool = True):
        self.settings, self.preset, self.shipped = settings, preset, bool(shipped)
        self.calibration: ModelErrorCoefficients | None = None
        self.source: str | None = None

    def prepare(self) -> "ModelErrorTerm":
        """Read the calibration this term needs (before any fit); returns ``self``."""
        return self

    def fit_first(self, problem, *, progress=None, cancel=None):
        """A DIP fit for the fit on all angles to continue from (``dip_from_heldout``
        > 0), made before it and kept for :meth:`compute`, or None: this term
        has no fit to share. Default None."""
        return None

    def beside_fit(self, problem, *, cancel=None) -> Callable[[], None] | None:
        """A DIP fit :meth:`compute` will need that can run beside the fit on all
        angles (on a thread of its own, :func:`side_by_side`): a callable that makes
        it and keeps it for :meth:`compute`, or None. Default None."""
        return None

    def shared_fit(self):
        """The DIP fit this term made in the DIP stage: before the fit on all angles
        (:meth:`fit_first`) or beside it (:meth:`beside_fit`); a ``DIPResult`` or
        None. Default None."""
        return None

    def first_fit_seconds(self) -> float:
        """Wall seconds of the fits :meth:`fit_first` or :meth:`beside_fit` made (more
        than one when it chose between inputs). Default 0."""
        return 0.0

    def compute(self, problem, fit, posterior_variance: Tensor, noise_var: float, *,
                mean_step=None, progress=None,
                cancel=None) -> tuple[ModelErrorCoefficients, Tensor, Tensor]:
        """``(coefficients, variance, image)``; see :meth:`variance`. Default: the
        prepared calibration, applied by :meth:`apply` to the image shown."""
        image = shown_image(fit, mean_step)
        return self.calibration, self.apply(self.calibration, image.cpu(),
                                            posterior_variance), image

    @classmethod
    def apply(cls, coefficients: ModelErrorCoefficients, x_hat, posterior_variance) -> Tensor:
        """The model-error variance that fitted ``coefficients`` give.

        Parameters
        ----------
        coefficients : ModelErrorCoefficients
        x_hat : Tensor, shape (H, W)
            The reconstruction whose error is modelled.
        posterior_variance : Tensor, shape (H, W)

        Returns
        -------
        Tensor, shape (H, W), float64
            ``s0² + s1²·|∇x̂|²``-type variance of the coefficients
            (:meth:`ModelErrorCoefficients.variance`).
        """
        return coefficients.variance(x_hat, posterior_variance)

    def variance(self, problem, fit, posterior_variance: Tensor, noise_var: float, *,
                 mean_step=None, progress: Callable | None = None,
                 cancel: Callable[[], bool] | None = None) -> ModelErrorOutcome:
        """The model-error variance beside ``posterior_variance``.

        Parameters
        ----------
        problem : ReconstructionProblem
            Its operator ``op`` and data ``y`` (:mod:`ctuq.recon.problem`).
        fit : DIPResult
            The fit whose error is modelled: ``reconstruction`` is the one
            shown (or the DIP output that ``mean_step`` starts from),
            ``config`` the DIP settings (a refit reuses them).
        posterior_variance : Tensor, shape (H, W)
        noise_var : float
            ``σ²`` of the measurements (the method's, learned or known).
        mean_step : MeanStep, optional
            The method's step from ``fit.reconstruction``
            (:class:`~ctuq.recon.methods.base.MeanStep`): the image shown is
            the fit's output plus the step, and a term that makes its own fit
            judges that fit's output plus its own step. A step of open length
            needs the held-out term, which chooses it. Default None.
        progress, cancel : callable, optional
            Stage ``'model error'``.
        """
        t0 = time.perf_counter()
        emit_progress(progress, "model error", 0, 1, self.name)
        coeffs, var, image = self.compute(problem, fit,
                                          posterior_variance.detach().double().cpu(),
                                          float(noise_var), mean_step=mean_step,
                                          progress=progress, cancel=cancel)
        emit_progress(progress, "model error", 1, 1, f"{self.name}: t0 {coeffs.t0:.3g}, "
                      f"s1 {coeffs.s1:.3g}")
        shown = mean_step is not None or coeffs.info.get("input_fallback", {}).get("used")
        return ModelErrorOutcome(var, coeffs, time.perf_counter() - t0,
                                 reconstruction=image if shown else None)


class NoModelError(ModelErrorTerm):
    """No model error: the posterior's variance alone."""

    name = NONE

    def compute(self, problem, fit, var_post, noise_var, *, mean_step=None, progress=None,
                cancel=None):
        return ModelErrorCoefficients(), torch.zeros_like(var_post), shown_image(fit, mean_step)

    @classmethod
    def apply(cls, coefficients, x_hat, posterior_variance):
        return torch.zeros_like(torch.as_tensor(posterior_variance, dtype=torch.float64))


class HeldoutTerm(ModelErrorTerm):
    """Per scan, from the projections of a second fit that left them out
    (:mod:`ctuq.recon.model_error.heldout`), with a log-normal prior around
    the calibration (:func:`heldout_prior`) and, where
    ``heldout_calibration_floor`` says so (:func:`floor_applies`), the
    calibration as a lower bound."""

    name = HELDOUT
    makes_fit_first = True
    #: ``(mask, held-out fit)`` when :meth:`fit_first` made the fit, else None.
    _first = None
    #: With ``dip.net_input = 'auto'``: ``{'chosen': name, 't': {name: t}, 't_min',
    #: 'heldout_misfit': {name: mean weighted squared residual on the left-out rows},
    #: 'per_angle': {name: [that mean per left-out angle]}}`` (:meth:`fit_first`).
    input_choice = None
    _first_seconds = 0.0
    #: ``(held-out DIP settings, noise std, (mask, held-out fit))`` when
    #: :meth:`beside_fit` made the fit, else None.
    _beside = None

    def prepare(self):
        self.calibration, self.source = heldout_prior(self.settings, self.preset,
                                                      shipped=self.shipped)
        return self

    def fit_first(self, problem, *, progress=None, cancel=None):
        """The held-out fit before the DIP fit on all angles (``dip_from_heldout`` > 0).

        Made with the problem's DIP settings and noise std, kept for
        :meth:`compute`; the fit on all angles continues from its weights
        (:func:`ctuq.recon.model_error.shared.dip_fit`). Returns the held-out
        fit (a :class:`~ctuq.recon.dip.DIPResult`).
        """
        from ctuq.recon.dip import AUTO, AUTO_NET_INPUTS

        s, dip, v = self.settings, problem.dip, problem.noise.ray_variance
        inputs = AUTO_NET_INPUTS if dip.net_input == AUTO else (dip.net_input,)
        tasks = {name: self._heldout_task(problem, heldout_config(dip.with_(net_input=name),
                                                                  s.heldout_iterations),
                                          cancel)
                 for name in inputs}

        def fit(name, report=progress):
            return tasks[name](report)

        threads, t0 = torch.get_num_threads(), time.perf_counter()
        if len(inputs) > 1 and threads >= len(inputs) and fits_side_by_side(problem.op, dip):
            report = keeping_threads(progress)  # the first fit reports progress
            results = side_by_side([lambda n=name, r=(report if i == 0 else None): fit(n, r)
                                    for i, name in enumerate(inputs)], threads)
            fits = dict(zip(inputs, results))
        else:
            fits = {name: fit(name) for name in inputs}
        self._first_seconds = time.perf_counter() - t0  # side by side: less than their sum
        chosen = inputs[0]
        if len(fits) > 1:  # dip.net_input = 'auto': the input that predicts the left-out rows
            per_angle = {name: heldout_misfit(problem.op, problem.y, mask,
                                              held.reconstruction, v, per_angle=True)
                         for name, (mask, held) in fits.items()}
            chosen, t = preferred_input(per_angle, inputs[0], AUTO_INPUT_T)
            self.input_choice = {"chosen": chosen, "t": t, "t_min": AUTO_INPUT_T,
                                 "heldout_misfit": {k: float(m.mean())
                                                    for k, m in per_angle.items()},
                                 "per_angle": {k: m.tolist() for k, m in per_angle.items()},
                                 # how well each input image itself predicts them
                                 "input_per_angle": {
                                     name: heldout_misfit(problem.op, problem.y, mask,
                                                          held.net_input[0, 0], v,
                                                          per_angle=True).tolist()
                                     for name, (mask, held) in fits.items()}}
        self._first = fits[chosen]
        return self._first[1]

    def beside_fit(self, problem, *, cancel=None):
        """The held-out fit of two separate fits, made beside the fit on all angles.

        Where the fit on all angles does not continue from the held-out fit
        (``dip_from_heldout = 0``, a fixed network input) and the noise level is
        known, the held-out fit :meth:`compute` makes after the method needs
        nothing the method finds, and the two fits can share the cores (two
        threads or more, a CPU operator held as a matrix, no dropout). Its result
        is that of a fit on one thread made after the method: :meth:`compute`
        takes it when the method kept the noise level and the fit's settings.
        ``heldout_beside = false`` turns it off.
        """
        from ctuq.recon.dip import AUTO

        s, dip, threads = self.settings, problem.dip, torch.get_num_threads()
        if (not s.heldout_beside or threads < 2 or self._first is not None
                or float(s.dip_from_heldout) > 0 or dip.net_input == AUTO
                or not getattr(problem.noise, "known", False)  # a given noise level only
                or not fits_side_by_side(problem.op, dip)):
            return None
        config = heldout_config(dip, s.heldout_iterations)
        task = self._heldout_task(problem, config, cancel)

        def fit():
            t0 = time.perf_counter()
            held = task()
            self._beside = (config, problem.noise.std, held)
            self._first_seconds = time.perf_counter() - t0

        return fit

    def _heldout_task(self, problem, config, cancel):
        """The held-out fit of ``config`` at the problem's noise std, as a callable
        ``task(progress=None)``; its kept rows and network input are made here, in the
        caller's thread (operators and ODL calls first, before any fit runs beside)."""
        s, std = self.settings, problem.noise.std
        data = heldout_data(problem.y, problem.op, config, every=s.heldout_every,
                            min_out=s.heldout_min_out, noise_std=std,
                            ray_variance=problem.noise.ray_variance)

        def task(progress=None):
            return heldout_fit(problem.y, problem.op, config, noise_std=std,
                               progress=progress, cancel=cancel, data=data)

        return task

    def shared_fit(self):
        """The held-out fit made by :meth:`fit_first` or :meth:`beside_fit`, or None."""
        first = self._first if self._first is not None else (
            None if self._beside is None else self._beside[2])
        return None if first is None else first[1]

    def first_fit_seconds(self) -> float:
        return float(self._first_seconds)

    def compute(self, problem, fit, var_post, noise_var, *, mean_step=None, progress=None,
                cancel=None):
        s = self.settings
        v = problem.noise.ray_variance  # the count noise model's (None: every ray alike)
        made_beside = False
        if self._first is not None:  # made before the fit on all angles (fit_first)
            mask, dip_in = self._first
        else:  # the DIP settings of the run (a resumed run's continued fit has fewer iterations)
            base = problem.dip if s.dip_from_heldout > 0 else fit.config
            base = base.with_(net_input=fit.config.net_input)  # 'auto' as the fit chose it
            config, std = heldout_config(base, s.heldout_iterations), math.sqrt(noise_var)
            beside = self._beside
            if beside is not None and beside[0] == config and math.isclose(
                    beside[1], std, rel_tol=1e-12):  # made beside the fit, as it would be here
                (mask, dip_in), made_beside = beside[2], True
            else:
                mask, dip_in = heldout_fit(problem.y, problem.op, config,
                                           every=s.heldout_every, min_out=s.heldout_min_out,
                                           noise_std=std, ray_variance=v,
                                           progress=progress, cancel=cancel)
        check_cancel(cancel, "reconstruction")
        x_in, length = dip_in.reconstruction.detach(), None
        if mean_step is not None:  # the held-out fit's image as the method makes it
            step_in = mean_step.of_fit(dip_in, *kept_rows(problem.op, problem.y, mask, v))
            length = mean_step.length
            if length is None:
                length = heldout_step_length(problem.op, problem.y, mask, x_in, step_in, v)
            x_in = x_in + length * step_in.to(x_in)
        image = shown_image(fit, mean_step, length)
        fallback = None
        if mean_step is None and s.heldout_input_fallback and fit.config.net_input == "tv":
            # the TV image itself where it predicts the left-out angles clearly better
            # than the DIP fit from it; the coefficients then read its held-out residual
            x_input = dip_in.net_input.detach().reshape(x_in.shape).to(x_in)
            fallback = input_fallback(problem.op, problem.y, mask, x_in, x_input, v)
            if fallback["used"]:
                image = fit.net_input.detach().reshape(image.shape).to(image)
                x_in = x_input
        rule = s.heldout_calibration_floor
        record = fit_record(problem, image) if s.heldout_noise != "given" or (
            rule in _BY_EXCESS and self.calibration is not None) else None
        excess = None if record is None else float(record["chi2_dof"])
        scale = heldout_noise_scale(s.heldout_noise, record)
        edges = edge_concentration(image.cpu().numpy()) \
            if s.heldout_texture_threshold > 0 and self.calibration is not None else None
        coeffs = fit_heldout(problem.op, problem.y, mask, x_in.cpu(),
                             var_post, noise_var, prior=self.calibration,
                             prior_width=s.heldout_prior_width, ray_variance=v,
                             correlation_length=s.heldout_correlation_length,
                             noise_scale=scale,
                             **fit_rule(rule, excess, edges, s.heldout_texture_threshold))
        coeffs.info.update(noise_rule=s.heldout_noise, noise_scale=scale)
        if made_beside:  # on a thread of its own, during the fit on all angles
            coeffs.info["fit_beside"] = True
        if self.calibration is not None:
            coeffs.info["prior"].update({"from": self.source, "floor_rule": rule,
                                         "fit_excess": excess, "edge_concentration": edges,
                                         "texture_threshold": s.heldout_texture_threshold})
        if length is not None:
            coeffs.info["step_length"] = float(length)
        if self.input_choice is not None:
            coeffs.info["net_input"] = self.input_choice
        if fallback is not None:
            coeffs.info["input_fallback"] = fallback
        return coeffs, self.apply(coeffs, image.cpu(), var_post), image


def fits_side_by_side(op, dip_config) -> bool:
    """Whether DIP fits on ``op`` may run side by side (:func:`side_by_side`): a CPU
    operator held as a matrix (ASTRA's projectors, which ``'astra'`` calls, are
    not shared between threads; a GPU runs one fit's kernels at a time anyway), and
    no dropout (its masks come from torch's global RNG, which threads share)."""
    return (getattr(op, "backend", None) == "matrix" and torch.device(op.device).type == "cpu"
            and not dip_config.dropout)


def shown_image(fit, mean_step=None, length: float | None = None) -> Tensor:
    """The DIP fit's output plus the method's step at ``length`` (default: the step's own;
    an open length is refused), detached."""
    image = fit.reconstruction.detach()
    if mean_step is None:
        return image
    length = mean_step.length if length is None else length
    if length is None:
        raise InputError("the reconstruction's step length is chosen on held-out "
                         f"projections: it needs model_error = {HELDOUT!r}",
                         field="uncertainty.model_error")
    return image + float(length) * mean_step.step.detach().to(image)


def heldout_config(dip_config, fraction: float = 1.0):
    """The held-out fit's DIP settings: the fit's own, with ``fraction`` of its iterations.

    The held-out fit starts from the same random weights as the fit on all
    angles (never from that fit, which has seen the held-out rows); a
    fraction below 1 shortens it, its cosine learning-rate schedule ending
    at the same floor after fewer steps. 1 (the default) keeps the settings
    unchanged.
    """
    if fraction >= 1.0:
        return dip_config
    return dip_config.with_(iterations=max(1, round(int(dip_config.iterations) * fraction)))


class CalibratedTerm(ModelErrorTerm):
    """Per preset: coefficients fitted to known truths of simulated scans
    (``ctuq calibrate``, :func:`~ctuq.recon.model_error.coefficients.fit_to_truth`)."""

    name = CALIBRATED
    needs_calibration = True

    def prepare(self):
        path = self.settings.model_error_file
        self.calibration = coefficients_for(self.preset, path)
        self.source = str(path) if path else f"shipped:{self.preset}"
        return self



class ConformalTerm(CalibratedTerm):
    """Per preset: total std = ``q`` · posterior std, never below the posterior's
    (:func:`~ctuq.recon.model_error.coefficients.conformal_scale`)."""

    name = CONFORMAL

    @classmethod
    def apply(cls, coefficients, x_hat, posterior_variance):
        q = max(coefficients.conformal, 1.0)
        return (q**2 - 1.0) * torch.as_tensor(posterior_variance, dtype=torch.float64)


#: The model-error terms by name (``[uncertainty] model_error``).
MODEL_ERROR_TERMS: dict[str, type[ModelErrorTerm]] = {
    cls.name: cls for cls in (HeldoutTerm, CalibratedTerm, ConformalTerm, NoModelError)}
#: Their names (also the ``method`` of :class:`ModelErrorCoefficients`).
METHODS = tuple(MODEL_ERROR_TERMS)


def make_model_error(name: str, settings, preset: str, *, shipped: bool = True
                     ) -> ModelErrorTerm:
    """The term ``name`` of :data:`MODEL_ERROR_TERMS` (not yet prepared).

    Raises
    ------
    InputError
        An unknown name.
    """
    try:
        cls = MODEL_ERROR_TERMS[name]
    except KeyError:
        raise InputError(f"must be one of {', '.join(MODEL_ERROR_TERMS)}, got {name!r}",
                         field="uncertainty.model_error") from None
    return cls(settings, preset, shipped=shipped)


def coefficients_for(preset: str, path=None) -> ModelErrorCoefficients:
    """The calibration of ``path``, or the one shipped for ``preset``.

    Raises
    ------
    InputError
        No file given and none shipped for the preset, or a bad file.
    """
    if path is not None:
        return _known_term(ModelErrorCoefficients.load(path), path)
    shipped = shipped_coefficients(preset)
    if shipped is None:
        raise InputError(f"ctuq ships no model-error calibration for preset {preset!r}: run "
                         "'ctuq calibrate --size SIDE --out FILE' (SIDE: the image side of "
                         "the scans) and set "
                         f"uncertainty.model_error_file = FILE, or use model_error = "
                         f"'{HeldoutTerm.name}'", field="uncertainty.model_error_file")
    return shipped


def heldout_prior(settings, preset: str, *, shipped: bool = True):
    """The calibration that centres the held-out fit's prior, and where it came from.

    ``(None, None)`` when ``heldout_prior_width`` is 0, or when no
    ``model_error_file`` is named and ctuq ships none for the preset (or
    ``shipped`` is False: the method's std is not the one the shipped files
    were fitted with).
    """
    if settings.heldout_prior_width == 0:
        return None, None
    if settings.model_error_file is not None:
        path = settings.model_error_file
        return _known_term(ModelErrorCoefficients.load(path), path), str(path)
    if not shipped:
        return None, None
    found = shipped_coefficients(preset)
    return (found, f"shipped:{preset}") if found is not None else (None, None)


def _known_term(coefficients: ModelErrorCoefficients, path) -> ModelErrorCoefficients:
    """``coefficients`` read from ``path``, refused when no term of that name exists."""
    if coefficients.method not in MODEL_ERROR_TERMS:
        raise InputError(f"must be one of {', '.join(MODEL_ERROR_TERMS)}, got "
                         f"{coefficients.method!r}", file=path, field="method")
    return coefficients
