"""Deep-image-prior reconstruction with TV regularisation (DIP+TV).

A U-net ``f(θ)`` with a fixed input (the FBP of ``y``, or fixed noise) is
fitted to one sinogram (docs/method.md §1)::

    θ̃ = argmin_θ  ‖A f(θ) − y‖² + γ · TV(f(θ))

with the data fit a **sum** of squares and TV the anisotropic total variation
(sum of absolute finite differences). The reference code (``bayes_dip``)
takes the *mean* of the squares; its ``γ_ref`` equals ``γ / d_y`` here
(:attr:`DIPConfig.tv_weight` / number of sinogram entries).

Optimisation: Adam with a cosine-decaying learning rate, gradient-norm
clipping, and the iterate with the lowest loss is returned (weights loaded
into the model). Everything is seeded; on the CPU a seed gives bit-identical
results.

Examples
--------
>>> from ctuq.data.geometry import Geometry
>>> from ctuq.data.operators import RayTransform
>>> from ctuq.data.phantoms import digits
>>> from ctuq.data.simulate import simulate_sinogram
>>> op = RayTransform(Geometry.parallel(28, 20))
>>> y, _ = simulate_sinogram(digits(1)[0], op, 0.05, seed=1)
>>> res = fit_dip(y, op, DIPConfig.for_image_size(28).with_(iterations=20))
>>> tuple(res.reconstruction.shape)
(28, 28)
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ctuq.errors import Cancelled, InputError
from ctuq.fields import setting, validate
from ctuq.models.unet import UNet, UNetConfig, build_unet, preset_name_for_size, unet_preset
from ctuq.recon.baselines import total_variation, tv_reconstruction
from ctuq.recon.flat_parameters import FlatParameters
from ctuq.recon.presets import DIP_DEFAULTS, WARM_START_DEFAULTS
from ctuq.recon.warm_start import check_warm_start, resolve_warm_start
from ctuq.recon.weights_file import WEIGHTS_FORMAT, load_weights, save_weights  # noqa: F401
from ctuq.progress import emit_progress

__all__ = [
    "DIPConfig",
    "DIPResult",
    "fit_dip",
    "dip_tv_loss",
    "total_variation",
    "save_weights",
    "load_weights",
    "resolve_device",
    "AUTO_NET_INPUTS",
    "AUTO_NEEDS_HELDOUT",
]

log = logging.getLogger(__name__)

#: The data terms of :func:`dip_tv_loss` (``dip.loss``).
DIP_LOSSES = ("gaussian", "poisson")
#: ``dip.net_input = AUTO``: the input is chosen among :data:`AUTO_NET_INPUTS` by the
#: held-out fits (:class:`~ctuq.recon.model_error.terms.HeldoutTerm`).
AUTO = "auto"
#: The inputs ``'auto'`` chooses between, the first kept unless another is clearly better.
AUTO_NET_INPUTS = ("fbp", "tv")
#: Why ``'auto'`` is refused without the held-out model error (config and direct fits).
AUTO_NEEDS_HELDOUT = ("'auto' is chosen by the held-out fits: it needs "
                      "uncertainty.model_error = 'heldout'")
#: The choices of ``dip.net_input``.
NET_INPUTS = ("fbp", "tv", "noise", AUTO)


def check_device(value: str) -> str:
    """A device name that exists here: auto, cpu, cuda, cuda:N, mps (ValueError if not)."""
    name = value.strip().lower()
    if name in ("auto", "cpu"):
        return name
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {value!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{value!r} requested but CUDA is not available on this machine "
                             "(use auto or cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{value!r} requested but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
        return name
    if dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"{value!r} requested but MPS is not available")
        return name
    raise ValueError(f"unsupported device {value!r}; use auto, cpu, cuda or cuda:N")


@dataclass(frozen=True)
class DIPConfig:
    """Settings of a DIP+TV fit.

    Build one with :meth:`for_image_size` or :meth:`preset` to get the
    measured defaults, and change fields with :meth:`with_`.

    Parameters
    ----------
    preset : str
        Preset name (architecture :data:`ctuq.models.unet.PRESETS`, defaults
        :mod:`ctuq.recon.presets`).
        Default ``"reference-28"``.
    unet : UNetConfig or None
        Explicit architecture; overrides ``preset`` when given.
    iterations : int
        Adam steps. Default 700 (the ``reference-28`` default).
    lr : float
        Peak learning rate. Default 5e-3 (``reference-28``).
    lr_schedule : {'cosine', 'constant'}
        ``'cosine'`` decays the learning rate from ``lr`` to
        ``lr * lr_min_factor`` over ``iterations`` (after ``warmup``
        linear steps). Default ``'cosine'``.
    lr_min_factor : float
        Final learning rate relative to ``lr``. Default 0.01.
    warmup : int
        Linear warm-up steps. Default 0.
    tv_weight : float or None
        γ, the weight of the anisotropic TV term (sum-of-squares data fit).
        Default None: ``γ = tv_weight_factor · σ · r`` with ``σ`` the noise
        std (given to :func:`fit_dip`, else estimated from ``y``) and ``r``
        the root-mean-square column norm of ``A``, the scale of the
        baseline TV's default (:func:`ctuq.recon.baselines.default_tv_weight`),
        so one factor suits every image size, angle count and noise level.
    tv_weight_factor : float
        See ``tv_weight``. Default 0.3 (``reference-28``; 1.0 for the larger
        presets; measured, docs/dip.md).
    clip_grad_norm : float or None
        Clip the gradient norm to this value (reference: 1). Default 1.
    net_input : {'fbp', 'tv', 'noise', 'auto'}
        The fixed network input: the FBP of ``y`` (reference), the TV
        reconstruction of ``y`` at its default weight
        (:func:`~ctuq.recon.baselines.tv_reconstruction`, 1000 PDHG
        iterations; docs/dip.md §14), or ``noise_std * randn``; ``'auto'``:
        the TV input where its held-out fit predicts the left-out angles
        clearly better than the FBP input's (a paired t-test over the
        angles), else the FBP (only in a run with the held-out model error,
        which makes those fits; docs/dip.md §15). Default ``'fbp'``.
    noise_std : float
        Std of the noise input. Default 0.1.
    seed : int
        Seed of the weight initialisation, the noise input and dropout.
        Default 0.
    device : str
        ``'auto'`` (CUDA when available), ``'cpu'``, ``'cuda'``, ``'cuda:1'``...
        Default ``'auto'``.
    progress_every : int
        Iterations between progress reports. Default 1 (every iteration: the
        consumers throttle by time).
    init_weights : str or None
        Warm start from a weights file written by :func:`save_weights`
        (architecture must match). Default None (random initialisation).
    cuda_graph : bool
        On a CUDA device, capture one DIP step (forward, loss, backward,
        best-iterate bookkeeping, clipping, Adam) in a CUDA graph after three
        plain steps and replay it: the host then launches one graph per
        iteration instead of some 400 kernels (docs/scaling.md §5). Falls
        back to the plain loop, with a warning, if the capture fails.
        Ignored on the CPU. Default True.
    warm_start : str
        The educated warm start (:mod:`ctuq.recon.warm_start`): ``'none'``,
        ``'shipped'`` (the preset's pretrained weights shipped with ctuq) or
        a weights file. :meth:`preset_defaults` then applies the preset's
        warm-start learning rate and iterations
        (:data:`ctuq.recon.presets.WARM_START_DEFAULTS`) unless given.
        Exclusive with ``init_weights``. Default ``'none'``.
    dropout : float
        Dropout2d probability after every 3×3 conv (MC dropout). Default 0.
    loss : {'gaussian', 'poisson'}
        The data term (:func:`dip_tv_loss`). ``'gaussian'`` (default): the
        (weighted) sum of squares ``Σ (A x − y)² / v`` (``v ≡ 1`` without a
        per-ray variance). ``'poisson'``: the Poisson deviance of the counts
        in its line-integral form ``Σ 2 (e^r − 1 − r) / v``, ``r = y − A x``
        (count data only: it needs the per-ray variance ``v`` of the count
        noise model).
    """

    preset: str = setting("reference-28", kind=str, doc="U-net preset name.")
    unet: UNetConfig | None = None
    iterations: int = setting(DIP_DEFAULTS["reference-28"]["iterations"], kind=int, minimum=1,
                              maximum=10_000_000, doc="Adam steps.")
    lr: float = setting(DIP_DEFAULTS["reference-28"]["lr"], kind=float, greater_than=0,
                        maximum=10.0, doc="Peak learning rate.")
    lr_schedule: str = setting("cosine", kind=str, choices=("cosine", "constant"),
                               doc="Learning-rate schedule.")
    lr_min_factor: float = setting(0.01, kind=float, minimum=0, maximum=1,
                                   doc="Final learning rate relative to lr.")
    warmup: int = setting(0, kind=int, minimum=0, maximum=10_000_000,
                          doc="Linear warm-up steps.")
    tv_weight: float | None = setting(None, kind=float, minimum=0, maximum=1e30,
                                      doc="TV weight (default: from the noise level).")
    tv_weight_factor: float = setting(DIP_DEFAULTS["reference-28"]["tv_weight_factor"],
                                      kind=float, minimum=0, maximum=1e6,
                                      doc="TV weight = factor x noise std x column norm.")
    clip_grad_norm: float | None = setting(1.0, kind=float, greater_than=0, maximum=1e30,
                                           optional=True, doc="Gradient-norm clip.")
    net_input: str = setting("fbp", kind=str, choices=NET_INPUTS,
                             doc="Fixed network input: fbp, tv, noise, or auto (tv where "
                                 "it predicts held-out projections clearly better).")
    noise_std: float = setting(0.1, kind=float, minimum=0, maximum=1e6,
                               doc="Std of the noise input.")
    seed: int = setting(0, kind=int, minimum=0, maximum=2**63 - 1, doc="Seed of the fit.")
    device: str = setting("auto", kind=str, check=check_device, doc="auto, cpu, cuda, cuda:N.")
    progress_every: int = setting(1, kind=int, minimum=1,
                                  doc="Iterations between progress reports.")
    init_weights: str | None = setting(None, kind=str, doc="Warm-start weights file.")
    dropout: float = setting(0.0, kind=float, minimum=0, maximum=0.999,
                             doc="Dropout probability (MC dropout).")
    loss: str = setting("gaussian", kind=str, choices=DIP_LOSSES,
                        doc="Data term: gaussian (weighted least squares) or poisson "
                            "(count data).")
    warm_start: str = setting("none", kind=str, check=check_warm_start,
                              doc="Warm start: none, shipped (pretrained) or a weights file.")
    cuda_graph: bool = setting(True, kind=bool,
                               doc="On CUDA, replay the DIP step as a CUDA graph.")

    def __post_init__(self):
        if isinstance(self.unet, dict):
            object.__setattr__(self, "unet", UNetConfig.from_dict(self.unet))
        validate(self, prefix="dip")
        if self.unet is None:
            try:
                unet_preset(self.preset)  # validates the name
            except InputError as err:
                raise InputError(err.message, field="dip.preset") from None
        if self.init_weights and self.warm_start != "none":
            raise InputError("give either init_weights or warm_start, not both",
                             field="dip.warm_start")

    # -- constructors ---------------------------------------------------------
    @classmethod
    def preset_defaults(cls, name: str, **changes) -> "DIPConfig":
        """The measured defaults of preset ``name`` (:data:`ctuq.recon.presets.DIP_DEFAULTS`)."""
        unet_preset(name)
        defaults = dict(DIP_DEFAULTS.get(name, {}))
        if check_warm_start(changes.get("warm_start", "none")) != "none":
            defaults.update(WARM_START_DEFAULTS.get(name, {}))
        return cls(preset=name, **{**defaults, **changes})

    @classmethod
    def for_image_size(cls, image_size, **changes) -> "DIPConfig":
        """Measured defaults for the preset matching an image side or shape."""
        return cls.preset_defaults(preset_name_for_size(image_size), **changes)

    def with_(self, **changes) -> "DIPConfig":
        """A copy with some fields changed."""
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict) -> "DIPConfig":
        """Inverse of :meth:`to_dict` (e.g. a TOML table); unknown keys raise InputError."""
        extra = set(d) - set(cls.__dataclass_fields__)
        if extra:
            raise InputError(f"unknown DIP option(s) {sorted(extra)}", field="dip")
        return cls(**d)

    # -- derived --------------------------------------------------------------
    def unet_config(self) -> UNetConfig:
        """The architecture, with :attr:`dropout` applied."""
        cfg = self.unet if self.unet is not None else unet_preset(self.preset)
        if self.dropout != cfg.dropout:
            cfg = cfg.with_(dropout=float(self.dropout))
        return cfg

    def resolve_tv_weight(self, y, op, noise_std: float | None = None) -> float:
        """γ for sinogram ``y``: :attr:`tv_weight`, or ``tv_weight_factor · σ · r``.

        ``σ`` is ``noise_std`` when given, else
        :func:`~ctuq.recon.baselines.estimate_noise_std` of ``y``.
        """
        if self.tv_weight is not None:
            return float(self.tv_weight)
        from ctuq.recon.baselines import estimate_noise_std, rms_column_norm

        sigma = float(noise_std) if noise_std is not None else estimate_noise_std(
            torch.as_tensor(y).reshape(op.geometry.range_shape).cpu())
        return float(self.tv_weight_factor) * sigma * rms_column_norm(op)

    def weights_file(self) -> str | None:
        """The file the fit starts from: :attr:`init_weights`, else :attr:`warm_start`'s, else None."""
        if self.init_weights:
            return self.init_weights
        return resolve_warm_start(self.warm_start, self.preset)

    def to_dict(self) -> dict:
        """Plain-dict form for result files (the architecture spelled out)."""
        d = asdict(self)
        d["unet"] = self.unet_config().to_dict()
        return d


@dataclass
class DIPResult:
    """Outcome of :func:`fit_dip`.

    Attributes
    ----------
    model : UNet
        The network with the lowest-loss weights loaded, in eval mode.
    net_input : Tensor
        The fixed input, ``[1, 1, H, W]``.
    reconstruction : Tensor
        ``f(θ̃)``, the output of the lowest-loss iterate, ``[H, W]``
        (for a dropout network: the deterministic eval-mode output).
    loss_history : dict of ndarray
        ``'loss'``, ``'data_fit'``, ``'tv'`` per iteration, float64.
    best_iteration : int
        Index of the lowest-loss iterate (its loss is ``loss_history['loss'][best_iteration]``).
    best_loss : float
    tv_weight : float
        The γ used (see :meth:`DIPConfig.resolve_tv_weight`).
    wall_time : float
        Seconds spent in the fit.
    state_dict : dict
        The best weights (CPU tensors), as loaded into ``model``.
    config : DIPConfig
    """

    model: UNet
    net_input: Tensor
    reconstruction: Tensor
    loss_history: dict
    best_iteration: int
    best_loss: float
    tv_weight: float
    wall_time: float
    state_dict: dict
    config: DIPConfig

    def save_weights(self, path) -> None:
        """Write the best weights to ``path`` (see :func:`save_weights`)."""
        save_weights(self.model, path)


# ------------------------------------------------------------------------------
# helpers


def resolve_device(device) -> torch.device:
    """``'auto'`` → CUDA when available, else CPU; anything else as given."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError("CUDA was requested but is not available", field="device")
    return dev


def _as_sinogram(y, op, device) -> Tensor:
    y = torch.as_tensor(y, dtype=torch.float32)
    shape = tuple(op.geometry.range_shape)
    if tuple(y.shape[-2:]) != shape or y.numel() != math.prod(shape):
        raise InputError(f"sinogram shape {tuple(y.shape)} does not match the geometry's "
                         f"{shape}", field="sinogram")
    if not torch.isfinite(y).all():
        raise InputError("sinogram contains NaN or infinite values", field="sinogram")
    return y.reshape(1, 1, *shape).to(device)


def lr_factor(config: DIPConfig) -> Callable[[int], float]:
    """The learning-rate schedule of a fit: ``factor(i)``, step ``i``'s rate over ``config.lr``.

    Linear warm-up over ``config.warmup`` steps, then constant or a cosine
    decay from 1 to ``config.lr_min_factor`` at ``config.iterations``.
    """
    n, warm, floor = int(config.iterations), int(config.warmup), float(config.lr_min_factor)

    def factor(i: int) -> float:
        if warm > 0 and i < warm:
            return (i + 1) / warm
        if config.lr_schedule == "constant":
            return 1.0
        t = (i - warm) / max(1, n - warm)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))

    return factor


def make_net_input(y: Tensor, op, config: DIPConfig, device,
                   noise_std: float | None = None) -> Tensor:
    """The fixed network input ``[1, 1, H, W]``: FBP or TV reconstruction of ``y``, or
    seeded noise (:attr:`DIPConfig.net_input`).

    ``noise_std``: the noise std of ``y``, for the TV weight (estimated from ``y`` when
    None; only ``'tv'`` uses it). ``'auto'`` is chosen by the held-out fits before a fit
    runs (:mod:`ctuq.recon.model_error.shared`) and refused here.
    """
    if config.net_input == AUTO:
        raise InputError(AUTO_NEEDS_HELDOUT, field="dip.net_input")
    if config.net_input in ("fbp", "tv"):
        with torch.no_grad():
            y = y.reshape(op.geometry.range_shape)
            x = (op.fbp(y) if config.net_input == "fbp"
                 else tv_reconstruction(y, op, noise_std=noise_std))
        return x.reshape(1, 1, *op.geometry.image_shape).to(device).float()
    gen = torch.Generator().manual_seed(int(config.seed))
    noise = config.noise_std * torch.randn(1, 1, *op.geometry.image_shape, generator=gen)
    return noise.to(device)


# ------------------------------------------------------------------------------
# the fit


def dip_tv_loss(image: Tensor, y: Tensor, op, tv_weight: float, *,
                ray_variance: Tensor | None = None,
                loss: str = "gaussian") -> tuple[Tensor, Tensor, Tensor]:
    """The DIP+TV objective ``D(A x, y) + γ · TV(x)`` and its two terms.

    The data term ``D`` (``r = y − A x``, ``v`` the per-ray relative noise
    variance, mean 1; ``v ≡ 1`` when ``ray_variance`` is None):

    - ``'gaussian'``: ``Σ r² / v``, the weighted least squares of the noise
      ``σ² v`` (twice ``σ²`` times the negative log-likelihood, so ``γ``
      keeps its meaning); ``‖A x − y‖²`` without ``v``, computed as before;
    - ``'poisson'``: ``Σ 2 (e^{r} − 1 − r) / v``, the Poisson deviance of
      the counts ``I = (F̄ − D̄) e^{−A x} + D̄`` written on the line
      integrals (its line-integral form): with ``n_i = (F̄ − D̄) e^{−y_i}``
      the measured dark-corrected counts, the deviance is
      ``2 Σ n_i (e^{r_i} − 1 − r_i)``, and ``n_i ≈ 1/(σ² v_i)`` (the
      delta-method variance is about one over the counts), times ``σ²``.
      Its second-order expansion is the Gaussian term; it weighs large
      residuals of the dense rays by the exact Poisson shape. ``r`` is
      capped at 30 so that ``e^r`` stays finite in the first iterations.

    Parameters
    ----------
    image : Tensor, shape (..., H, W)
        ``x``: the network output (``[1, 1, H, W]`` in the fit) or any image.
    y : Tensor
        The sinogram, shaped like ``op(image)`` (or broadcastable to it).
    op : RayTransform
    tv_weight : float
        ``γ``.
    ray_variance : Tensor, optional
        ``v``, broadcastable to ``y``. Default None (``v ≡ 1``).
    loss : {'gaussian', 'poisson'}, optional
        Default ``'gaussian'``.

    Returns
    -------
    loss, data_fit, tv : Tensor
        Scalars: ``data_fit + tv_weight · tv``, the data term, and the
        anisotropic TV (:func:`total_variation`, summed over leading axes).
    """
    if loss == "poisson":
        r = (y - op(image)).clamp(max=30.0)
        dev = 2.0 * (torch.expm1(r) - r)
        data_fit = (dev if ray_variance is None else dev / ray_variance).sum()
    elif ray_variance is None:
        data_fit = (op(image) - y).square().sum()
    else:
        data_fit = ((op(image) - y).square() / ray_variance).sum()
    tv = total_variation(image).sum()
    return data_fit + tv_weight * tv, data_fit, tv


#: Plain steps before a CUDA graph is captured (lazy initialisation, Adam's state).
_GRAPH_WARMUP = 3


class _DipFit:
    """The iterations of one DIP fit: a plain loop, and the same step as a CUDA graph.

    Both return ``(history [3, n], best_loss, best_iteration, best_state,
    best_output)`` with the same meaning: the loss, data fit and TV of every
    iteration, and the weights and output of the iteration with the lowest
    loss, taken before that iteration's Adam step.
    """

    def __init__(self, model, net_input, y, ray_variance, op, gamma, config, progress,
                 cancel, stage, monitor):
        self.model, self.net_input, self.y, self.v, self.op = model, net_input, y, ray_variance, op
        self.gamma, self.config, self.stage = gamma, config, stage
        self.progress, self.cancel, self.monitor = progress, cancel, monitor
        self.n_iter = int(config.iterations)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def _optimizer(self, lr, params=None):
        # foreach: one multi-tensor update instead of a loop over the weights (on the CPU
        # too, where torch's default is the loop); the same numbers bit for bit
        params = self.model.parameters() if params is None else params
        return torch.optim.Adam(params, lr=lr, foreach=True, capturable=isinstance(lr, Tensor))

    def _loss(self):
        out = self.model(self.net_input)
        loss, data_fit, tv = dip_tv_loss(out, self.y, self.op, self.gamma,
                                         ray_variance=self.v, loss=self.config.loss)
        loss.backward()
        return out, torch.stack([loss.detach(), data_fit.detach(), tv.detach()])

    def _clip(self, flat: FlatParameters | None = None):
        # over the flat buffers when the loop has them: the same numbers, one kernel
        if self.config.clip_grad_norm is None:
            return
        max_norm = float(self.config.clip_grad_norm)
        if flat is not None:
            flat.clip_grad_norm_(max_norm)
        else:
            torch.nn.utils.clip_grad_norm_(self.params, max_norm=max_norm)

    def _report(self, i, hist, best_loss, best_iter, best_out):
        emit_progress(self.progress, self.stage, i + 1, self.n_iter,
                      f"loss {hist[0, i]:.5g} (data {hist[1, i]:.5g}, TV {hist[2, i]:.5g}); "
                      f"best {best_loss:.5g} at {best_iter}")
        if self.monitor is not None:
            self.monitor(i + 1, best_out.reshape(self.op.geometry.image_shape))

    def _check_cancel(self, i):
        if self.cancel is not None and self.cancel():
            raise Cancelled(f"DIP cancelled at iteration {i} of {self.n_iter}")

    def run_plain(self):
        """One host-driven step per iteration (the CPU path; bit-identical per seed).

        The weights and gradients are views into two buffers while it runs
        (:class:`~ctuq.recon.flat_parameters.FlatParameters`): Adam, the clipping and
        the best-iterate copy then run over one tensor each, with the same numbers.
        """
        n_iter, every = self.n_iter, int(self.config.progress_every)
        flat = FlatParameters(self.model)
        optimizer = self._optimizer(self.config.lr, flat.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(self.config))
        buffers = dict(self.model.named_buffers())  # none in the U-nets; kept if a model has
        hist = np.zeros((3, n_iter), dtype=np.float64)
        best_loss, best_iter, best_weights, best_buffers, best_out = math.inf, -1, None, {}, None
        try:
            for i in range(n_iter):
                self._check_cancel(i)
                flat.zero_grad()
                out, values = self._loss()
                # one device synchronisation per iteration instead of three
                hist[:, i] = values.tolist()
                lv = float(hist[0, i])
                if not math.isfinite(lv):
                    log.warning("DIP loss is not finite at iteration %d; stopping early", i)
                    hist = hist[:, : i + 1]
                    break
                if lv < best_loss:
                    best_loss, best_iter = lv, i
                    if best_weights is None:
                        best_weights = flat.weights.detach().clone()
                        best_buffers = {k: v.detach().clone() for k, v in buffers.items()}
                        best_out = out.detach().clone()
                    else:  # copied into the same buffers: no allocation per improvement
                        best_weights.copy_(flat.weights.detach())
                        for k, v in buffers.items():
                            best_buffers[k].copy_(v)
                        best_out.copy_(out.detach())
                self._clip(flat)
                optimizer.step()
                scheduler.step()
                if (i + 1) % every == 0 or i + 1 == n_iter:
                    self._report(i, hist, best_loss, best_iter, best_out)
        finally:
            flat.release()
        if best_weights is None:
            return hist, best_loss, best_iter, None, best_out
        state = {**flat.state_dict(best_weights), **best_buffers}
        best_state = {k: state[k] for k in self.model.state_dict()}  # state_dict's order
        return hist, best_loss, best_iter, best_state, best_out

    def run_graphed(self, graph: bool = True):
        """The same iterations with no host synchronisation inside a step.

        The step keeps its own books on the device (the history row, the best
        loss, iteration, weights and output, selected with ``torch.where``)
        and the learning rate is a device tensor, so the step can be captured
        once in a CUDA graph and replayed. The host reads the books only at
        progress reports and at the end. ``graph=False`` runs the step without
        capturing it (the CPU test of its bookkeeping against :meth:`run_plain`).
        """
        n_iter, every, config = self.n_iter, int(self.config.progress_every), self.config
        device = self.net_input.device
        factor = lr_factor(config)
        lr = torch.tensor(float(config.lr) * factor(0), device=device) if graph else config.lr
        optimizer = self._optimizer(lr)
        live = list(self.model.state_dict().values())
        best = [v.clone() for v in live]
        hist_t = torch.zeros((3, n_iter), dtype=torch.float32, device=device)
        it = torch.zeros(1, dtype=torch.long, device=device)
        best_loss_t = torch.full((), math.inf, device=device)
        best_iter_t = torch.full((1,), -1, dtype=torch.long, device=device)
        best_out = torch.zeros_like(self.net_input)

        def step():
            out, values = self._loss()
            hist_t.index_copy_(1, it, values.unsqueeze(1))
            improved = values[0] < best_loss_t  # False for NaN: a NaN never becomes best
            best_loss_t.copy_(torch.where(improved, values[0], best_loss_t))
            best_iter_t.copy_(torch.where(improved, it, best_iter_t))
            for dst, src in zip(best, live):
                dst.copy_(torch.where(improved, src, dst))
            best_out.copy_(torch.where(improved, out.detach(), best_out))
            self._clip()
            optimizer.step()
            it.add_(1)

        def set_lr(i):
            value = float(config.lr) * factor(i)
            for group in optimizer.param_groups:
                if isinstance(group["lr"], Tensor):
                    group["lr"].fill_(value)
                else:
                    group["lr"] = value

        hist = np.zeros((3, n_iter), dtype=np.float64)
        copied = 0

        def books(i):  # the history up to iteration i on the host (synchronises)
            nonlocal copied
            hist[:, copied: i + 1] = hist_t[:, copied: i + 1].cpu().numpy()
            bad = np.flatnonzero(~np.isfinite(hist[0, copied: i + 1]))
            bad = copied + int(bad[0]) if bad.size else None
            copied = i + 1
            return hist[:, : i + 1], bad

        replay = None
        if graph:  # plain steps on a side stream first, as torch.cuda.graphs asks
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for i in range(_GRAPH_WARMUP):
                    self._check_cancel(i)
                    set_lr(i)
                    optimizer.zero_grad(set_to_none=True)
                    step()
            torch.cuda.current_stream(device).wait_stream(side)
            cuda_graph = torch.cuda.CUDAGraph()
            optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(cuda_graph):
                step()
            replay, start = cuda_graph.replay, _GRAPH_WARMUP
        else:
            start = 0

        last = n_iter - 1
        for i in range(start, n_iter):
            self._check_cancel(i)
            set_lr(i)
            if replay is not None:
                replay()
            else:
                optimizer.zero_grad(set_to_none=True)
                step()
            if (i + 1) % every == 0 or i + 1 == n_iter:
                h, bad = books(i)
                if bad is not None:
                    log.warning("DIP loss is not finite at iteration %d; stopping early", bad)
                    last = bad
                    break
                self._report(i, h, float(best_loss_t), int(best_iter_t), best_out)
        hist = hist[:, : last + 1]  # the last iteration always reports: books() copied it
        best_iter = int(best_iter_t)
        if best_iter < 0:
            return hist, math.inf, -1, None, None
        state = dict(zip(self.model.state_dict().keys(), best))
        return hist, float(best_loss_t), best_iter, state, best_out


def fit_dip(y, op, config: DIPConfig | None = None, *, noise_std: float | None = None,
            ray_variance=None, progress: Callable | None = None,
            cancel: Callable[[], bool] | None = None,
            stage: str = "dip", net_input: Tensor | None = None,
            monitor: Callable[[int, Tensor], None] | None = None,
            init_state: dict | None = None) -> DIPResult:
    """Fit the DIP+TV U-net to a sinogram.

    Parameters
    ----------
    y : array_like or Tensor, shape (n_angles, n_detector)
        The measured sinogram (leading singleton axes are accepted).
    op : RayTransform
        The forward operator; it is moved to the fit's device in place.
    config : DIPConfig, optional
        Settings; default ``DIPConfig.for_image_size(op.geometry.image_shape)``.
    noise_std : float, optional
        The noise std of ``y``, used for the default TV weight; estimated
        from ``y`` when not given (ignored when ``config.tv_weight`` is set).
        With a per-ray variance, ``σ`` of ``σ² v``.
    ray_variance : array_like or Tensor, optional
        ``v``, the per-ray relative noise variance (mean 1, the sinogram's
        shape) of the count noise model: the data term weighs ray ``i`` by
        ``1 / v_i`` (:func:`dip_tv_loss`). Default None (every ray alike; bit
        for bit the unweighted fit). Needed by ``config.loss = 'poisson'``.
    progress : callable, optional
        Called every ``config.progress_every`` iterations and at the end as
        ``progress(stage=, step=, total=, message=)`` or with a
        :class:`~ctuq.progress.ProgressEvent`.
    cancel : callable, optional
        Checked before every iteration; returning True raises
        :class:`~ctuq.errors.Cancelled`.
    stage : str
        Stage name used in progress events. Default ``"dip"``.
    net_input : Tensor, shape (1, 1, H, W) or (H, W), optional
        The fixed network input instead of ``config.net_input``'s (e.g. an FBP
        computed differently). Default None.
    monitor : callable, optional
        Called as ``monitor(iteration, image)`` together with each progress
        event, with the image (``[H, W]``, detached) of the lowest-loss iterate
        so far, i.e. what the fit would return if it stopped there (a live
        view, or a benchmark's PSNR against the iteration count). Default None.
    init_state : dict, optional
        Weights to continue from (a :attr:`DIPResult.state_dict` of the same
        architecture), instead of the seeded initialisation; the optimiser
        and its schedule start afresh. Default None.

    Returns
    -------
    DIPResult

    Raises
    ------
    InputError
        Bad sinogram shape or values, bad weights file, unavailable device.
    Cancelled
        When ``cancel()`` returned True.
    """
    t0 = time.perf_counter()
    if config is None:
        config = DIPConfig.for_image_size(op.geometry.image_shape)
    device = resolve_device(config.device)
    op = op.to(device)
    y_t = _as_sinogram(y, op, device)
    v_t = None
    if ray_variance is not None:
        v_t = _as_sinogram(ray_variance, op, device)
        if not bool((v_t > 0).all()):
            raise InputError("must be positive", field="ray_variance")
    elif config.loss == "poisson":
        raise InputError("the Poisson loss needs count data: line integrals derived from "
                         "photon counts (raw data with flat frames) and noise_model = "
                         "'counts' or 'auto'", field="dip.loss")
    n_iter = int(config.iterations)
    gamma = config.resolve_tv_weight(y_t, op, noise_std)

    model = build_unet(config.unet_config(), seed=config.seed, device="cpu")
    weights = config.weights_file()
    if weights:
        load_weights(model, weights)
        log.info("DIP warm start from %s", weights)
    if init_state is not None:  # a continued fit (the shared held-out fit's weights)
        model.load_state_dict(init_state)
    model = model.to(device)
    if net_input is None:
        net_input = make_net_input(y_t, op, config, device, noise_std)
    else:
        net_input = torch.as_tensor(net_input, dtype=torch.float32).reshape(
            1, 1, *op.geometry.image_shape).to(device)

    fit = _DipFit(model, net_input, y_t, v_t, op, gamma, config, progress, cancel, stage,
                  monitor)
    log.info("DIP fit: %s, %d iterations, lr %.3g, gamma %.3g, input %s, device %s",
             model.extra_repr(), n_iter, config.lr, gamma, config.net_input, device)
    cuda_devices = [device] if device.type == "cuda" else []
    # dropout masks come from the global RNG, seeded here; without dropout it is left
    # alone (fits side by side on threads share it: ctuq.recon.provenance.side_by_side)
    with (torch.random.fork_rng(devices=cuda_devices) if config.dropout
          else contextlib.nullcontext()):
        if config.dropout:
            torch.manual_seed(int(config.seed) + 1)
        model.train()
        if device.type == "cuda" and config.cuda_graph and n_iter > _GRAPH_WARMUP:
            initial = {k: v.clone() for k, v in model.state_dict().items()}
            try:
                hist, best_loss, best_iter, best_state, best_out = fit.run_graphed()
            except Cancelled:
                raise
            except Exception as err:  # noqa: BLE001 - any capture failure: the plain loop
                log.warning("DIP: CUDA graph capture failed (%s: %s); running the plain "
                            "loop", type(err).__name__, err)
                torch.cuda.synchronize(device)
                model.load_state_dict(initial)
                if config.dropout:
                    torch.manual_seed(int(config.seed) + 1)
                hist, best_loss, best_iter, best_state, best_out = fit.run_plain()
        else:
            hist, best_loss, best_iter, best_state, best_out = fit.run_plain()

    if best_state is None:
        raise InputError("DIP fit produced no finite loss (check the sinogram scale)",
                         field="sinogram")
    model.load_state_dict(best_state)
    model.eval()
    if config.dropout > 0:
        with torch.no_grad():
            best_out = model(net_input)
    recon = best_out.reshape(op.geometry.image_shape)
    wall = time.perf_counter() - t0
    log.info("DIP fit done in %.1f s: best loss %.5g at iteration %d", wall, best_loss, best_iter)
    return DIPResult(
        model=model,
        net_input=net_input,
        reconstruction=recon,
        loss_history={"loss": hist[0].copy(), "data_fit": hist[1].copy(), "tv": hist[2].copy()},
        best_iteration=best_iter,
        best_loss=best_loss,
        tv_weight=gamma,
        wall_time=wall,
        state_dict={k: v.cpu() for k, v in best_state.items()},
        config=config,
    )
