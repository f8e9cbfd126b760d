"""IVON-DIP: the DIP+TV fit with variational learning (IVON) instead of Adam.

The same U-net, fixed input and objective as :func:`ctuq.recon.dip.fit_dip`
(:func:`~ctuq.recon.dip.dip_tv_loss`, :func:`~ctuq.recon.dip.make_net_input`),
trained by ``ivon.IVON`` (:mod:`ctuq.models.ivon`), which learns a diagonal
Gaussian ``q(θ) = N(m, diag v)`` over the weights. The per-pixel std is the
spread of ``f(θ_k)`` over ``n_samples`` draws ``θ_k ~ q``. docs/ivon.md has the
derivation, the settings chosen on validation data and the measurements.

The posterior IVON approximates
    With ``d_y`` sinogram entries, noise std ``σ`` (given, or
    :func:`~ctuq.recon.baselines.estimate_noise_std` of ``y``) and the DIP+TV
    loss ``L(θ) = ‖A f(θ) − y‖² + γ TV(f(θ))``, the per-measurement mean loss

        ℓ̄(θ) = L(θ) / (2 σ² d_y)

    is the Gaussian negative log-likelihood per sinogram entry plus a TV
    prior ``exp(−γ TV(f) / (2σ²))`` on the image, spread over the entries.
    With ``ess = d_y / T`` and ``weight_decay = α T / d_y`` (α =
    :attr:`IVONDIPConfig.prior_precision`, T = :attr:`IVONDIPConfig.temperature`,
    or ``d_y / ess`` when :attr:`IVONDIPConfig.ess` is set)
    IVON's ``q`` is the mean-field approximation of

        p(θ | y) ∝ exp(−L(θ) / (2σ² T)) · N(θ; 0, α⁻¹ I):

    ``T = 1`` is the proper posterior of the DIP+TV model; ``T > 1`` tempers
    the data and TV terms together (as if ``σ² → T σ²``, a wider posterior),
    the weight prior stays ``N(0, α⁻¹ I)``. ``hess_init`` ``h₀`` is the
    initial curvature of ``ℓ̄`` per weight: the initial variance is
    ``T / (d_y (h₀ + αT/d_y))`` and, by IVON's ``rescale_lr``, the step is
    ``lr (h₀ + δ) / (h + δ)`` times the (momentum) gradient.

Defaults (chosen on validation data, docs/ivon.md §5)
    Start from the Adam DIP fit, 300 IVON steps, ``ess = 8`` (``T = d_y/8``),
    ``h₀ = 1000``, ``lr = 3e-4``. In 300 steps with ``β₂ = 0.99`` the Hessian
    estimate keeps ``h ≈ h₀ β₂³⁰⁰ ≈ 50`` on every weight (the data part is
    far smaller), so ``q`` is in effect an isotropic Gaussian around the
    refitted weights (std ≈ 0.05 per weight) pushed through the network:
    IVON's learned curvature does not shape it. Settings where ``h`` does
    converge (1000 steps) scored lower on validation.

Reconstruction
    The output of the **mean weights** ``f(m)`` (:attr:`IVONDIPResult.reconstruction`);
    the mean of the weight samples' outputs is kept as
    :attr:`IVONDIPResult.sample_mean`. docs/ivon.md compares the two on
    validation data.

Examples
--------
>>> from ctuq.data.geometry import Geometry
>>> from ctuq.data.operators import RayTransform
>>> from ctuq.data.phantoms import digits
>>> from ctuq.data.simulate import simulate_sinogram
>>> op = RayTransform(Geometry.parallel(28, 20))
>>> y, sigma = simulate_sinogram(digits(1)[0], op, 0.05, seed=1)
>>> from ctuq.recon.dip import DIPConfig
>>> cfg = IVONDIPConfig(dip=DIPConfig(iterations=20), iterations=20, n_samples=4)
>>> res = fit_ivon_dip(y, op, cfg, noise_std=sigma)
>>> tuple(res.reconstruction.shape), tuple(res.std.shape), bool((res.std > 0).all())
((28, 28), (28, 28), True)
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.models.ivon import DiagonalGaussian, IVONSettings, evaluate_under_samples, train_ivon
from ctuq.models.unet import UNet, build_unet
from ctuq.recon.dip import (
    DIPConfig,
    DIPResult,
    _as_sinogram,
    fit_dip,
    dip_tv_loss,
    load_weights,
    make_net_input,
    resolve_device,
)
from ctuq.progress import emit_progress
from ctuq.recon.posterior_handle import PosteriorHandle

__all__ = ["IVONDIPConfig", "IVONDIPResult", "fit_ivon_dip", "ivon_dip_samples",
           "DEFAULT_SAMPLES", "IVONPosterior", "ivon_uncertainty"]

log = logging.getLogger(__name__)

#: Default number of weight samples for the std map.
DEFAULT_SAMPLES = 64


@dataclass(frozen=True)
class IVONDIPConfig:
    """Settings of :func:`fit_ivon_dip`.

    Parameters
    ----------
    dip : DIPConfig
        Architecture (``preset``/``unet``), network input, TV weight
        (``tv_weight`` or ``tv_weight_factor``), ``seed``, ``device``,
        ``progress_every`` and ``init_weights`` (warm start of the mean) are
        taken from it; its Adam fields (``iterations``, ``lr``,
        ``lr_schedule``, ``clip_grad_norm``, ``dropout``) are not used.
        Default ``DIPConfig()`` (``reference-28``).
    iterations : int
        IVON steps. Default 300 (chosen on validation data, docs/ivon.md §5).
    lr : float
        Peak IVON learning rate (cosine decay to ``lr · lr_min_factor``).
        Default 3e-4 (``0.3 / hess_init``).
    lr_min_factor : float
        Default 0.01.
    hess_init : float
        ``h₀``, initial curvature of the per-measurement loss (module
        docstring). Default 1000 (validation).
    ess : float or None
        IVON's effective sample size ``λ``; sets the temperature to
        ``T = d_y / λ`` for a sinogram of ``d_y`` entries. Default 8
        (validation: the best at 28² and 64², i.e. ``T = 100`` at 28² with
        20 angles and ``T ≈ 680`` at 64² with 60 angles — a strongly tempered
        posterior). None: use :attr:`temperature`.
    temperature : float
        ``T`` of the data and TV terms (``ess = d_y / T``), used when ``ess``
        is None. Default 1 (the untempered posterior).
    prior_precision : float
        ``α`` of the Gaussian weight prior (``weight_decay = α / ess``).
        Default 1.
    beta1, beta2 : float
        IVON's gradient momentum and Hessian averaging. Defaults 0.9 and
        0.99 (a time constant of 100 steps suits a fit of a few hundred).
    mc_samples : int
        Weight samples per IVON step. Default 1.
    clip_radius : float
        Element-wise clip of IVON's preconditioned step. Default 0.01: with
        ``lr · hess_init = 0.3`` the largest step per weight is 0.003.
    n_samples : int
        Weight samples for the mean and std of the output (>= 2). Default 64.
    keep_samples : int
        How many of those output samples to keep in the result (at most
        ``n_samples``). Default 4.
    unclamped : bool
        Evaluate the reconstruction and the samples with the U-net's
        ``sigmoid_saturation`` clamp off (the weights are the same). The
        clamp (±9 before the sigmoid) is a training device; with it, a pixel
        whose pre-activation is below −9 under every weight sample gets the
        value sigmoid(−9) = 1.2e-4 from all of them and a std of exactly 0,
        so its interval misses a true 0 (72 % of the pixels of a 28²
        rectangles phantom, docs/ivon.md). Off, such pixels keep a small,
        positive spread, like the linearised posterior, whose Jacobian passes
        the clamp. Default True.
    start : {'scratch', 'dip'}
        ``'scratch'``: IVON from the U-net's random initialisation (or
        ``dip.init_weights``), the DIP+TV fit done by IVON alone. ``'dip'``:
        the Adam DIP+TV fit of ``dip`` first (:func:`~ctuq.recon.dip.fit_dip`,
        or the ``dip_result`` given to :func:`fit_ivon_dip`), then IVON from
        its weights. Default ``'dip'`` (validation).
    """

    dip: DIPConfig = field(default_factory=DIPConfig)
    iterations: int = 300
    lr: float = 3e-4
    lr_min_factor: float = 0.01
    hess_init: float = 1000.0
    ess: float | None = 8.0
    temperature: float = 1.0
    prior_precision: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    mc_samples: int = 1
    clip_radius: float = 0.01
    n_samples: int = DEFAULT_SAMPLES
    keep_samples: int = 4
    unclamped: bool = True
    start: str = "dip"

    def __post_init__(self):
        if isinstance(self.dip, dict):
            object.__setattr__(self, "dip", DIPConfig.from_dict(self.dip))
        if int(self.iterations) < 1:
            raise InputError(f"must be >= 1, got {self.iterations}", field="iterations")
        if self.ess is not None and not (math.isfinite(self.ess) and self.ess > 0):
            raise InputError(f"must be > 0 or None, got {self.ess!r}", field="ess")
        for name in ("temperature", "prior_precision"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"must be > 0, got {v!r}", field=name)
        if not 0 <= self.lr_min_factor <= 1:
            raise InputError(f"must be in [0, 1], got {self.lr_min_factor!r}",
                             field="lr_min_factor")
        if int(self.n_samples) < 2:
            raise InputError(f"must be >= 2, got {self.n_samples}", field="n_samples")
        if int(self.keep_samples) < 0:
            raise InputError(f"must be >= 0, got {self.keep_samples}", field="keep_samples")
        if self.start not in ("scratch", "dip"):
            raise InputError(f"must be 'scratch' or 'dip', got {self.start!r}", field="start")
        self.settings(100)  # validates the IVON fields

    def with_(self, **changes) -> "IVONDIPConfig":
        """A copy with some fields changed."""
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict) -> "IVONDIPConfig":
        """Inverse of :meth:`to_dict` (e.g. a TOML table); unknown keys raise InputError."""
        extra = set(d) - set(cls.__dataclass_fields__)
        if extra:
            raise InputError(f"unknown IVON-DIP option(s) {sorted(extra)}", field="ivon")
        d = dict(d)
        if d.get("clip_radius") == "inf":
            d["clip_radius"] = math.inf
        return cls(**d)

    def effective_temperature(self, n_measurements: int) -> float:
        """``T``: ``n_measurements / ess`` when :attr:`ess` is set, else :attr:`temperature`."""
        return (float(n_measurements) / float(self.ess) if self.ess is not None
                else float(self.temperature))

    def settings(self, n_measurements: int) -> IVONSettings:
        """The ``ivon.IVON`` settings for a sinogram of ``n_measurements`` entries."""
        return IVONSettings.for_posterior(
            n_measurements, self.prior_precision, self.effective_temperature(n_measurements),
            lr=self.lr,
            hess_init=self.hess_init, beta1=self.beta1, beta2=self.beta2,
            mc_samples=int(self.mc_samples), clip_radius=self.clip_radius)

    def to_dict(self) -> dict:
        """Plain-dict form for result files."""
        d = asdict(self)
        d["dip"] = self.dip.to_dict()
        if math.isinf(d["clip_radius"]):
            d["clip_radius"] = "inf"
        return d


@dataclass
class IVONDIPResult:
    """Outcome of :func:`fit_ivon_dip`.

    Attributes
    ----------
    reconstruction : Tensor, shape (H, W)
        ``f(m)``, the output of the posterior-mean weights (without the clamp
        when ``config.unclamped``).
    std : Tensor, shape (H, W)
        Per-pixel std of ``f(θ_k)`` over the ``n_samples`` weight samples
        (``n_samples − 1`` degrees of freedom).
    sample_mean : Tensor, shape (H, W)
        Mean of ``f(θ_k)``.
    samples : Tensor, shape (min(keep_samples, n_samples), H, W)
        The first few ``f(θ_k)``.
    posterior : DiagonalGaussian
        ``q`` over the U-net's parameters (``parameters()`` order).
    model : UNet
        The network with the mean weights loaded, in eval mode (the
        architecture of the fit, clamp included).
    net_input : Tensor, shape (1, 1, H, W)
    loss_history : dict of ndarray
        ``'loss'``: the DIP+TV loss ``L`` at the sampled weights of every
        step; ``'mean_loss'``: ``L`` at the mean weights every
        ``progress_every`` steps (NaN elsewhere).
    tv_weight : float
        γ.
    noise_std : float
        σ used in the likelihood.
    settings : IVONSettings
        The optimiser's settings (``ess``, ``weight_decay``, ...).
    config : IVONDIPConfig
    fit_seconds, sample_seconds, wall_time : float
        IVON training (with the Adam fit when ``start='dip'`` ran it), sampling
        and total seconds.
    dip : DIPResult or None
        The Adam fit IVON started from (``start='dip'``).
    """

    reconstruction: Tensor
    std: Tensor
    sample_mean: Tensor
    samples: Tensor
    posterior: DiagonalGaussian
    model: UNet
    net_input: Tensor
    loss_history: dict
    tv_weight: float
    noise_std: float
    settings: IVONSettings
    config: IVONDIPConfig
    fit_seconds: float
    sample_seconds: float
    wall_time: float
    dip: DIPResult | None = None

    @property
    def mean(self) -> Tensor:
        """Alias of :attr:`reconstruction`."""
        return self.reconstruction

    def summary(self) -> dict:
        """Settings and timings as a JSON-safe dict (for result files and benchmarks)."""
        return {"method": "ivon-dip", "config": self.config.to_dict(),
                "ivon": self.settings.to_dict(), "tv_weight": self.tv_weight,
                "noise_std": self.noise_std, "fit_seconds": self.fit_seconds,
                "sample_seconds": self.sample_seconds, "wall_time": self.wall_time,
                "final_loss": float(self.loss_history["loss"][-1])}


def _predictor(model: UNet, config: IVONDIPConfig, device) -> UNet:
    """The network that evaluates the reconstruction and the samples: ``model``
    itself, or (``config.unclamped``) a copy without the pre-sigmoid clamp."""
    if not (config.unclamped and model.config.use_sigmoid
            and model.config.sigmoid_saturation is not None):
        return model
    predictor = build_unet(model.config.with_(sigmoid_saturation=None), device="cpu")
    predictor.load_state_dict(model.state_dict())
    return predictor.to(device).eval()


@torch.no_grad()
def ivon_dip_samples(model: UNet, net_input: Tensor, posterior: DiagonalGaussian,
                     n_samples: int, *, seed: int = 0, keep: int = 0
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, std and the first ``keep`` of ``n_samples`` outputs ``f(θ_k)``, ``θ_k ~ q``.

    Returns
    -------
    mean, std : Tensor, shape (H, W)
        float32 (accumulated in float64; std with ``n_samples − 1`` degrees
        of freedom).
    kept : Tensor, shape (keep, H, W)
    """
    was_training = model.training
    model.eval()
    try:
        outs = evaluate_under_samples(model, posterior, lambda m: m(net_input)[0, 0].double(),
                                      int(n_samples), seed=seed)
    finally:
        model.train(was_training)
    return (outs.mean(0).float(), outs.std(0).float(), outs[:int(keep)].float().cpu())


