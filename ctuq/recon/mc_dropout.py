"""MC-dropout DIP, the baseline of the papers.

The DIP U-net gets ``Dropout2d(p)`` after every 3×3 convolution (reference
p = 0.05), is fitted exactly like DIP+TV (:func:`ctuq.recon.dip.fit_dip`,
dropout active during training), and the predictive mean and standard
deviation are taken over ``n_samples`` stochastic forward passes with dropout
kept active. In the pipeline: ``[uncertainty] method = "mc-dropout"``
(:mod:`ctuq.recon.methods.mc_dropout`).

Examples
--------
>>> from ctuq.data.geometry import Geometry
>>> from ctuq.data.operators import RayTransform
>>> from ctuq.data.phantoms import digits
>>> from ctuq.data.simulate import simulate_sinogram
>>> from ctuq.recon.dip import DIPConfig
>>> op = RayTransform(Geometry.parallel(28, 20))
>>> y, _ = simulate_sinogram(digits(1)[0], op, 0.05, seed=1)
>>> res = fit_mc_dropout(y, op, DIPConfig(iterations=10), n_samples=8)
>>> tuple(res.mean.shape), tuple(res.std.shape)
((28, 28), (28, 28))
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from ctuq.errors import Cancelled, InputError
from ctuq.recon.dip import DIPConfig, DIPResult, fit_dip
from ctuq.progress import emit_progress

__all__ = ["MCDropoutResult", "fit_mc_dropout", "mc_dropout_predict", "enable_dropout",
           "DEFAULT_DROPOUT", "DEFAULT_SAMPLES"]

log = logging.getLogger(__name__)

#: Dropout probability of the papers' baseline.
DEFAULT_DROPOUT = 0.05
#: Default number of stochastic passes.
DEFAULT_SAMPLES = 256


@dataclass
class MCDropoutResult:
    """Outcome of :func:`fit_mc_dropout`.

    Attributes
    ----------
    mean : Tensor
        Predictive mean over the stochastic passes, ``[H, W]`` (the
        reconstruction of this method).
    std : Tensor
        Predictive standard deviation, ``[H, W]``.
    n_samples : int
    dip : DIPResult
        The fit of the dropout network (its ``reconstruction`` is the
        deterministic, dropout-off output).
    samples : Tensor or None
        ``[n_samples, H, W]`` when requested with ``keep_samples=True``.
    wall_time : float
        Seconds for fit and sampling together.
    """

    mean: Tensor
    std: Tensor
    n_samples: int
    dip: DIPResult
    samples: Tensor | None
    wall_time: float

    @property
    def reconstruction(self) -> Tensor:
        """Alias of :attr:`mean`."""
        return self.mean


def enable_dropout(model: nn.Module) -> nn.Module:
    """Put the model in eval mode but its dropout layers in train mode."""
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.train()
    return model


@torch.no_grad()
def mc_dropout_predict(model: nn.Module, net_input: Tensor, n_samples: int = DEFAULT_SAMPLES,
                       *, batch_size: int = 16, seed: int = 0, keep_samples: bool = False,
                       progress: Callable | None = None, cancel: Callable[[], bool] | None = None,
                       stage: str = "mc_dropout"):
    """Mean and std of ``n_samples`` dropout-active forward passes.

    Parameters
    ----------
    model : nn.Module
        A network with dropout layers.
    net_input : Tensor
        ``[1, C, H, W]``.
    n_samples : int
        Number of passes (>= 2). Default :data:`DEFAULT_SAMPLES`.
    batch_size : int
        Passes evaluated together (each batch element gets its own masks).
        Default 16.
    seed : int
        Seed of the dropout masks (the global RNG is restored afterwards).
    keep_samples : bool
        Also return the samples ``[n_samples, H, W]`` (CPU). Default False.
    progress, cancel : callable, optional
        As in :func:`~ctuq.recon.dip.fit_dip`; progress after each batch.

    Returns
    -------
    mean, std : Tensor
        ``[H, W]`` each (std with ``n_samples − 1`` degrees of freedom).
    samples : Tensor or None
    """
    n_samples = int(n_samples)
    if n_samples < 2:
        raise InputError(f"must be >= 2, got {n_samples}", field="n_samples")
    if not any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()):
        raise InputError("the model has no dropout layers", field="dropout")
    was_training = model.training
    enable_dropout(model)
    device = net_input.device
    cuda_devices = [device] if device.type == "cuda" else []
    s1 = s2 = None
    kept = []
    done = 0
    try:
        with torch.random.fork_rng(devices=cuda_devices):
            torch.manual_seed(int(seed))
            while done < n_samples:
                if cancel is not None and cancel():
                    raise Cancelled(f"MC-dropout sampling cancelled after {done} samples")
                b = min(int(batch_size), n_samples - done)
                out = model(net_input.expand(b, *net_input.shape[1:]))[:, 0].double()
                s1 = out.sum(0) if s1 is None else s1 + out.sum(0)
                s2 = out.square().sum(0) if s2 is None else s2 + out.square().sum(0)
                if keep_samples:
                    kept.append(out.float().cpu())
                done += b
                emit_progress(progress, stage, done, n_samples, f"{done} samples")
    finally:
        model.train(was_training)
    mean = s1 / n_samples
    var = (s2 - n_samples * mean.square()).clamp_min(0) / (n_samples - 1)
    samples = torch.cat(kept) if keep_samples else None
    return mean.float(), var.sqrt().float(), samples


def fit_mc_dropout(y, op, config: DIPConfig | None = None, n_samples: int = DEFAULT_SAMPLES, *,
                   noise_std: float | None = None, dropout: float | None = None,
                   batch_size: int = 16,
                   keep_samples: bool = False, progress: Callable | None = None,
                   cancel: Callable[[], bool] | None = None) -> MCDropoutResult:
    """Fit an MC-dropout DIP and draw its predictive mean and std.

    Parameters
    ----------
    y : array_like or Tensor, shape (n_angles, n_detector)
        The sinogram.
    op : RayTransform
        The forward operator.
    config : DIPConfig, optional
        Fit settings (default: the image size's DIP defaults). Its
        ``dropout`` is used when > 0, otherwise ``dropout`` below.
    n_samples : int
        Stochastic passes. Default :data:`DEFAULT_SAMPLES` (256).
    noise_std : float, optional
        Noise std of ``y`` for the default TV weight (see :func:`fit_dip`).
    dropout : float, optional
        Dropout2d probability; default ``config.dropout`` if > 0, else 0.05.
    batch_size : int
        Passes per batch at prediction. Default 16.
    keep_samples : bool
        Keep the individual samples. Default False.
    progress, cancel : callable, optional
        As in :func:`~ctuq.recon.dip.fit_dip`; stages ``"mc_dropout_fit"``
        and ``"mc_dropout"``.

    Returns
    -------
    MCDropoutResult
    """
    t0 = time.perf_counter()
    if config is None:
        config = DIPConfig.for_image_size(op.geometry.image_shape)
    p = dropout if dropout is not None else (config.dropout if config.dropout > 0
                                             else DEFAULT_DROPOUT)
    if not 0 < p < 1:
        raise InputError(f"must be in (0, 1), got {p}", field="dropout")
    config = config.with_(dropout=float(p))
    dip = fit_dip(y, op, config, noise_std=noise_std, progress=progress, cancel=cancel,
                  stage="mc_dropout_fit")
    mean, std, samples = mc_dropout_predict(
        dip.model, dip.net_input, n_samples, batch_size=batch_size, seed=config.seed + 2,
        keep_samples=keep_samples, progress=progress, cancel=cancel)
    dip.model.eval()
    shape = op.geometry.image_shape
    wall = time.perf_counter() - t0
    log.info("MC dropout (p=%.3g, %d samples) done in %.1f s", p, n_samples, wall)
    return MCDropoutResult(mean=mean.reshape(shape), std=std.reshape(shape),
                           n_samples=int(n_samples), dip=dip,
                           samples=None if samples is None else samples.reshape(-1, *shape),
                           wall_time=wall)
