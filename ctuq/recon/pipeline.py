"""One reconstruction pipeline for every entry point (API, CLI, napari, Dask).

    Sinogram ─▶ FBP ─▶ DIP+TV fit ─▶ linearisation at θ̃
             ─▶ sample-based EM (prior + noise, TV-PredCP) ─▶ posterior samples
             ─▶ mean (the DIP output), std, metrics (when the truth is known) ─▶ Result

With ``[uncertainty] method = "ivon"`` the linearisation and EM are replaced
by IVON (:func:`ctuq.recon.ivon_dip.ivon_uncertainty`): the Adam fit is
continued by variational learning and the std comes from samples of IVON's
weight posterior; the reconstruction is the output of its mean weights, the
Result has the same layout (``em_trace`` empty, IVON's settings in
``hyperparameters`` and ``config['ivon']``). The model-error stage applies to
either method's posterior variance.

:func:`reconstruct` takes a ``progress`` callable, which receives
``(stage, step, total, message)`` events (see :mod:`ctuq.progress`),
and a ``cancel`` callable checked between steps. A stack of slices is
reconstructed slice by slice (stage names then carry the slice number).

Examples
--------
>>> import ctuq
>>> from ctuq.data.geometry import Geometry
>>> from ctuq.data.io import Sinogram
>>> from ctuq.data.operators import RayTransform
>>> from ctuq.data.phantoms import digits
>>> from ctuq.data.simulate import simulate_sinogram
>>> g = Geometry.parallel(28, 20)
>>> truth = digits(1)[0]
>>> y, sigma = simulate_sinogram(truth, RayTransform(g), 0.05, seed=1)
>>> sino = Sinogram(y.numpy(), g, meta={"noise_std": sigma}, ground_truth=truth)
>>> cfg = ctuq.ReconstructionConfig(dip={"iterations": 30},
...                                 uncertainty={"em_steps": 1, "n_samples": 2,
...                                              "predictive_samples": 4})
>>> result = ctuq.reconstruct(sino, cfg)
>>> result.reconstruction.shape, result.std.shape
((28, 28), (28, 28))

A bare array works too: ``ctuq.reconstruct(y, angles=np.linspace(0, 180, 20,
endpoint=False), image_size=28)`` (angles in degrees unless ``angle_unit='rad'``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ctuq.data.io import (Result, Sinogram, read_sinogram, read_sinogram_isolated, sha256_file,
                          write_result)
from ctuq.data.operators import RayTransform
from ctuq.errors import InputError
from ctuq.recon.baselines import estimate_noise_std, fbp_reconstruction
from ctuq.recon.checkpoint import StageCheckpoints, checkpoint_folder, stage_key
from ctuq.recon.config import LAPLACE_ONLY, ReconstructionConfig, UncertaintyConfig
from ctuq.recon.dip import fit_dip, resolve_device
from ctuq.progress import check_cancel, emit_progress
from ctuq.recon.posterior_handle import Posterior
from ctuq.recon.allocator import give_back_memory, keep_freed_memory
from ctuq.recon.provenance import provenance, torch_threads

log = logging.getLogger(__name__)

__all__ = ["reconstruct", "reconstruct_file", "posterior_uncertainty", "ReconstructionConfig",
           "checkpoint_folder"]


def _noise_std(sinogram: Sinogram, config: ReconstructionConfig, y: torch.Tensor) -> tuple[float, bool]:
    """The noise std and whether it is known (config or file) rather than estimated."""
    if config.noise_std is not None:
        return float(config.noise_std), True
    known = sinogram.noise_std  # validated: a positive finite number or None
    if known is not None:
        return known, True
    return estimate_noise_std(y), False


def _slice_progress(progress, index: int, n_slices: int):
    if progress is None or n_slices == 1:
        return progress

    def forward(stage, step, total, message=""):
        emit_progress(progress, f"{stage} [slice {index + 1}/{n_slices}]", step, total, message)
    return forward


#: Rough peak memory of the pipeline per image pixel (bytes): the U-net fit
#: needs 4-10 kB per pixel (measured at 64²-256²), the batched Jacobian
#: products of the EM several times that.
BYTES_PER_PIXEL = 32 * 1024


def as_sinogram(data, *, angles=None, geometry=None, meta=None, ground_truth=None,
                **geometry_options) -> Sinogram:
    """A :class:`Sinogram` from an array ``[n_angles, n_detector]`` (or a stack
    ``[n_slices, n_angles, n_detector]``) and the geometry options.

    Parameters
    ----------
    data : array_like
        Line integrals, one row per angle (ctuq's = ASTRA's convention; for a
        scikit-image ``radon`` output use :meth:`Sinogram.from_skimage`).
    angles : array_like, optional
        One angle per row, in ``angle_unit`` (default degrees).
    geometry : Geometry or dict, optional
    **geometry_options
        :class:`~ctuq.data.io.options.GeometryOptions` fields (``image_size``,
        ``pixel_size``, ``angle_first``/``angle_last``, ``n_angles``,
        ``angle_unit``, ``center_offset``, ``beam``...).
    """
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import _resolve
    from ctuq.data.io._common import check_array

    if isinstance(geometry, Geometry) and angles is None and not geometry_options:
        return Sinogram(data, geometry, dict(meta or {}), ground_truth)
    arr = check_array(data, file=None, field="sinogram", ndims=(2, 3))
    part, n_angles, _ = _resolve.from_options(angles=angles, geometry=geometry,
                                              options=geometry_options, file=None)
    geom = _resolve.resolve(part, n_angles_data=arr.shape[-2], n_detector_data=arr.shape[-1],
                            n_angles_opt=n_angles, file=None)
    return Sinogram(arr, geom, dict(meta or {}), ground_truth)


def check_memory(shape, config: ReconstructionConfig) -> None:
    """Refuse an image whose reconstruction would not fit the memory budget."""
    from ctuq.data.io._common import default_memory_budget

    budget = config.read_options.max_bytes or default_memory_budget()
    pixels = int(np.prod(shape[-2:]))
    need = pixels * BYTES_PER_PIXEL
    if need > budget:
        raise InputError(
            f"a {shape[-2]} x {shape[-1]} image needs roughly {need / 1024**3:.3g} GiB, over "
            f"the memory budget of {budget / 1024**3:.3g} GiB: give a smaller image_size "
            "(--image-size) or raise max_memory_gib (--max-memory-gib)", field="image_size")


def reconstruct(sinogram, config: ReconstructionConfig | None = None, *,
                angles=None, progress: Callable | None = None,
                cancel: Callable[[], bool] | None = None, run_id: str | None = None,
                checkpoint=None, **geometry) -> Result:
    """Reconstruct a sinogram with a per-pixel uncertainty.

    Parameters
    ----------
    sinogram : Sinogram or array_like
        A :class:`Sinogram` (data with its geometry; a ground truth, when
        present, adds metrics), or an array ``(n_angles, n_detector)`` /
        ``(n_slices, n_angles, n_detector)`` with ``angles`` and the geometry
        options below.
    config : ReconstructionConfig, optional
        Default: ``ReconstructionConfig()`` (presets by image size).
    angles : array_like, optional
        For an array: one angle per row, degrees unless ``angle_unit='rad'``.
    progress : callable, optional
        Receives ``(stage, step, total, message)`` events.
    cancel : callable, optional
        Returns True to stop; :class:`ctuq.errors.Cancelled` is raised.
    run_id : str, optional
        Recorded in the provenance (the batch runner's run).
    checkpoint : path-like, optional
        A folder for the finished stages (:mod:`ctuq.recon.checkpoint`): a
        run stopped by a cancel, a crash or a wall-time limit resumes there
        when called again with the same data and settings. Removed when the
        reconstruction is complete. Default None (nothing saved).
    **geometry
        For an array: :class:`~ctuq.data.io.options.GeometryOptions` fields
        (``image_size``, ``pixel_size``, ``detector_spacing``, ``beam``,
        ``source_origin``, ``origin_detector``, ``angle_first``,
        ``angle_last``, ``n_angles``, ``angle_unit``, ``center_offset``), or
        ``geometry=`` a :class:`~ctuq.data.geometry.Geometry`.

    Returns
    -------
    Result
        ``reconstruction`` (the DIP output, the posterior mean shown to users;
        ``method = 'ivon'``: the output of IVON's mean weights, the Adam fit
        being ``dip``),
        ``std`` (total std: ``posterior_std`` and ``model_error_std`` together,
        :mod:`ctuq.recon.model_error`), ``variance`` (total), a few posterior ``samples``,
        ``fbp``, ``dip``, learned ``hyperparameters``, the ``em_trace``,
        ``metrics`` (with a ground truth), the effective ``config``, the
        ``provenance`` (versions, threads, device) and, in memory only, the
        fitted ``posterior`` (:class:`~ctuq.recon.posterior_handle.Posterior`,
        or :class:`~ctuq.recon.ivon_dip.IVONPosterior`; one per slice for a
        stack): ``result.posterior.sample(n)``,
        ``result.posterior.region_std(region)``.
    """
    if not isinstance(sinogram, Sinogram):
        if isinstance(sinogram, (str, bytes)) or hasattr(sinogram, "__fspath__"):
            raise InputError("is a file name; use ctuq.reconstruct_file(path, out) or "
                             "ctuq.data.io.read_sinogram(path) first", field="sinogram")
        try:
            sinogram = as_sinogram(sinogram, angles=angles, **geometry)
        except InputError as err:
            if err.field == "angles" and angles is None:
                raise InputError("an array needs its angles: ctuq.reconstruct(data, "
                                 "angles=[...degrees...]) or angle_first=, angle_last=, or "
                                 "n_angles= (equispaced over 180 deg)", field="angles") from None
            raise
    elif angles is not None or geometry:
        raise InputError("a Sinogram carries its geometry; angles and geometry options apply "
                         "to arrays only", field="angles" if angles is not None else
                         sorted(geometry)[0])
    if config is not None and not isinstance(config, ReconstructionConfig):
        if isinstance(config, dict):
            config = ReconstructionConfig.from_dict(config)
        else:
            raise InputError(f"must be a ReconstructionConfig or a dict, got "
                             f"{type(config).__name__}", field="config")
    config = config or ReconstructionConfig()
    ckpt = None if checkpoint is None else StageCheckpoints(checkpoint)
    result = _reconstruct(sinogram, config, progress, cancel, run_id, ckpt)
    if ckpt is not None:
        ckpt.clear()
    return result


def _reconstruct(sinogram: Sinogram, config: ReconstructionConfig, progress, cancel,
                 run_id: str | None, ckpt: StageCheckpoints | None) -> Result:
    check_memory(sinogram.geometry.image_shape, config)
    sinogram.check_signal()
    slices = list(sinogram.slices()) if sinogram.is_stack else [sinogram]
    outs = []
    keep_freed_memory()  # 2.6x faster Jacobian products at 512² on CPU (allocator.py)
    try:
        with torch_threads(config.threads) as threads:
            for i, sl in enumerate(slices):
                check_cancel(cancel, "reconstruction")
                outs.append(_reconstruct_slice(
                    sl, config, _slice_progress(progress, i, len(slices)), cancel,
                    _Stages(ckpt, i, sl, config)))
    finally:
        give_back_memory()
    first = outs[0]
    stack = (lambda key: np.stack([o[key] for o in outs])) if sinogram.is_stack else (
        lambda key: first[key])
    metrics = first["metrics"]
    if sinogram.is_stack and first["metrics"]:
        metrics = {k: float(np.mean([o["metrics"][k] for o in outs])) for k in first["metrics"]}
    hyper = first["hyperparameters"] if len(outs) == 1 else {
        f"slice_{i}": o["hyperparameters"] for i, o in enumerate(outs)}
    trace = first["trace"] if len(outs) == 1 else [
        {**t, "slice": i} for i, o in enumerate(outs) for t in o["trace"]]
    posteriors = [o["posterior"] for o in outs]
    return Result(
        reconstruction=stack("mean"), std=stack("std"), variance=stack("variance"),
        posterior_std=stack("posterior_std"), model_error_std=stack("model_error_std"),
        samples=stack("samples") if first["samples"] is not None else None,
        fbp=stack("fbp"), dip=stack("dip"),
        ground_truth=sinogram.ground_truth, geometry=sinogram.geometry,
        config=first["config"], hyperparameters=hyper, em_trace=trace, metrics=metrics,
        input_path=sinogram.meta.get("source"), seed=config.seed, device=first["device"],
        units="1/mm",
        provenance=provenance(device=first["device"], threads=threads,
                              request=config.to_dict(), run_id=run_id),
        posterior=posteriors[0] if len(posteriors) == 1 else tuple(posteriors))


#: Predictive samples per solver call: progress and cancel between batches.
#: The solver's work is linear in the batch; each extra call adds only the
#: linear target and the (already converged) θ* row's residual check.
_PREDICTIVE_BATCH = 32


def posterior_uncertainty(dip, op: RayTransform, y: torch.Tensor, noise_std: float,
                          unc: UncertaintyConfig, *, learn_noise: bool, seed: int = 0,
                          progress: Callable | None = None,
                          cancel: Callable[[], bool] | None = None,
                          stages: "_Stages | None" = None) -> dict:
    """The uncertainty stages after a DIP fit: linearise, sample-based EM, predictive.

    Parameters
    ----------
    dip : DIPResult
        The fitted network (its output is the predictive mean).
    op : RayTransform
    y : Tensor, shape (n_angles, n_detector)
    noise_std : float
        Known or estimated noise std of ``y`` (the initial ``σ``).
    unc : UncertaintyConfig
    learn_noise : bool
        Update ``σ²`` in the M-step.
    seed : int
        Seed of the EM draws (``seed``) and of the predictive draws (``seed + 7``).
    progress, cancel : callable, optional
        See :func:`reconstruct`.
    stages : optional
        The pipeline's checkpoints of ``em`` and ``predictive`` (internal).

    Returns
    -------
    dict
        ``posterior`` (:class:`~ctuq.posterior.em.FittedPosterior`),
        ``linearization``, ``image_samples`` (zero-mean, ``[k, H, W]``),
        ``variance`` and ``std`` (``[H, W]``), ``timings`` (seconds of
        ``em`` and ``predictive``) and the engine ``options``
        (:func:`~ctuq.recon.evidence.uncertainty_options`).
    """
    from ctuq.posterior import FittedPosterior, Linearization
    from ctuq.recon import predictive
    from ctuq.recon.evidence import ct_likelihood, fit_posterior, uncertainty_options

    stages = stages or _Stages(None)
    timings = {}
    lin = Linearization(dip.model, dip.net_input)
    options = uncertainty_options(unc, learn_noise=bool(learn_noise), seed=seed)
    post, timings["em"] = stages.run(
        "em", lambda: fit_posterior(
            lin, op, y, noise_std**2, **options,
            tv_weight=float(dip.config.resolve_tv_weight(y, op, noise_std)),
            progress=progress, cancel=cancel),
        # saved without its likelihood (the operator and network are rebuilt)
        pack=lambda p: {f.name: getattr(p, f.name) for f in fields(p) if f.name != "likelihood"},
        unpack=lambda s: FittedPosterior(likelihood=ct_likelihood(lin, op, y), **s),
        progress=progress)
    check_cancel(cancel, "reconstruction")

    def draw():
        emit_progress(progress, "predictive", 0, unc.predictive_samples, "posterior samples")
        gen = torch.Generator().manual_seed(seed + 7)
        z = post.draw(unc.predictive_samples, generator=gen, batch_size=_PREDICTIVE_BATCH,
                      progress=progress, cancel=cancel)
        emit_progress(progress, "predictive", unc.predictive_samples, unc.predictive_samples,
                      "done")
        return predictive.image_samples(lin, z), post.draw_info  # zero-mean, [k, H, W]

    (image_samples, post.draw_info), timings["predictive"] = stages.run(
        "predictive", draw, progress=progress)
    variance = image_samples.pow(2).mean(0)
    return {"posterior": post, "linearization": lin, "image_samples": image_samples,
            "variance": variance, "std": variance.sqrt(), "timings": timings,
            "options": options}


def heldout_prior(unc: UncertaintyConfig, preset: str):
    """The calibration that centres the held-out fit's prior, and where it came from.

    ``(None, None)`` when ``heldout_prior_width`` is 0, or when no
    ``model_error_file`` is named and ctuq ships none for the preset (or the
    method is IVON, whose std the shipped files were not fitted with).
    """
    from ctuq.recon import model_error as me

    if unc.heldout_prior_width == 0:
        return None, None
    if unc.model_error_file is not None:
        return me.ModelErrorCoefficients.load(unc.model_error_file), str(unc.model_error_file)
    if unc.method != "laplace":
        return None, None
    shipped = me.shipped_coefficients(preset)
    return (shipped, f"shipped:{preset}") if shipped is not None else (None, None)


def model_error_calibration(unc: UncertaintyConfig, preset: str):
    """``(coefficients, source)`` that the model-error stage will use, or ``(None, None)``.

    Read before any fit, so that a missing or bad calibration file stops the
    run at once with one clear error rather than after the DIP and the EM.
    """
    from ctuq.recon import model_error as me

    if unc.model_error in ("calibrated", "conformal"):
        return (me.coefficients_for(preset, unc.model_error_file),
                str(unc.model_error_file) if unc.model_error_file else f"shipped:{preset}")
    if unc.model_error == "heldout":
        return heldout_prior(unc, preset)
    return None, None


def model_error_stage(dip, op: RayTransform, y: torch.Tensor, noise_var: float,
                      unc: UncertaintyConfig, posterior_variance: torch.Tensor, preset: str, *,
                      calibration: tuple | None = None, progress: Callable | None = None,
                      cancel: Callable[[], bool] | None = None) -> dict:
    """The model-error variance beside the posterior's (:mod:`ctuq.recon.model_error`).

    Parameters
    ----------
    dip : DIPResult
        The fit on all angles (its settings are reused by ``'heldout'``).
    op : RayTransform
    y : Tensor, shape (n_angles, n_detector)
    noise_var : float
        ``σ²`` of the measurements (the EM's, learned or known).
    unc : UncertaintyConfig
        ``model_error``, ``heldout_every``, ``heldout_min_out``,
        ``model_error_file``.
    posterior_variance : Tensor, shape (H, W)
    preset : str
        Picks the shipped calibration when no file is named.
    calibration : tuple, optional
        :func:`model_error_calibration`'s result, when already read.
    progress, cancel : callable, optional

    Returns
    -------
    dict
        ``variance`` (``[H, W]`` float64 on the CPU), ``coefficients``
        (:class:`~ctuq.recon.model_error.ModelErrorCoefficients`) and
        ``seconds``.
    """
    from ctuq.recon import model_error as me

    t0 = time.perf_counter()
    x_hat = dip.reconstruction.detach().cpu()
    var_post = posterior_variance.detach().double().cpu()
    method = unc.model_error
    calibration, source = calibration or model_error_calibration(unc, preset)
    emit_progress(progress, "model error", 0, 1, method)
    if method == "none":
        coeffs, var = me.ModelErrorCoefficients(), torch.zeros_like(var_post)
    elif method == "heldout":
        mask, dip_in = me.heldout_fit(y, op, dip.config, every=unc.heldout_every,
                                      min_out=unc.heldout_min_out,
                                      noise_std=math.sqrt(noise_var), progress=progress,
                                      cancel=cancel)
        check_cancel(cancel, "reconstruction")
        coeffs = me.fit_heldout(op, y, mask, dip_in.reconstruction.detach().cpu(), var_post,
                                noise_var, prior=calibration,
                                prior_width=unc.heldout_prior_width)
        if calibration is not None:
            coeffs.info["prior"]["from"] = source
        var = coeffs.variance(x_hat, var_post)
    else:
        coeffs = calibration
        if method == "calibrated":
            var = coeffs.variance(x_hat, var_post)
        else:  # conformal: total std = q · posterior std, never below the posterior's
            var = (max(coeffs.conformal, 1.0) ** 2 - 1.0) * var_post
    emit_progress(progress, "model error", 1, 1, f"{method}: t0 {coeffs.t0:.3g}, "
                  f"s1 {coeffs.s1:.3g}")
    return {"variance": var, "coefficients": coeffs, "seconds": time.perf_counter() - t0}


class _Stages:
    """Run a stage, or load it from a slice's checkpoint (:mod:`ctuq.recon.checkpoint`)."""

    def __init__(self, ckpt: StageCheckpoints | None, index: int = 0,
                 sino: Sinogram | None = None, config: ReconstructionConfig | None = None):
        self.ckpt, self.index, self.resumed = ckpt, index, []
        self.key = None if ckpt is None else stage_key(sino.data, sino.geometry, config)
        self.device = None if config is None else resolve_device(config.device)

    def run(self, stage: str, compute: Callable, *, pack: Callable = lambda v: v,
            unpack: Callable = lambda v: v, progress: Callable | None = None):
        """``(value, seconds)``: the saved stage (its original seconds), else ``compute()``."""
        if self.ckpt is not None:
            saved = self.ckpt.load(self.index, stage, self.key, map_location=self.device)
            if saved is not None:
                self.resumed.append(stage)
                emit_progress(progress, stage, 1, 1, f"resumed from {self.ckpt.folder}")
                return unpack(saved[0]), saved[1]
        t0 = time.perf_counter()
        value = compute()
        seconds = time.perf_counter() - t0
        if self.ckpt is not None:
            self.ckpt.save(self.index, stage, self.key, pack(value), seconds=seconds)
        return value, seconds


def _reconstruct_slice(sino: Sinogram, config: ReconstructionConfig, progress, cancel,
                       stages: _Stages | None = None) -> dict:
    from ctuq.recon import predictive
    from ctuq.recon.evidence import options_summary

    t_start = time.perf_counter()
    geometry = sino.geometry
    dip_cfg, unc = config.resolve(geometry.image_shape)
    device = resolve_device(config.device)
    op = RayTransform(geometry, backend=config.backend, device=device)
    y = torch.as_tensor(sino.data, dtype=torch.float32, device=device)
    noise_std, noise_known = _noise_std(sino, config, y)
    preset = config.preset_for(geometry.image_shape)
    calibration = model_error_calibration(unc, preset)
    timings = {}

    emit_progress(progress, "fbp", 0, 1, "filtered back-projection")
    t0 = time.perf_counter()
    fbp = fbp_reconstruction(y, op)
    timings["fbp"] = time.perf_counter() - t0
    emit_progress(progress, "fbp", 1, 1, "done")
    check_cancel(cancel, "reconstruction")

    stages = stages or _Stages(None)
    dip, timings["dip"] = stages.run("dip", lambda: fit_dip(
        y, op, dip_cfg, noise_std=noise_std, progress=progress, cancel=cancel),
        progress=progress)
    check_cancel(cancel, "reconstruction")

    if unc.method == "ivon":
        from ctuq.recon.ivon_dip import ivon_uncertainty

        unc_out = ivon_uncertainty(dip, op, y, noise_std, unc, seed=config.seed,
                                   progress=progress, cancel=cancel)
        mean, noise_var = unc_out["reconstruction"], noise_std**2
        kept = unc_out["samples"]
        # the model error is that of the reconstruction shown, IVON's f(m)
        me_dip = replace(dip, reconstruction=mean)
    else:
        unc_out = posterior_uncertainty(dip, op, y, noise_std, unc, learn_noise=(
            (not noise_known) if unc.learn_noise is None else unc.learn_noise),
            seed=config.seed, progress=progress, cancel=cancel, stages=stages)
        post = unc_out["posterior"]
        mean, noise_var, me_dip = dip.reconstruction.detach(), float(post.noise_var), dip
        kept = mean + unc_out["image_samples"]
    timings.update(unc_out["timings"])
    check_cancel(cancel, "reconstruction")
    image_samples = unc_out["image_samples"]
    var_post = unc_out["variance"].double().cpu()
    me_out = model_error_stage(me_dip, op, y, noise_var, unc, var_post, preset,
                               calibration=calibration, progress=progress, cancel=cancel)
    timings["model_error"] = me_out["seconds"]
    variance = var_post + me_out["variance"]
    std = variance.sqrt()

    metrics = {}
    if sino.ground_truth is not None:
        truth = np.asarray(sino.ground_truth, dtype=np.float32)
        metrics = flat_metrics(predictive.summary(truth, mean.cpu(), std,
                                                  samples=image_samples.cpu()))
        metrics["psnr_fbp"] = predictive.psnr(truth, fbp.cpu().numpy())
        post_only = predictive.summary(truth, mean.cpu(), var_post.sqrt(), patch_sizes=())
        metrics["pixel_log_likelihood_posterior"] = post_only["pixel_log_likelihood"]
        metrics["coverage_2sigma_posterior"] = post_only["coverage"]["2"]
        if unc.method == "ivon":
            metrics["psnr_dip"] = predictive.psnr(truth, dip.reconstruction.detach().cpu())
    # this run's seconds plus the loaded stages' own
    timings["total"] = time.perf_counter() - t_start + sum(timings[s] for s in stages.resumed)
    effective = {"preset": preset, "device": str(device),
                 "seed": config.seed, "backend": op.backend, "noise_std": noise_std,
                 "noise_std_known": noise_known, "dip": dip.config.to_dict(),
                 "resumed": list(stages.resumed)}
    if unc.method == "ivon":
        # what IVON ran with; the Laplace-only settings are listed as unused
        effective.update({
            "uncertainty": {k: v for k, v in asdict(unc).items() if k not in LAPLACE_ONLY},
            "uncertainty_unused": list(LAPLACE_ONLY), "ivon": unc_out["summary"]})
        effective["ivon"]["config"].pop("dip", None)  # the same as "dip" above
        hyper, trace, handle = unc_out["hyperparameters"], [], unc_out["posterior"]
    else:
        effective.update({"uncertainty": asdict(unc),
                          "evidence": options_summary(unc_out["options"])})
        hyper, trace = post.hyperparameters(), post.trace
        handle = Posterior(post, unc_out["linearization"], mean.cpu().numpy(), seed=config.seed)
    effective.update({"model_error": me_out["coefficients"].to_dict(), "timings_s": timings})
    k = min(unc.stored_samples, unc.predictive_samples)
    return {
        "mean": mean.cpu().numpy(), "std": std.float().numpy(),
        "variance": variance.float().numpy(), "posterior_std": var_post.sqrt().float().numpy(),
        "model_error_std": me_out["variance"].sqrt().float().numpy(),
        "samples": kept[:k].cpu().numpy() if k else None,
        "dip": dip.reconstruction.detach().cpu().numpy(),
        "fbp": fbp.cpu().numpy(), "metrics": metrics, "hyperparameters": hyper,
        "trace": trace, "config": effective, "device": str(device), "posterior": handle,
    }


def flat_metrics(summary: dict) -> dict[str, float]:
    """:func:`ctuq.recon.predictive.summary` as flat ``name -> float`` for result files.

    ``coverage['2']`` becomes ``coverage_2sigma``, ``patch_log_likelihood['5']``
    becomes ``patch_log_likelihood_5``; nominal coverages are left out.
    """
    out = {}
    for key, value in summary.items():
        if key == "coverage":
            out.update({f"coverage_{k}sigma": float(v) for k, v in value.items()})
        elif isinstance(value, dict):
            if key != "coverage_nominal":
                out.update({f"{key}_{k}": float(v) for k, v in value.items()})
        else:
            out[key] = float(value)
    return out


def reconstruct_file(input_path, out_path, config: ReconstructionConfig | None = None, *,
                     overwrite: bool = False, progress: Callable | None = None,
                     cancel: Callable[[], bool] | None = None, run_id: str | None = None,
                     checkpoint: bool = True, **read_options) -> Result:
    """Read a sinogram file, reconstruct it, write the result file atomically.

    The output is checked before any work starts, so that a refused output
    fails at once; the input is never overwritten. The file is read as
    ``config.read`` and ``config.geometry`` say (and ``read_options``, which
    take precedence), by default in a child process with a time limit
    (:func:`ctuq.data.io.read_sinogram_isolated`).

    Parameters
    ----------
    input_path, out_path : path-like
    config : ReconstructionConfig, optional
    overwrite : bool
        Replace an existing output. Default False.
    progress, cancel : callable, optional
        See :func:`reconstruct`.
    run_id : str, optional
        Recorded in the result's provenance.
    checkpoint : bool
        Keep the finished stages in ``.<out name>.resume`` beside the output
        (:func:`checkpoint_folder`) until the result is written, so that a
        stopped run resumes where it stopped when started again with the
        same input and settings. Default True.
    **read_options
        :class:`~ctuq.data.io.options.ReadOptions` and
        :class:`~ctuq.data.io.options.GeometryOptions` fields (``dataset=``,
        ``angles=``, ``image_size=``...).
    """
    from ctuq.data.io import check_output_path
    from ctuq.data.io.options import GEOMETRY_OPTION_NAMES, READ_OPTION_NAMES

    config = config or ReconstructionConfig()
    unknown = sorted(set(read_options) - set(READ_OPTION_NAMES) - set(GEOMETRY_OPTION_NAMES)
                     - {"geometry", "image_shape"})
    if unknown:
        raise InputError("unknown read or geometry option", field=unknown[0])
    read = {**config.read, **{k: v for k, v in read_options.items() if k in READ_OPTION_NAMES}}
    geom = {**config.geometry, **{k: v for k, v in read_options.items()
                                  if k not in READ_OPTION_NAMES}}
    config = config.merged({"read": read, "geometry": {k: v for k, v in geom.items()
                                                       if k in GEOMETRY_OPTION_NAMES}})
    ropts = config.read_options
    input_path, out_path = Path(input_path), Path(out_path)
    check_output_path(out_path, overwrite=overwrite, protect=[input_path])
    kwargs = {**ropts.reader_kwargs(), **geom}
    if ropts.isolate:
        sino = read_sinogram_isolated(input_path, timeout=ropts.read_timeout, **kwargs)
    else:
        sino = read_sinogram(input_path, **kwargs)
    ckpt = StageCheckpoints(checkpoint_folder(out_path)) if checkpoint else None
    result = _reconstruct(sino, config, progress, cancel, run_id, ckpt)
    result.input_path = os.path.abspath(input_path)
    result.input_sha256 = sha256_file(input_path)
    write_result(out_path, result, overwrite=overwrite)
    if ckpt is not None:  # only once the result is safely written
        ckpt.clear()
    return result

