"""One reconstruction pipeline for every entry point (API, CLI, napari, Dask).

Each slice is one :class:`~ctuq.recon.problem.ReconstructionProblem` that
goes through the stages of :data:`STAGES`::

    fbp ─▶ dip (DIP+TV fit) ─▶ uncertainty (the method of [uncertainty] method)
        ─▶ model error ─▶ consistency ─▶ predictive (std, samples, metrics) ─▶ Result

The uncertainty method is an object of :data:`ctuq.recon.methods.METHODS`
(the linearised Laplace posterior by default; IVON; MC dropout): whichever
it is, it returns an :class:`~ctuq.recon.methods.base.UncertaintyOutcome`
and the Result has the same layout (``em_trace`` empty for a method without
EM; its own settings in ``config['uncertainty'][<table>]``, its summary
beside them). The model-error term (:mod:`ctuq.recon.model_error`) applies
to any method's posterior variance. Long stages are checkpointed
(:mod:`ctuq.recon.checkpoint`).

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
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ctuq.data.io import (Result, Sinogram, check_array, default_memory_budget, geometry_part,
                          read_sinogram, read_sinogram_isolated, resolve_geometry,
                          sha256_file, write_result)
from ctuq.errors import InputError
from ctuq.progress import check_cancel, emit_progress
from ctuq.recon.allocator import give_back_memory, keep_freed_memory
from ctuq.recon.baselines import fbp_reconstruction
from ctuq.recon.checkpoint import StageCheckpoints, checkpoint_folder
from ctuq.recon.config import ReconstructionConfig, UncertaintyConfig
from ctuq.recon.problem import ReconstructionProblem
from ctuq.recon.provenance import ThreadGovernor, provenance, torch_threads
from ctuq.recon.scaling import in_data_units
from ctuq.recon.stages import StageRunner

log = logging.getLogger(__name__)

__all__ = ["reconstruct", "reconstruct_file", "posterior_uncertainty", "ReconstructionConfig",
           "checkpoint_folder", "STAGES"]


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

    from ctuq.data.io.options import AUTO, without_auto

    geometry_options, auto = without_auto(geometry_options)
    meta = {**(meta or {}), **({"center_offset": AUTO} if auto else {})}
    if isinstance(geometry, Geometry) and angles is None and not geometry_options:
        return Sinogram(data, geometry, meta, ground_truth)
    dtype = getattr(data, "dtype", None)
    if dtype is not None and np.dtype(dtype).kind in "iub":  # a note on integer data
        meta["source_dtype"] = str(np.dtype(dtype))
    arr = check_array(data, file=None, field="sinogram", ndims=(2, 3))
    part, n_angles, _ = geometry_part(angles=angles, geometry=geometry,
                                      options=geometry_options, file=None)
    geom = resolve_geometry(part, n_angles_data=arr.shape[-2], n_detector_data=arr.shape[-1],
                            n_angles_opt=n_angles, file=None)
    return Sinogram(arr, geom, meta, ground_truth)


def check_memory(shape, config: ReconstructionConfig) -> None:
    """Refuse an image whose reconstruction would not fit the memory budget."""
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
    config : ReconstructionConfig or dict, optional
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
        reconstruction is complete, when it fails with an
        :class:`~ctuq.errors.InputError` (a rerun would fail the same way)
        and when no stage was saved. Default None (nothing saved).
    **geometry
        For an array: :class:`~ctuq.data.io.options.GeometryOptions` fields
        (``image_size``, ``pixel_size``, ``detector_spacing``, ``beam``,
        ``source_origin``, ``origin_detector``, ``angle_first``,
        ``angle_last``, ``n_angles``, ``angle_unit``, ``center_offset``), or
        ``geometry=`` a :class:`~ctuq.data.geometry.Geometry`.

    Returns
    -------
    Result
        ``reconstruction`` (the method's reconstruction shown to users: the
        DIP output for the Laplace method; ``dip`` keeps the DIP output),
        ``std`` (total std: ``posterior_std`` and ``model_error_std`` together,
        :mod:`ctuq.recon.model_error`), ``variance`` (total), a few posterior ``samples``,
        ``fbp``, ``dip``, learned ``hyperparameters``, the ``em_trace``,
        ``metrics`` (with a ground truth), the effective ``config``, the
        ``provenance`` (versions, threads, device) and, in memory only, the
        fitted ``posterior`` (:class:`~ctuq.recon.posterior_handle.PosteriorHandle`;
        one per slice for a stack): ``result.posterior.sample(n)`` and
        ``result.posterior.region_std(region)``, both with the model error
        included unless ``include_model_error=False``.
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
    result = _checkpointed(ckpt, lambda: _reconstruct(sinogram, config, progress, cancel,
                                                      run_id, ckpt))
    if ckpt is not None:
        ckpt.clear()
    return result


def _checkpointed(ckpt: StageCheckpoints | None, run: Callable):
    """``run()``, keeping the checkpoint folder after a failure only if it can be resumed.

    An :class:`InputError` is deterministic (the same data and settings fail
    the same way again), so its folder is removed; after a cancel, a crash or
    a kill the folder stays if a stage was saved in it.
    """
    try:
        return run()
    except InputError:
        if ckpt is not None:
            ckpt.clear()
        raise
    except BaseException:
        if ckpt is not None and not ckpt.has_stages():
            ckpt.clear()
        raise


def _reconstruct(sinogram: Sinogram, config: ReconstructionConfig, progress, cancel,
                 run_id: str | None, ckpt: StageCheckpoints | None) -> Result:
    from ctuq.recon.consistency import combine_slices, data_warnings

    from ctuq.data.io.options import is_auto
    from ctuq.recon.consistency import auto_center

    check_memory(sinogram.geometry.image_shape, config)
    sinogram.check_signal()
    warnings = data_warnings(sinogram)
    center = None
    if is_auto(sinogram.meta.get("center_offset")) or is_auto(
            config.geometry.get("center_offset")):
        sinogram, center, note = auto_center(sinogram, config.noise_std)
        warnings += [note] if note else []
    slices = list(sinogram.slices()) if sinogram.is_stack else [sinogram]
    outs = []
    keep_freed_memory()  # 2.6x faster Jacobian products at 512² on CPU (allocator.py)
    try:
        ceiling = torch.get_num_threads()
        with torch_threads(config.threads) as threads:
            # an unpinned count follows the free cores (another run may start meanwhile)
            governor = None if config.threads else ThreadGovernor(ceiling)
            prog = governor.wrap(progress) if governor else progress
            for i, sl in enumerate(slices):
                check_cancel(cancel, "reconstruction")
                outs.append(reconstruct_slice(
                    ReconstructionProblem.from_sinogram(sl, config),
                    _slice_progress(prog, i, len(slices)), cancel, ckpt=ckpt, index=i))
    finally:
        give_back_memory()
    warnings += solver_warnings([o["trace"] for o in outs])
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
    diagnostics = {**combine_slices([o["diagnostics"] for o in outs]), "warnings": warnings,
                   **({"center": center} if center is not None else {})}
    stages = first["stages"] if len(outs) == 1 else {
        "seconds": {k: float(sum(o["stages"]["seconds"].get(k, 0.0) for o in outs))
                    for k in first["stages"]["seconds"]},
        "counts": {k: int(sum(o["stages"]["counts"].get(k, 0) for o in outs))
                   for k in first["stages"]["counts"]},
        "slices": [o["stages"] for o in outs]}
    prov = provenance(device=first["device"], threads=threads, request=config.to_dict(),
                      run_id=run_id, **(governor.record() if governor else {}))
    prov["stages"] = stages
    return Result(
        reconstruction=stack("mean"), std=stack("std"), variance=stack("variance"),
        posterior_std=stack("posterior_std"), model_error_std=stack("model_error_std"),
        samples=stack("samples") if first["samples"] is not None else None,
        fbp=stack("fbp"), dip=stack("dip"),
        ground_truth=sinogram.ground_truth, geometry=sinogram.geometry,
        config=first["config"], hyperparameters=hyper, em_trace=trace, metrics=metrics,
        input_path=sinogram.meta.get("source"), seed=config.seed, device=first["device"],
        units="1/mm",
        provenance=prov, diagnostics=diagnostics, residual=stack("residual"),
        posterior=posteriors[0] if len(posteriors) == 1 else tuple(posteriors))


def posterior_uncertainty(dip, op, y: torch.Tensor, noise_std: float,
                          unc: UncertaintyConfig, *, learn_noise: bool, seed: int = 0,
                          progress: Callable | None = None,
                          cancel: Callable[[], bool] | None = None,
                          stages: StageRunner | None = None) -> dict:
    """The linearised Laplace stages after a DIP fit: linearise, sample-based EM, predictive.

    :func:`ctuq.recon.methods.laplace.laplace_posterior` with ``unc``'s
    Laplace settings and ``predictive_samples`` (see there for the
    parameters and the returned dict).
    """
    from ctuq.recon.methods.laplace import laplace_posterior

    return laplace_posterior(dip, op, y, noise_std, unc.laplace,
                             predictive_samples=unc.predictive_samples, learn_noise=learn_noise,
                             seed=seed, progress=progress, cancel=cancel, stages=stages)


# -- the stages of one slice ---------------------------------------------------------


class _Slice:
    """What the stages of one slice hand on (filled stage by stage)."""

    def __init__(self, problem: ReconstructionProblem, progress, cancel, runner: StageRunner):
        self.problem, self.progress, self.cancel, self.runner = problem, progress, cancel, runner
        self.method = problem.uncertainty.make_method()
        self.timings: dict[str, float] = {}
        self.t_start = time.perf_counter()
        self.term = self.fbp = self.dip = self.outcome = self.model_error = None
        self.consistency: dict | None = None
        self.residual: np.ndarray | None = None
        # wall seconds of every stage, this run's (the provenance's ``stages``)
        self.stage_seconds: dict[str, float] = {}
        self.record: dict | None = None


def _fbp_stage(s: _Slice) -> None:
    emit_progress(s.progress, "fbp", 0, 1, "filtered back-projection")
    t0 = time.perf_counter()
    s.fbp = fbp_reconstruction(s.problem.y, s.problem.op)
    s.timings["fbp"] = time.perf_counter() - t0
    emit_progress(s.progress, "fbp", 1, 1, "done")


def _dip_stage(s: _Slice) -> None:
    p = s.problem
    from ctuq.recon.model_error.shared import dip_fit  # shares the held-out fit when asked
    s.dip, s.timings["dip"] = s.runner.run("dip", lambda: dip_fit(
        p, s.term, progress=s.progress, cancel=s.cancel), progress=s.progress)


def _uncertainty_stage(s: _Slice) -> None:
    s.outcome = s.method.run(s.problem, s.dip, stages=s.runner, progress=s.progress,
                             cancel=s.cancel)
    s.timings.update(s.outcome.timings)


def _model_error_stage(s: _Slice) -> None:
    out = s.outcome
    # the model error is that of the reconstruction shown: the DIP output plus the
    # method's step (its length chosen there when open), or the method's own image
    fit = replace(s.dip, reconstruction=out.reconstruction) \
        if out.refit and out.mean_step is None else s.dip
    s.model_error = s.term.variance(s.problem, fit, out.variance, out.noise_var,
                                    mean_step=out.mean_step, progress=s.progress,
                                    cancel=s.cancel)
    if s.model_error.reconstruction is not None:
        out.recentre(s.model_error.reconstruction.to(out.reconstruction))
    s.timings["model_error"] = s.model_error.seconds


def _consistency_stage(s: _Slice) -> None:
    """The whitened residual of the reconstruction shown and its verdict
    (:mod:`ctuq.recon.consistency`); reads the fit, changes none of its numbers."""
    from ctuq.recon.consistency import check_consistency

    p, out = s.problem, s.outcome
    emit_progress(s.progress, "consistency", 0, 1, "data consistency")
    var = float(out.noise_var)
    if not (var > 0 and np.isfinite(var)):  # a method without a noise level of its own
        var = p.noise.variance
    s.consistency, s.residual = check_consistency(p.y, p.op, out.reconstruction, var,
                                                  out.hyperparameters, noise=p.noise)
    if s.consistency["verdict"] != "ok":
        src = p.sinogram.meta.get("source")
        log.warning("%smisfit: %s", f"{src}: " if src else "", s.consistency["reason"])
    emit_progress(s.progress, "consistency", 1, 1, s.consistency["verdict"])


def reconstruct_slice(problem: ReconstructionProblem, progress=None, cancel=None, *,
                      ckpt: StageCheckpoints | None = None, index: int = 0) -> dict:
    """Run :data:`STAGES` on one 2-D problem; the arrays and records of its result."""
    from ctuq.recon.model_error import make_model_error

    s = _Slice(problem, progress, cancel, StageRunner(ckpt, index, problem))
    unc = problem.uncertainty
    # read any calibration file before a fit: a missing or bad one fails at once
    s.term = make_model_error(unc.model_error, unc, problem.preset,
                              shipped=s.method.shipped_calibration).prepare()
    for name, stage in STAGES:
        t0 = time.perf_counter()
        stage(s)
        s.stage_seconds[name.replace(" ", "_")] = time.perf_counter() - t0
        check_cancel(cancel, "reconstruction")
    s.record["stages"] = stage_record(s)
    return s.record


def stage_record(s: _Slice) -> dict:
    """Seconds per stage (and the method's sub-stages) and the iteration counts of a slice.

    ``seconds``: ``fbp``, ``dip``, ``uncertainty`` (with the method's own
    ``em``, ``predictive``... where it reports them), ``model_error``,
    ``consistency``, ``metrics``, ``total``; ``dip_heldout``, the part of
    ``dip`` that the held-out fit took when the fit on all angles continued
    from it (``dip_from_heldout``; both held-out fits with ``dip.net_input =
    'auto'``) or the held-out fit's own wall time when it ran beside the fit
    (``ModelErrorTerm.beside_fit``); a stage loaded from a checkpoint
    counts its own recorded seconds. ``counts``: ``dip_iterations`` (and
    ``dip_heldout_iterations``),
    ``em_steps`` and ``solver_iterations`` / ``cg_iterations`` (summed over the
    EM steps) where reported. ``certificates``, with ``cg_refine``: the largest
    certified data-space error of the samples over the noise's norm, of the EM's
    E-steps (``em``) and of the predictive draws that make the std (``predictive``);
    None where those solves were not refined.
    """
    seconds = dict(s.stage_seconds)
    for name in ("dip",):  # a resumed stage took its recorded time, not the loading's
        if name in s.runner.resumed and name in s.timings:
            seconds[name] = float(s.timings[name])
    for k, v in (s.outcome.timings if s.outcome is not None else {}).items():
        seconds.setdefault(k, float(v))
    seconds["total"] = float(s.timings.get("total", sum(s.stage_seconds.values())))
    counts = {}
    hist = getattr(s.dip, "loss_history", None) or {}
    lengths = [len(v) for v in hist.values() if hasattr(v, "__len__")]
    if lengths:
        counts["dip_iterations"] = int(max(lengths))
    held = s.term.shared_fit() if s.term is not None else None
    if held is not None:  # the held-out fit ran first or beside, inside the "dip" stage
        seconds["dip_heldout"] = s.term.first_fit_seconds()  # every input 'auto' tried
        counts["dip_heldout_iterations"] = int(len(held.loss_history["loss"]))
    trace = s.outcome.trace if s.outcome is not None else []
    steps = (s.outcome.hyperparameters or {}).get("em_steps") if s.outcome is not None else None
    if isinstance(steps, int) and not isinstance(steps, bool):
        counts["em_steps"] = steps
    elif trace:
        counts["em_steps"] = len(trace)
    if trace:
        for key in ("solver_iterations", "cg_iterations"):
            vals = [t[key] for t in trace if isinstance(t.get(key), (int, float))]
            if vals:
                counts[key] = int(sum(vals))
    record = {"seconds": {k: float(v) for k, v in seconds.items()}, "counts": counts}
    em = solver_outcome(trace)["max_data_error"] if trace else None
    drawn = (getattr(s.outcome, "diagnostics", None) or {}).get("predictive_data_error")
    if em is not None or drawn is not None:
        record["certificates"] = {"em": em, "predictive": drawn}
    return record


def _metrics_stage(s: _Slice) -> None:
    """The predictive summary of one slice: total std, samples, metrics, effective config."""
    from ctuq.recon import predictive

    p, out, me = s.problem, s.outcome, s.model_error
    unc = p.uncertainty
    mean = out.reconstruction.detach()
    var_post = out.variance.double().cpu()
    variance = var_post + me.variance
    std = variance.sqrt()
    out.posterior.set_model_error(me.variance.numpy())

    metrics = {}
    if p.sinogram.ground_truth is not None:
        truth = np.asarray(p.sinogram.ground_truth, dtype=np.float32)
        fluct = None if out.fluctuations is None else out.fluctuations.cpu()
        metrics = flat_metrics(predictive.summary(truth, mean.cpu(), std, samples=fluct))
        metrics["psnr_fbp"] = predictive.psnr(truth, s.fbp.cpu().numpy())
        post_only = predictive.summary(truth, mean.cpu(), var_post.sqrt(), patch_sizes=())
        metrics["pixel_log_likelihood_posterior"] = post_only["pixel_log_likelihood"]
        metrics["coverage_2sigma_posterior"] = post_only["coverage"]["2"]
        if out.refit:
            metrics["psnr_dip"] = predictive.psnr(truth, s.dip.reconstruction.detach().cpu())
    timings = s.timings
    # this run's seconds plus the loaded stages' own
    timings["total"] = (time.perf_counter() - s.t_start
                        + sum(timings[st] for st in s.runner.resumed))
    effective = {"preset": p.preset, "device": str(p.device), "seed": p.seed,
                 "backend": p.op.backend, "noise_std": p.noise.std,
                 "noise_std_known": p.noise.known, **p.noise.summary(),
                 "dip": s.dip.config.to_dict(),
                 "resumed": list(s.runner.resumed), "uncertainty": unc.effective(),
                 **out.summary, "model_error": me.coefficients.to_dict(), "timings_s": timings}
    k = min(unc.stored_samples, unc.predictive_samples)
    samples = out.samples
    s.record = {
        "mean": mean.cpu().numpy(), "std": std.float().numpy(),
        "variance": variance.float().numpy(), "posterior_std": var_post.sqrt().float().numpy(),
        "model_error_std": me.variance.sqrt().float().numpy(),
        "samples": samples[:k].cpu().numpy() if k and samples is not None else None,
        "dip": s.dip.reconstruction.detach().cpu().numpy(),
        "fbp": s.fbp.cpu().numpy(), "metrics": metrics, "hyperparameters": out.hyperparameters,
        "trace": out.trace, "config": effective, "device": str(p.device),
        "posterior": out.posterior, "diagnostics": s.consistency, "residual": s.residual,
    }


def solver_outcome(trace: list[dict]) -> dict:
    """How the EM's linear solves ended, from an EM trace (entries with
    ``solver_converged`` and ``solver_residual``): ``em_steps`` (every E-step run),
    ``rejected`` (E-steps the EM discarded: an Anderson-mixed point whose solves stalled),
    of the steps it kept ``unconverged`` (solves stopped above tolerance) and
    ``max_residual`` (the largest relative residual; None where the method reports none),
    the largest preconditioner rank (``max_precond_rank``; None without one: an adaptive
    rank shows its growth here), the solver iterations summed over the steps
    (``solver_iterations``), the EM's seconds (``em_s``) and, with ``cg_refine``, the
    largest certified data-space error of the samples over the noise's norm
    (``max_data_error``; None without refinement)."""
    kept = [t for t in trace if not t.get("rejected")]  # discarded E-steps do not count
    residuals = [t["solver_residual"] for t in kept if t.get("solver_residual") is not None]
    ranks = [t["precond_rank"] for t in trace if t.get("precond_rank")]
    errors = [t["solver_data_error"] for t in kept if t.get("solver_data_error") is not None]
    return {"em_steps": len(trace),
            "solver_iterations": int(sum(t.get("solver_iterations") or 0 for t in trace)),
            "em_s": float(sum(t.get("seconds") or 0.0 for t in trace)),
            "unconverged": sum(t.get("solver_converged") is False for t in kept),
            "rejected": len(trace) - len(kept),
            "max_residual": max(residuals) if residuals else None,
            "max_precond_rank": max(ranks) if ranks else None,
            "max_data_error": max(errors) if errors else None}


def solver_warnings(traces: list[list[dict]]) -> list[str]:
    """One warning when an EM step's linear solves stopped above their tolerance.

    ``traces``: the EM trace of every slice (entries with ``solver_converged``
    and ``solver_residual``). A solve that stops at its iteration cap leaves
    the samples, and through the EM the prior's scale, off: on a validation
    scan (64², 60 angles, 1 % noise) a residual 480× the tolerance made the
    mean std 4× that of the converged solve (docs/speed.md). Logged once.
    """
    outcome = solver_outcome([t for trace in traces for t in trace or []])
    if not outcome["unconverged"]:
        return []
    missed = {i for i, trace in enumerate(traces)
              if solver_outcome(trace or [])["unconverged"]}
    where = f" (slices {sorted(missed)})" if len(traces) > 1 else ""
    msg = (f"posterior: the linear solves of {outcome['unconverged']} of "
           f"{outcome['em_steps']} EM steps{where} stopped at their iteration cap above "
           f"tolerance (largest relative residual {outcome['max_residual'] or 0.0:.2g}); "
           f"the posterior std may be off. Raise [uncertainty.laplace] "
           f"preconditioner_rank, or let it grow on slow solves "
           f"(preconditioner_max_rank, preconditioner_grow_after)")
    log.warning(msg)
    return [msg]


#: The stages of a slice, in order: ``(name, function of the slice's state)``.
#: ``dip`` and the method's own long sub-stages are checkpointed. The metrics are
#: those of the outputs in data units (:func:`ctuq.recon.scaling.in_data_units`).
STAGES = (("fbp", _fbp_stage), ("dip", _dip_stage), ("uncertainty", _uncertainty_stage),
          ("model error", _model_error_stage), ("consistency", _consistency_stage),
          ("metrics", in_data_units(_metrics_stage)))


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
        same input and settings; a run that fails with an
        :class:`~ctuq.errors.InputError`, or stops before any stage was
        saved, leaves no folder. Default True.
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
    if read_options:  # the object as given otherwise (no round trip through a dict)
        config = config.merged({"read": read, "geometry": {
            k: v for k, v in geom.items() if k in GEOMETRY_OPTION_NAMES}})
    ropts = config.read_options
    input_path, out_path = Path(input_path), Path(out_path)
    check_output_path(out_path, overwrite=overwrite, protect=[input_path])
    kwargs = {**ropts.reader_kwargs(), **geom}
    if ropts.isolate:
        sino = read_sinogram_isolated(input_path, timeout=ropts.read_timeout, **kwargs)
    else:
        sino = read_sinogram(input_path, **kwargs)
    ckpt = StageCheckpoints(checkpoint_folder(out_path)) if checkpoint else None
    result = _checkpointed(ckpt, lambda: _reconstruct(sino, config, progress, cancel, run_id,
                                                      ckpt))
    result.input_path = os.path.abspath(input_path)
    result.input_sha256 = sha256_file(input_path)
    write_result(out_path, result, overwrite=overwrite)
    if ckpt is not None:  # only once the result is safely written
        ckpt.clear()
    return result