def fit_ivon_dip(y, op, config: IVONDIPConfig | None = None, *,
                 noise_std: float | None = None, dip_result: DIPResult | None = None,
                 progress: Callable | None = None,
                 cancel: Callable[[], bool] | None = None) -> IVONDIPResult:
    """Fit the DIP+TV U-net with IVON and draw the per-pixel std from its weight posterior.

    Parameters
    ----------
    y : array_like or Tensor, shape (n_angles, n_detector)
        The sinogram.
    op : RayTransform
        The forward operator (moved to the fit's device in place).
    config : IVONDIPConfig, optional
        Default ``IVONDIPConfig(dip=DIPConfig.for_image_size(image shape))``.
    noise_std : float, optional
        σ of the Gaussian noise of ``y`` (the likelihood's and the default TV
        weight's); estimated from ``y`` when not given.
    dip_result : DIPResult, optional
        With ``config.start == 'dip'``: an Adam fit of the same sinogram and
        architecture to start from (e.g. the pipeline's); fitted here when
        not given. Ignored for ``start='scratch'``.
    progress : callable, optional
        Stages ``'ivon_dip'`` (every ``dip.progress_every`` steps, with the
        loss at the mean weights) and ``'ivon_samples'``.
    cancel : callable, optional
        Checked before every step; True raises :class:`~ctuq.errors.Cancelled`.

    Returns
    -------
    IVONDIPResult

    Raises
    ------
    InputError
        Bad sinogram, non-positive σ, a loss that is not finite, a bad
        weights file or device.
    """
    from ctuq.recon.baselines import estimate_noise_std

    t0 = time.perf_counter()
    if config is None:
        config = IVONDIPConfig(dip=DIPConfig.for_image_size(op.geometry.image_shape))
    dcfg = config.dip
    device = resolve_device(dcfg.device)
    op = op.to(device)
    y_t = _as_sinogram(y, op, device)
    sigma = float(noise_std) if noise_std is not None else estimate_noise_std(
        y_t.reshape(op.geometry.range_shape).cpu())
    if not (math.isfinite(sigma) and sigma > 0):
        raise InputError(f"noise std must be > 0, got {sigma!r}", field="noise_std")
    gamma = dcfg.resolve_tv_weight(y_t, op, sigma)
    n_meas = int(y_t.numel())
    settings = config.settings(n_meas)
    scale = 1.0 / (2.0 * sigma**2 * n_meas)  # L → ℓ̄, the mean NLL per measurement

    model = build_unet(dcfg.unet_config().with_(dropout=0.0), seed=dcfg.seed, device="cpu")
    if config.start == "dip":
        if dip_result is None:
            dip_result = fit_dip(y_t, op, dcfg, noise_std=sigma, progress=progress,
                                 cancel=cancel)
        try:
            model.load_state_dict(dip_result.state_dict, strict=True)
        except RuntimeError:
            raise InputError("the DIP fit to start from has another U-net architecture",
                             field="dip_result") from None
        log.info("IVON-DIP starts from the Adam fit (best loss %.5g)", dip_result.best_loss)
    elif dcfg.weights_file():  # init_weights, else the warm start's (dip.warm_start)
        load_weights(model, dcfg.weights_file())
        log.info("IVON-DIP warm start from %s", dcfg.weights_file())
    model = model.to(device)
    net_input = make_net_input(y_t, op, dcfg, device, sigma)

    n_iter = int(config.iterations)
    every = int(dcfg.progress_every)
    mean_loss = np.full(n_iter, np.nan)

    def loss_fn(step: int) -> Tensor:
        loss, _, _ = dip_tv_loss(model(net_input), y_t, op, gamma)
        return loss * scale

    def on_step(i: int, sampled: float) -> None:
        if (i + 1) % every == 0 or i + 1 == n_iter:
            with torch.no_grad():
                mean_loss[i] = float(dip_tv_loss(model(net_input), y_t, op, gamma)[0])
            emit_progress(progress, "ivon_dip", i + 1, n_iter,
                          f"loss {mean_loss[i]:.5g} at the mean, {sampled / scale:.5g} sampled")

    log.info("IVON-DIP: %s, %d steps, lr %.3g, h0 %.3g, T %.3g, alpha %.3g, ess %.4g, "
             "gamma %.3g, sigma %.4g, device %s", model.extra_repr(), n_iter, config.lr,
             config.hess_init, config.effective_temperature(n_meas), config.prior_precision,
             settings.ess,
             gamma, sigma, device)
    fit = train_ivon(model, loss_fn, settings, n_iter, lr_schedule="cosine",
                     lr_min_factor=config.lr_min_factor, seed=dcfg.seed + 1, on_step=on_step,
                     cancel=cancel)
    t_fit = time.perf_counter() - t0

    predictor = _predictor(model, config, device)
    with torch.no_grad():
        recon = predictor(net_input)[0, 0].float()
    emit_progress(progress, "ivon_samples", 0, int(config.n_samples), "weight samples")
    mean, std, kept = ivon_dip_samples(predictor, net_input, fit.posterior, config.n_samples,
                                       seed=dcfg.seed + 2, keep=config.keep_samples)
    emit_progress(progress, "ivon_samples", int(config.n_samples), int(config.n_samples),
                  f"{config.n_samples} samples")
    wall = time.perf_counter() - t0
    log.info("IVON-DIP done in %.1f s (fit %.1f s); mean std %.3g", wall, t_fit,
             float(std.mean()))
    return IVONDIPResult(
        reconstruction=recon, std=std, sample_mean=mean, samples=kept,
        posterior=fit.posterior, model=model, net_input=net_input,
        loss_history={"loss": fit.loss_history / scale, "mean_loss": mean_loss},
        tv_weight=gamma, noise_std=sigma, settings=settings, config=config,
        fit_seconds=t_fit, sample_seconds=wall - t_fit, wall_time=wall,
        dip=dip_result if config.start == "dip" else None)


