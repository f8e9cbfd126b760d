"""Model-error coefficients calibrated on simulated scans (``ctuq calibrate``).

The calibrated and the split-conformal model-error terms
(:mod:`ctuq.recon.model_error.terms`) need coefficients fitted where the truth is
known. :func:`calibrate` simulates scans of a family of objects the user
picks (ctuq's phantom families, from the *tuning* split of
:mod:`ctuq.data.splits`, never the images that validation or testing use),
reconstructs each with the pipeline's own settings and no model error, and
fits

- ``t0``, ``s1`` by the pixel likelihood of the truths
  (:func:`~ctuq.recon.model_error.fit_to_truth`), for the calibrated term;
- the split-conformal multiplier of the posterior std
  (:func:`~ctuq.recon.model_error.conformal_scale`), for the conformal term.

The result is a small JSON file that ``uncertainty.model_error_file`` names.
It describes the scans it was fitted on (size, angles, noise levels,
families): it transfers to scans like those, and ``ctuq calibrate`` should
be rerun for another preset, noise level or kind of object.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import numpy as np

from ctuq.data.splits import FAMILIES, cases
from ctuq.errors import InputError
from ctuq.progress import check_cancel, emit_progress
from ctuq.recon.config import ReconstructionConfig
from ctuq.recon.model_error import ModelErrorCoefficients, conformal_scale, fit_to_truth

__all__ = ["CALIBRATION_FAMILIES", "calibrate", "calibration_scans", "default_families",
           "fit_calibration"]

log = logging.getLogger(__name__)

#: The families of a calibration for a preset that ships none (:func:`default_families`).
#: The tuning split's textured family (``'photos'``) is there to be named.
CALIBRATION_FAMILIES = ("ellipses", "shepp-variant", "rectangles", "digits")


def default_families(size: int, config: ReconstructionConfig | None = None) -> tuple[str, ...]:
    """The families a calibration at ``size``² uses when none are named.

    Those of the calibration ctuq ships for the size's preset (``dip-64``'s has the
    photo crops, ``dip-128``'s not), so that a rerun with the defaults remakes the
    shipped file; :data:`CALIBRATION_FAMILIES` for a preset that ships none.
    """
    from ctuq.recon.model_error import shipped_coefficients

    preset = (config or ReconstructionConfig()).preset_for((size, size))
    shipped = shipped_coefficients(preset)
    named = tuple((shipped.info.get("families") or ()) if shipped is not None else ())
    return named if named and set(named) <= set(FAMILIES["tuning"]) else CALIBRATION_FAMILIES


def calibration_scans(size: int, *, families: Sequence[str] | None = None,
                      n_per_family: int = 2, angles: Sequence[int] = (30, 60),
                      noise_levels: Sequence[float] = (0.01, 0.05), start: int = 0):
    """The simulated scans of a calibration: every case at every condition.

    Yields ``(case, n_angles, noise_level, Sinogram)``; the cases come from
    the tuning split, and each condition gets its own noise draw.
    """
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram

    families = default_families(size) if families is None else tuple(families)
    for n_angles in angles:
        geometry = Geometry.parallel(size, n_angles)
        op = RayTransform(geometry)
        for j, noise in enumerate(noise_levels):
            for case in cases("tuning", families, n_per_family, size=size, start=start):
                truth = case.image()
                offset = (len(noise_levels) * list(angles).index(n_angles) + j) % 100
                y, sigma = simulate_sinogram(truth, op, float(noise),
                                             seed=case.noise_seed(offset))
                yield case, n_angles, noise, Sinogram(
                    y.cpu().numpy(), geometry, {"noise_std": sigma}, ground_truth=truth)


def _term_of_the_image(config: ReconstructionConfig, size: int) -> str | None:
    """The model-error term the image of the settings (at ``size``²) depends on, or None.

    The coefficients are for the image a reconstruction shows, fitted with no
    model error where the image does not need one. Two settings need a term:
    one the uncertainty method requires (``mean = "linear-heldout"`` chooses
    its step length on the held-out projections), and ``dip_from_heldout > 0``
    with a term that makes a fit first (``ModelErrorTerm.makes_fit_first``:
    the DIP fit continues from it; without the term it would be a plain fit,
    about 1 dB worse at 64², docs/speed.md).
    """
    from ctuq.recon.model_error import MODEL_ERROR_TERMS

    unc = config.resolve((int(size), int(size)))[1]  # with the preset's defaults
    need = unc.method_class.required_model_error(unc.method_settings)
    term = MODEL_ERROR_TERMS.get(unc.model_error)
    shared = (term is not None and term.makes_fit_first
              and float(unc.dip_from_heldout) > 0)
    return need or (unc.model_error if shared else None)


def calibrate(size: int, config: ReconstructionConfig | None = None, *,
              families: Sequence[str] | None = None, n_per_family: int = 2,
              angles: Sequence[int] = (30, 60), noise_levels: Sequence[float] = (0.01, 0.05),
              progress: Callable | None = None, cancel: Callable[[], bool] | None = None,
              scans=None) -> ModelErrorCoefficients:
    """Fit the model-error coefficients for images of side ``size`` on simulated scans.

    Parameters
    ----------
    size : int
        Image side in pixels (the preset follows from it unless ``config``
        names one).
    config : ReconstructionConfig, optional
        The settings the coefficients are for (default: the defaults); its
        ``uncertainty.model_error`` is overridden with ``'none'``, or with the
        term the image needs (``'heldout'`` for ``mean = "linear-heldout"``,
        which chooses its step length on held-out projections, and for
        ``dip_from_heldout > 0`` with the held-out term, whose fit the DIP
        continues from); the coefficients describe the error of the image
        the settings show, with the posterior variance alone.
    families : sequence of str, optional
        Phantom families of the tuning split (default :func:`default_families`: those
        of the calibration shipped for the preset).
    n_per_family : int
        Images per family and condition. Default 2.
    angles : sequence of int
        Numbers of parallel-beam angles. Default (30, 60).
    noise_levels : sequence of float
        Noise std relative to the mean ``|A x|``. Default (0.01, 0.05).
    progress, cancel : callable, optional
        Progress events ``('calibrate', i, n, message)`` and the
        reconstructions' own stages.
    scans : iterable, optional
        ``(label, Sinogram with ground truth)`` pairs instead of the simulated
        ones (e.g. a user's own scans with known truth).

    Returns
    -------
    ModelErrorCoefficients
        The calibrated term's, with ``t0``, ``s1``, the conformal multiplier and in
        ``info`` what it was fitted on and the fit's log-likelihood.
    """
    config = config or ReconstructionConfig()
    families = default_families(size, config) if families is None else tuple(families)
    config = config.merged({"uncertainty": {"model_error": _term_of_the_image(config, size)
                                                      or "none"}})
    bad = [f for f in families if f not in FAMILIES["tuning"]]
    if bad:
        raise InputError(f"unknown family {bad[0]!r}; choose from "
                         f"{', '.join(FAMILIES['tuning'])}", field="families")
    if scans is None:
        scans = [(f"{c.name} {a} angles {n:.0%}", s) for c, a, n, s in calibration_scans(
            size, families=families, n_per_family=n_per_family, angles=angles,
            noise_levels=noise_levels)]
    scans = list(scans)
    if not scans:
        raise InputError("no calibration scans", field="families")
    from ctuq.recon.pipeline import reconstruct

    t0 = time.perf_counter()
    truths, means, variances = [], [], []
    preset = None
    for i, (label, sino) in enumerate(scans):
        check_cancel(cancel, "calibration")
        emit_progress(progress, "calibrate", i, len(scans), label)
        if sino.ground_truth is None:
            raise InputError("a calibration scan needs its ground truth", field=label)
        r = reconstruct(sino, config, progress=progress, cancel=cancel)
        preset = preset or r.config["preset"]
        truths.append(np.asarray(sino.ground_truth, np.float64))
        means.append(r.reconstruction.astype(np.float64))
        variances.append(r.posterior_std.astype(np.float64) ** 2)
        log.info("calibration scan %d/%d (%s): PSNR %.2f dB", i + 1, len(scans), label,
                 r.metrics.get("psnr", float("nan")))
    emit_progress(progress, "calibrate", len(scans), len(scans), "fitting")
    return fit_calibration(
        truths, means, variances, preset=preset, size=int(size),
        families=list(families), split="tuning", angles=list(angles),
        noise_levels=list(noise_levels), n_per_family=int(n_per_family),
        scans=[label for label, _ in scans], seconds=time.perf_counter() - t0,
        uncertainty={k: v for k, v in config.uncertainty.items()})


def fit_calibration(truths, means, variances, **info) -> ModelErrorCoefficients:
    """The calibrated term's ``(t0, s1)`` and the conformal multiplier from known truths.

    Parameters
    ----------
    truths, means, variances : sequences of arrays, each (H, W)
        Ground truths, the images shown and their posterior variances.
    **info
        What they were fitted on (JSON-able), kept in ``info`` beside the
        fit's log-likelihood.

    Returns
    -------
    ModelErrorCoefficients
    """
    fitted = fit_to_truth(truths, means, variances)
    q = conformal_scale(truths, means, [np.sqrt(v) for v in variances])
    return dataclasses.replace(fitted, conformal=max(q, 1e-6), info={**fitted.info, **info})
