"""The data scale: every reconstruction runs on data of about unit size.

The DIP's U-net ends in a sigmoid (output in ``(0, 1)``) and its presets
(learning rates, TV-weight factors, the shipped model-error calibrations)
were tuned on images whose values lie in about ``[0, 1]``. Data in physical
units (``0.03 /mm``), rescaled (``×1e-6``), integer counts of line integrals
(values in the hundreds) would otherwise be fitted by a network that cannot
reach them. With ``normalize = true`` (:class:`~ctuq.recon.config.ReconstructionConfig`):

1. :func:`data_scale` computes ``s > 0`` from the data, homogeneous of
   degree 1: ``s(c·y) = c·s(y)`` for ``c > 0`` up to float rounding.
2. The pipeline runs on ``y / s``; every setting that carries the data's
   unit is divided by ``s`` (``noise_std`` of the settings and of the file,
   a fixed ``dip.tv_weight``); the ground truth, when present, too
   (:func:`normalized_sinogram`, :func:`scaled_settings`).
3. Before the metrics, every image-space output is multiplied back
   (:func:`to_data_units`): reconstruction, DIP, FBP, posterior variance
   (``s²``), samples, model-error variance (``s²``), the in-memory posterior
   (:class:`~ctuq.recon.posterior_handle.ScaledPosterior`), the noise std
   (``s``) and the learned ``σ²`` (``s²``). The metrics compare with the
   ground truth in data units; the scale is recorded as ``data_scale`` in
   the effective config.

Settings not divided (they are relative, or live in the network's own
units): ``dip.tv_weight_factor`` (``γ = factor · σ · r`` follows ``σ``),
``dip.noise_std`` (the std of a noise network input, in the network's
input units), learning rates, the Laplace prior variances ``a_b`` (weight
space of the network fitted to ``y / s``; they are reported as fitted),
``predcp_scale``, the IVON and MC-dropout settings, the model-error
coefficients (relative to the posterior std and the edge strength).

Independently of ``normalize``, :func:`check_representable` refuses data
whose FBP is mostly negative (see there): the sigmoid output cannot be
negative at any scale. See docs/method.md §1.2.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from ctuq.errors import InputError

__all__ = ["SCALE_FILTER", "SCALE_PERCENTILE", "SCALE_FACTOR", "data_scale",
           "check_representable", "normalized_sinogram", "scaled_settings", "to_data_units",
           "in_data_units"]

#: The FBP filter of the scale: the ramp without apodisation. A Hann window
#: blurs thin bright features (a Shepp–Logan rim), so its high percentile
#: sits far below the object's maximum (true maximum / P99.5 of the Hann FBP
#: up to 1.81 at 64² on the validation split, 1.0 for plateaus: the ratio
#: depends on the object); the unfiltered ramp keeps them (0.90–1.24 at 64²
#: over 48 validation scans of four families, 1–5 % noise). Noise inflates
#: this FBP's high values, which only lowers the normalised image.
SCALE_FILTER = "Ram-Lak"
#: The percentile of that FBP image that sets the scale: a high value of the
#: object, not of a few hot pixels (0.1 % of them: 4 at 64², 65 at 256²).
SCALE_PERCENTILE = 99.9
#: ``s = SCALE_FACTOR · P99.9(FBP_ramp)``, chosen on the validation split
#: (docs/dip.md §7): the DIP's image is best when the object's maximum sits
#: high in the sigmoid's range (near 1) and much worse when it lies above
#: it (clipped); the true maximum over this percentile is at most 1.24 at
#: 64² (1.11 at 128², 1.46 at 28² where the percentile is the maximum), so
#: the factor 1.25 puts it at or just below 1 on every 64² and 128²
#: validation scan (plateaus, digits and rectangles, near 0.75–0.8).
SCALE_FACTOR = 1.25


def _fbp64(y: torch.Tensor, op, filter_type: str) -> np.ndarray:
    from ctuq.recon.baselines import fbp_reconstruction

    return fbp_reconstruction(y, op, filter_type).detach().cpu().double().numpy()


def _unit_fbp(y: torch.Tensor, op, filter_type: str = "Hann") -> tuple[float, np.ndarray]:
    """``(m, FBP(y / m))`` with ``m = max |y|``: the FBP of data of unit size, so that
    very small or very large data (``×1e-30``) neither underflow nor overflow float32."""
    m = float(y.detach().abs().max().double())
    if not (m > 0 and math.isfinite(m)):
        return 0.0, np.zeros(op.geometry.image_shape)
    return m, _fbp64((y.double() / m).float(), op, filter_type)


def data_scale(y: torch.Tensor, op) -> float:
    """The data scale ``s = SCALE_FACTOR · P_SCALE_PERCENTILE(FBP(y))``, homogeneous of degree 1.

    The FBP with the :data:`SCALE_FILTER` filter.

    Parameters
    ----------
    y : Tensor, shape (n_angles, n_detector)
        Line integrals (any unit).
    op : RayTransform

    Returns
    -------
    float
        ``s`` in the data's image unit (1/mm for line integrals in mm·1/mm);
        0 for all-zero data and not positive for data whose FBP's high values
        are not positive (:func:`check_representable` refuses those first).

    Notes
    -----
    The FBP is linear and a percentile is positively homogeneous, so
    ``s(c·y) = c·s(y)`` for ``c > 0``; the FBP runs on ``y / max|y|`` and the
    result is multiplied back, so this holds to float rounding from ``1e-30``
    to ``1e30``. See :data:`SCALE_FILTER`, :data:`SCALE_PERCENTILE` and
    :data:`SCALE_FACTOR` for the choice.
    """
    m, x = _unit_fbp(y, op, SCALE_FILTER)
    if m == 0:
        return 0.0
    return SCALE_FACTOR * m * float(np.percentile(x, SCALE_PERCENTILE))


def check_representable(y: torch.Tensor, op, *, file=None) -> None:
    """Refuse data whose FBP is mostly negative: no sigmoid network output can fit them.

    "Mostly negative": the negative pixels of the FBP carry more mass than
    the positive ones (``Σ max(−x, 0) > Σ max(x, 0)``). For line integrals
    ``−log(I/I0)`` of a real object the FBP's mass is the object's and its
    negative part is ringing and noise (at most 8 % of the positive mass on
    the 60 validation scans at 28² and 64²); a few negative rays from noise only
    warn (:func:`ctuq.recon.consistency.data_warnings`).

    Raises
    ------
    InputError
        ``field='sinogram'``, naming ``file`` when given.
    """
    m, x = _unit_fbp(y, op)
    if m == 0:
        return  # all zero: refused as constant data by Sinogram.check_signal
    pos, neg = float(np.clip(x, 0, None).sum()), float(np.clip(-x, 0, None).sum())
    if neg > pos:
        raise InputError(
            f"the filtered back-projection of the data is mostly negative ({neg / (pos + neg):.0%}"
            " of its mass): ctuq reconstructs non-negative images from line integrals "
            "-log(I/I0); is the sign flipped, or are these intensities (set raw / --raw)?",
            field="sinogram", file=file)


def normalized_sinogram(sinogram, s: float):
    """``sinogram`` with data, ground truth and ``meta['noise_std']`` divided by ``s``
    (per-ray variances by ``s²``).

    Parameters
    ----------
    sinogram : Sinogram
        One 2-D slice.
    s : float
        The data scale (> 0).

    Returns
    -------
    Sinogram
        Float32 data ``data / s`` (divided in float64); ``meta`` gains
        ``data_scale``; the per-ray :attr:`~ctuq.data.io.Sinogram.variance`
        (when present) is divided by ``s²``.
    """
    from ctuq.data.io import Sinogram

    meta = dict(sinogram.meta)
    if meta.get("noise_std") is not None:
        meta["noise_std"] = float(meta["noise_std"]) / s
    meta["data_scale"] = float(s)
    gt = sinogram.ground_truth
    gt = None if gt is None else (np.asarray(gt, np.float64) / s).astype(np.float32)
    data = (np.asarray(sinogram.data, np.float64) / s).astype(np.float32)
    var = sinogram.variance  # the counts' per-ray variances, in data units squared
    var = None if var is None else (np.asarray(var, np.float64) / s**2).astype(np.float32)
    return Sinogram(data, sinogram.geometry, meta, gt, variance=var)


def scaled_settings(noise_std: float | None, dip_config, s: float):
    """The settings that carry the data's unit, for data divided by ``s``.

    Returns
    -------
    noise_std : float or None
        ``noise_std / s``.
    dip_config : DIPConfig
        With a fixed ``tv_weight`` divided by ``s`` (the loss
        ``‖Ax − y‖² + γ TV(x)`` scales as ``s²`` when ``x`` and ``y`` do,
        ``TV`` as ``s``); ``tv_weight_factor`` needs nothing.
    """
    if dip_config.tv_weight is not None:
        dip_config = replace(dip_config, tv_weight=float(dip_config.tv_weight) / s)
    return (None if noise_std is None else float(noise_std) / s), dip_config


def _scale_sigma2(d: dict, s2: float) -> dict:
    out = dict(d)
    for key in ("sigma2", "noise_var", "initial_sigma2"):
        if isinstance(out.get(key), (int, float)) and not isinstance(out.get(key), bool):
            out[key] = float(out[key]) * s2
    if isinstance(out.get("noise_std"), (int, float)) and not isinstance(out["noise_std"], bool):
        out["noise_std"] = float(out["noise_std"]) * math.sqrt(s2)
    return out


def to_data_units(state) -> None:
    """Multiply a slice's outputs back into data units (in place on the pipeline's state).

    ``state`` is the pipeline's per-slice state (``problem``, ``fbp``, ``dip``,
    ``outcome``, ``model_error``) after the consistency stage, whose whitened
    residual is the same in either unit. Nothing happens when the problem
    was not normalised (``problem.scale`` is 1 and ``problem.data_sinogram``
    None).
    """
    from ctuq.recon.posterior_handle import ScaledPosterior

    p = state.problem
    if p.data_sinogram is None:
        return
    s = float(p.scale)
    s2 = s * s
    state.fbp = state.fbp * s
    d = state.dip
    state.dip = replace(d, reconstruction=d.reconstruction * s, tv_weight=float(d.tv_weight) * s,
                        config=p.data_dip if p.data_dip is not None else d.config)
    out = state.outcome
    mul = (lambda t: None if t is None else t * s)
    state.outcome = replace(
        out, reconstruction=out.reconstruction * s, variance=out.variance * s2,
        samples=mul(out.samples), fluctuations=mul(out.fluctuations),
        noise_var=float(out.noise_var) * s2, posterior=ScaledPosterior(out.posterior, s),
        hyperparameters={**_scale_sigma2(out.hyperparameters or {}, s2), "data_scale": s},
        trace=[_scale_sigma2(t, s2) if isinstance(t, dict) else t for t in out.trace],
        summary={**out.summary, "data_scale": s})
    state.model_error = replace(state.model_error, variance=state.model_error.variance * s2)
    if state.consistency is not None:  # its noise levels too (the residual is unitless)
        state.consistency = {**state.consistency, **{
            k: float(state.consistency[k]) * s2 for k in ("noise_var", "noise_var_method")
            if isinstance(state.consistency.get(k), (int, float))}}
    state.problem = replace(p, sinogram=p.data_sinogram, y=p.y * s,
                            # the problem's own noise-model type (no import of problem here)
                            noise=replace(p.noise, std=float(p.noise.std) * s))


def in_data_units(stage):
    """``stage`` (a function of the slice's state) run after :func:`to_data_units`."""
    def run(state) -> None:
        to_data_units(state)
        stage(state)
    run.__name__ = getattr(stage, "__name__", "stage")
    run.__doc__ = stage.__doc__
    return run