class IVONPosterior(PosteriorHandle):
    """IVON's weight posterior of one reconstruction (``result.posterior`` of a
    ``method = 'ivon'`` reconstruction, :class:`~ctuq.recon.posterior_handle.PosteriorHandle`):
    the posterior samples are ``f(θ_k)`` for fresh ``θ_k ~ q``, their
    fluctuations ``f(θ_k)`` minus their mean.

    Parameters
    ----------
    fit : IVONDIPResult
    seed : int
        Base seed of the draws when no seed is given.
    """

    min_samples = 2

    def __init__(self, fit: IVONDIPResult, *, seed: int = 0):
        super().__init__(fit.reconstruction.detach().cpu().numpy(), seed=seed)
        self.fit = fit
        self._model = _predictor(fit.model, fit.config, fit.net_input.device)

    def posterior_draws(self, n: int, seed: int) -> np.ndarray:
        """``f(θ_k)`` for ``n`` weight samples, ``[n, H, W]``."""
        with torch.no_grad():
            outs = evaluate_under_samples(
                self._model, self.fit.posterior,
                lambda m: m(self.fit.net_input)[0, 0].double(), int(n), seed=int(seed))
        return outs.cpu().numpy()

    def fluctuations(self, n: int, seed: int) -> np.ndarray:
        outs = self.posterior_draws(n, seed)
        return outs - outs.mean(0)


