"""The pipeline's data-consistency stage and the checks of the data before a fit.

:func:`check_consistency` runs after the uncertainty stage: the whitened
residual ``r = (y − A x̂) / σ_ray`` of the reconstruction shown (``x̂``), its χ²
per degree of freedom overall and per angle, and the verdict of
:func:`ctuq.recon.diagnostics.data_consistency` (``dof = m − γ̂`` where the
method reports an effective number of parameters ``γ̂``, e.g. the Laplace
EM's ``gamma_total``; else ``m``, the number of rays). ``σ`` is one the fit
cannot inflate: the problem's noise model (the given σ, else the data's own
estimate from the air beside the object), plus the variance of a quarter-pixel
misregistration at the object's edges, not the noise level the method
learned (a wrong geometry inflates a learned σ² until χ²/dof ≈ 1 hides it;
the ratio learned / data σ² is recorded as a second signal). A misfit marks
the result untrustworthy (``trustworthy = False``): its interval is not
widened. It reads the reconstruction and changes no number of it.

:func:`data_warnings` looks at the data before any fit: angles whose values
contradict their unit, negative line integrals on most rays, integer-typed
line integrals. Each is one ``logging`` warning and one line of the result's
``diagnostics['warnings']``.

See docs/consistency.md and docs/method.md §8.4 for what the check does and does not
cover.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from ctuq.recon.diagnostics import (MISFIT_THRESHOLD, MISREGISTRATION_PX, check_angle_unit,
                                    data_consistency, misregistration_variance)

log = logging.getLogger(__name__)

__all__ = ["check_consistency", "data_warnings", "combine_slices", "auto_center",
           "NEGATIVE_FRACTION", "MIN_CENTER_CONFIDENCE"]

#: More than this fraction of negative line integrals is worth a warning
#: (noise makes some negative near the object's edge; most negative is
#: raw intensities or a flipped sign).
NEGATIVE_FRACTION = 0.5
#: An estimated centre of rotation less confident than this is not used
#: (``center_offset = "auto"`` falls back to 0).
MIN_CENTER_CONFIDENCE = 0.5


def effective_parameters(hyperparameters: dict, n_rays: int) -> float | None:
    """``γ̂`` from a method's hyperparameters (``gamma_total``), or None when absent
    or not usable (non-finite, negative, not below the number of rays)."""
    g = (hyperparameters or {}).get("gamma_total")
    try:
        g = float(g)
    except (TypeError, ValueError):
        return None
    return g if math.isfinite(g) and 0 <= g < n_rays else None


def check_consistency(y: torch.Tensor, op, reconstruction: torch.Tensor, noise_var: float,
                      hyperparameters: dict, *, noise=None, threshold: float = MISFIT_THRESHOLD,
                      misregistration: float | None = None,
                      ray_variance=None) -> tuple[dict, np.ndarray]:
    """The consistency record of one slice and its whitened residual.

    Parameters
    ----------
    y : Tensor, shape (n_angles, n_detector)
        The data (line integrals, 1/mm · mm).
    op : RayTransform
    reconstruction : Tensor, shape (H, W)
        The reconstruction shown.
    noise_var : float
        ``σ²`` the method ended with (learned or known); recorded, and used
        to whiten only when ``noise`` is None.
    hyperparameters : dict
        The method's; ``gamma_total`` (when present) is ``γ̂``.
    noise : NoiseModel, optional
        The problem's noise model (:class:`ctuq.recon.problem.NoiseModel`:
        the given σ, else the data's estimate): whitens the residual.
        Default None: whiten with ``noise_var`` (the behaviour before the
        noise model was used; a learned σ² hides a wrong geometry).
    threshold : float
        χ²/dof of a misfit. Default :data:`~ctuq.recon.diagnostics.MISFIT_THRESHOLD`.
    misregistration : float, optional
        ``δ`` (detector pixels): each ray's variance is ``σ² + (δ ∂(A x̂)/∂u)²``
        (:func:`~ctuq.recon.diagnostics.misregistration_variance`). Default
        :data:`~ctuq.recon.diagnostics.MISREGISTRATION_PX` with ``noise``,
        0 without it (the behaviour before).
    ray_variance : Tensor or ndarray, optional
        ``v``, the per-ray relative noise variance (the data's shape) of the
        count noise model: ray ``i`` has the noise variance ``σ² v_i``.
        Default: ``noise.ray_variance`` (None: ``v ≡ 1``).

    Returns
    -------
    record : dict
        JSON-able: ``chi2_dof``, ``dof``, ``effective_parameters`` (γ̂ or
        None), ``chi2_per_angle`` (list, one per angle row), ``worst_angles``,
        ``verdict`` (``'ok'``/``'misfit'``), ``reason``, ``threshold``,
        ``trustworthy`` (False for a misfit), ``noise_var`` (the σ² that
        whitened, 1/mm²), ``noise_source`` (``'given'``, ``'estimated'``
        or ``'method'``), ``noise_var_method`` (the method's σ²) and
        ``noise_var_ratio`` (method's / whitening σ²; ≫ 1 when the fit
        absorbed a misfit into its noise level), ``misregistration`` (δ).
    residual : ndarray, float32, shape (n_angles, n_detector)
        The whitened residual ``(y − A x̂) / √(σ² v + (δ ∂(A x̂)/∂u)²)``.
    """
    with torch.no_grad():
        fwd = op.A(reconstruction.detach().to(y.device, torch.float32))
    y64 = y.detach().cpu().double().numpy()
    f64 = fwd.detach().cpu().double().numpy()
    if ray_variance is None and noise is not None:
        ray_variance = noise.ray_variance
    v = 1.0 if ray_variance is None else torch.as_tensor(
        ray_variance).detach().cpu().double().numpy().reshape(y64.shape)
    gamma = effective_parameters(hyperparameters, y64.size)
    method_var = float(noise_var)
    if noise is None:
        var, source = method_var, "method"
    else:
        var, source = float(noise.variance), "given" if noise.known else "estimated"
    if misregistration is None:
        misregistration = 0.0 if noise is None else MISREGISTRATION_PX
    # the noise σ² v of every ray, and a tolerance for sub-pixel misregistration at edges
    ray_var = var * v + misregistration_variance(f64, float(misregistration))
    m = data_consistency(y64, f64, ray_var, effective_parameters=gamma, threshold=threshold)
    residual = ((y64 - f64) / np.sqrt(ray_var)).astype(np.float32)
    ratio = method_var / var if math.isfinite(method_var) and method_var > 0 else None
    record = {"chi2_dof": float(m.chi2_dof), "dof": float(m.dof), "effective_parameters": gamma,
              "chi2_per_angle": [float(v) for v in m.per_angle],
              "worst_angles": list(m.worst_angles), "verdict": m.verdict, "reason": m.reason,
              "threshold": float(m.threshold), "trustworthy": m.verdict == "ok",
              "noise_var": var, "noise_source": source,
              "noise_var_method": method_var if ratio is not None else None,
              "noise_var_ratio": ratio, "misregistration": float(misregistration)}
    return record, residual


def combine_slices(records: list[dict]) -> dict:
    """One record for a stack: the verdict ``'misfit'`` when any slice's is, the
    largest χ²/dof and its slice's reason; ``chi2_per_angle`` one list per slice;
    the slices' own records under ``slices``."""
    if len(records) == 1:
        return dict(records[0])
    worst = max(range(len(records)), key=lambda i: records[i]["chi2_dof"])
    bad = [i for i, r in enumerate(records) if r["verdict"] != "ok"]
    pick = bad[0] if bad else worst
    return {"chi2_dof": records[worst]["chi2_dof"],
            "chi2_per_angle": [r["chi2_per_angle"] for r in records],
            "verdict": "misfit" if bad else "ok", "trustworthy": not bad,
            "reason": f"slice {pick}: {records[pick]['reason']}",
            "threshold": records[0]["threshold"],
            "slices": [{k: v for k, v in r.items() if k != "chi2_per_angle"} for r in records]}


def data_warnings(sinogram) -> list[str]:
    """Warnings about the data of a :class:`~ctuq.data.io.Sinogram` before any fit.

    - angles that look like radians while read as degrees, or the reverse
      (:func:`~ctuq.recon.diagnostics.check_angle_unit` on the resolved angles);
    - negative line integrals on more than :data:`NEGATIVE_FRACTION` of the rays;
    - integer-typed line integrals (``meta['source_dtype']``, recorded where
      the data were read), converted to float.

    Each is logged once (``logging.WARNING``) and returned.
    """
    out = []
    src = sinogram.meta.get("source")
    where = f"{src}: " if src else ""
    rad = np.asarray(sinogram.geometry.angles, dtype=np.float64)
    # the angles are radians once resolved: values that span a few degrees were
    # radians read as degrees; values over two turns were degrees read as radians
    msg = check_angle_unit(np.degrees(rad), "deg") or check_angle_unit(rad, "rad")
    if msg is not None:
        out.append(msg.replace("labelled", "read as") + " (set angle_unit / --angle-unit)")
    data = np.asarray(sinogram.data)
    frac = float(np.mean(data < 0)) if data.size else 0.0
    if frac > NEGATIVE_FRACTION:
        out.append(f"{100 * frac:.0f} % of the line integrals are negative: are these "
                   "intensities rather than -log(I/I0), or is the sign flipped?")
    dtype = sinogram.meta.get("source_dtype")
    if dtype is not None and np.dtype(dtype).kind in "iub":
        out.append(f"the line integrals are integers ({dtype}), converted to float32 and "
                   "read as line integrals; set raw (--raw) if they are intensities")
    for w in out:
        log.warning("%s%s", where, w)
    return out


def _noise_variance(sinogram, noise_std=None):
    """The line integrals' noise variance for the centre's std: per ray from counts,
    else the noise level stated (``noise_std``, else the file's), else the estimate
    from the air (:func:`ctuq.recon.baselines.estimate_noise_std`, per slice)."""
    from ctuq.recon.baselines import estimate_noise_std

    if sinogram.variance is not None:
        return np.asarray(sinogram.variance, dtype=np.float64)
    sigma = sinogram.meta.get("noise_std") if noise_std is None else noise_std
    if isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0:
        return np.float64(sigma) ** 2
    data = np.asarray(sinogram.data, dtype=np.float64)
    rows = data if data.ndim == 3 else data[None]
    per_slice = np.array([estimate_noise_std(r) ** 2 for r in rows])[:, None, None]
    return per_slice if data.ndim == 3 else per_slice[0]


def auto_center(sinogram, noise_std: float | None = None):
    """``center_offset = "auto"``: the centre of rotation estimated from the data.

    :func:`ctuq.data.center.estimate_center_offset` (``method='auto'``) on the
    sinogram (a stack: on the sum of its slices, whose centre is theirs);
    an estimate with confidence below :data:`MIN_CENTER_CONFIDENCE`, an
    undetermined one, or a fan-beam geometry falls back to an offset of 0
    with a warning.

    Parameters
    ----------
    sinogram : Sinogram
    noise_std : float, optional
        The line integrals' noise std, for the estimate's std, where the
        sinogram has no per-ray variance. Default: the file's ``noise_std``,
        else estimated from the data.

    Returns
    -------
    sinogram : Sinogram
        With the offset used in its geometry.
    record : dict
        JSON-able: ``requested`` (``'auto'``), ``estimate`` (px, or None when
        undetermined), ``std`` (px: the estimate's std under the data's noise,
        :func:`ctuq.data.center.center_offset_std`; None when undetermined),
        ``confidence``, ``method``, ``used`` (px).
    note : str or None
        The warning when the estimate was not used (also logged).
    """
    from dataclasses import replace

    from ctuq.data.center import center_offset_std, estimate_center_offset
    from ctuq.data.io import Sinogram

    g = sinogram.geometry
    data = np.asarray(sinogram.data, dtype=np.float64)
    if data.ndim == 3:
        data = data.sum(axis=0)
    std = None
    if g.beam != "parallel":
        est, conf, method = None, 0.0, "none"
        reason = "the centre is estimated for parallel beam only"
    else:
        angles = np.asarray(g.angles, dtype=np.float64)
        e = estimate_center_offset(data, angles, method="auto")
        est = float(e.offset) if math.isfinite(e.offset) else None
        conf, method = float(e.confidence), e.method
        reason = str(e.info.get("reason", f"confidence {conf:.2f} < {MIN_CENTER_CONFIDENCE}"))
        if est is not None:  # the noise level only where there is an estimate to judge
            variance = np.broadcast_to(_noise_variance(sinogram, noise_std),
                                       sinogram.data.shape)
            if variance.ndim == 3:  # of the sum of the slices
                variance = variance.sum(axis=0)
            std = center_offset_std(data, angles, e, variance)
            std = std if math.isfinite(std) else None
    use = est is not None and conf >= MIN_CENTER_CONFIDENCE
    used = est if use else 0.0
    note = None
    if not use:
        src = sinogram.meta.get("source")
        note = (f"center_offset auto: the centre of rotation could not be estimated reliably "
                f"({reason}); using offset 0")
        log.warning("%s%s", f"{src}: " if src else "", note)
    record = {"requested": "auto", "estimate": est, "std": std, "confidence": conf,
              "method": method, "used": float(used)}
    geometry = replace(g, center_offset=float(used))
    return (Sinogram(sinogram.data, geometry, dict(sinogram.meta), sinogram.ground_truth,
                     variance=sinogram.variance),
            record, note)