#: IVON's settings in the pipeline (``method = 'ivon'``): the validated defaults
#: (docs/ivon.md §5); ``dip``, ``n_samples`` and ``keep_samples`` are set per run.
PIPELINE_CONFIG = IVONDIPConfig()


def ivon_uncertainty(dip: DIPResult, op, y: Tensor, noise_std: float, unc=None, *,
                     predictive_samples: int | None = None,
                     config: IVONDIPConfig | None = None, seed: int = 0,
                     progress: Callable | None = None,
                     cancel: Callable[[], bool] | None = None) -> dict:
    """The pipeline's IVON stage: IVON from the pipeline's Adam fit.

    :func:`fit_ivon_dip` with ``config`` (default :data:`PIPELINE_CONFIG`,
    the defaults of :class:`IVONDIPConfig` chosen on validation data,
    docs/ivon.md §5), ``start='dip'`` from ``dip`` (its
    :class:`~ctuq.recon.dip.DIPConfig` gives the architecture, TV weight,
    seed and device), ``predictive_samples`` weight samples, all kept.

    Parameters
    ----------
    dip : DIPResult
        The pipeline's Adam DIP+TV fit.
    op : RayTransform
    y : Tensor, shape (n_angles, n_detector)
    noise_std : float
        σ of the likelihood (known or estimated; IVON does not learn it).
    unc : UncertaintyConfig, optional
        Its ``predictive_samples`` and ``ivon`` settings, where
        ``predictive_samples`` and ``config`` are not given.
    predictive_samples : int, optional
        Weight samples (>= 2).
    config : IVONDIPConfig, optional
        IVON's settings (its ``dip``, ``n_samples``, ``keep_samples`` and
        ``start`` are set here).
    seed : int
        Base seed of :meth:`IVONPosterior.sample`'s fresh draws.
    progress, cancel : callable, optional
        Stages ``'ivon_dip'`` and ``'ivon_samples'``.

    Returns
    -------
    dict
        ``fit`` (:class:`IVONDIPResult`), ``reconstruction`` (``f(m)``,
        ``[H, W]``), ``image_samples`` (``f(θ_k)`` minus their mean,
        ``[k, H, W]``), ``samples`` (``f(θ_k)``), ``variance`` (``[H, W]``
        float64 on the CPU, ``n − 1`` degrees of freedom), ``hyperparameters``,
        ``summary`` (:meth:`IVONDIPResult.summary`), ``posterior``
        (:class:`IVONPosterior`) and ``timings`` (seconds of ``ivon`` and
        ``ivon_samples``).
    """
    k = int(predictive_samples if predictive_samples is not None
            else unc.predictive_samples)
    if config is None:
        ivon = getattr(unc, "ivon", None)
        config = PIPELINE_CONFIG if ivon is None else PIPELINE_CONFIG.with_(**asdict(ivon))
    config = config.with_(dip=dip.config, n_samples=k, keep_samples=k, start="dip")
    fit = fit_ivon_dip(y, op, config, noise_std=noise_std, dip_result=dip, progress=progress,
                       cancel=cancel)
    samples = fit.samples.double()
    # IVON's curvature estimate h, from v = 1 / (ess (h + weight_decay))
    hessian = 1.0 / (fit.settings.ess * fit.posterior.variance) - fit.settings.weight_decay
    hyper = {"method": "ivon", "sigma2": float(noise_std) ** 2, "noise_learned": False,
             "tv_weight": float(fit.tv_weight), "ess": float(fit.settings.ess),
             "temperature": config.effective_temperature(int(y.numel())),
             "prior_precision": float(config.prior_precision),
             "weight_decay": float(fit.settings.weight_decay),
             "hessian_median": float(hessian.median()),
             "weight_std_median": float(fit.posterior.std.median()),
             "final_loss": float(fit.loss_history["loss"][-1])}
    return {"fit": fit, "reconstruction": fit.reconstruction.detach(),
            "image_samples": samples - samples.mean(0), "samples": fit.samples,
            "variance": fit.std.double().cpu() ** 2, "hyperparameters": hyper,
            "summary": fit.summary(), "posterior": IVONPosterior(fit, seed=seed),
            "timings": {"ivon": fit.fit_seconds, "ivon_samples": fit.sample_seconds}}
