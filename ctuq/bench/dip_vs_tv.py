"""DIP+TV against TV alone (and FBP): PSNR and SSIM on the test split, and how fast DIP gets there.

Two kinds of case: those of a calibration benchmark run with its arrays kept
(:func:`run_case`: TV and FBP on the same simulated scans, DIP+TV the
stored reconstruction) and cases fitted here (:func:`run_fit_case`: the
size's preset DIP fitted with a PSNR trace, so that the iterations and
seconds it needs to reach TV's PSNR are known).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ctuq.bench.cases import fit_cases, simulate
from ctuq.bench.scores import image_metrics

__all__ = ["METHODS", "run_case", "run_fit_case", "fit_cases", "summarise", "summary_by"]

METHODS = ("fbp", "tv", "tv_best", "dip_tv")


def run_case(row: dict, arrays) -> dict | None:
    """FBP, TV and the stored DIP+TV of one calibration-benchmark case; None without its arrays.

    ``row``: the case's row of the calibration benchmark; ``arrays``: that
    run's arrays folder (its reconstruction ``x_hat``). TV twice: at the
    documented default weight with the true σ (``tv``), and at the best of
    :data:`TV_FACTORS` times it for this image, chosen with the truth in
    hindsight (``tv_best``, the oracle no user has).
    """
    from ctuq.errors import InputError
    from ctuq.recon.baselines import fbp_reconstruction
    from ctuq.recon.presets import DIP_DEFAULTS

    npz = Path(arrays) / (row["id"].replace("/", "_") + ".npz")
    if not npz.exists():
        return None
    stored = np.load(npz)
    scan = simulate(row)
    truth, op, y, sigma = scan.truth, scan.op, scan.y, scan.sigma
    if not np.array_equal(truth, stored["truth"]):
        raise InputError("the stored truth is not the case's phantom", file=npz, field="truth")
    tv, best = tv_at_factors(truth, y, op, sigma)
    out = {k: row[k] for k in ("id", "family", "size", "condition", "preset")}
    out["methods"] = {"fbp": image_metrics(truth, fbp_reconstruction(y, op)),
                      "tv": tv[1.0], "tv_best": {**tv[best], "factor": best},
                      "dip_tv": {**image_metrics(truth, stored["x_hat"]),
                                 "time_s": row["times_s"]["dip"],
                                 "iterations": DIP_DEFAULTS[row["preset"]]["iterations"]}}
    out["dip_minus_tv_psnr"] = out["methods"]["dip_tv"]["psnr"] - out["methods"]["tv"]["psnr"]
    out["dip_minus_tv_ssim"] = out["methods"]["dip_tv"]["ssim"] - out["methods"]["tv"]["ssim"]
    out["dip_minus_tv_best_psnr"] = out["methods"]["dip_tv"]["psnr"] - tv[best]["psnr"]
    return out


def fitted_data(scan, normalize: bool = True) -> tuple[float, object, float]:
    """``(s, y / s, σ / s)``: the data as ``ctuq.reconstruct`` fits them, ``s`` the data
    scale (:func:`ctuq.recon.scaling.data_scale`; 1 when ``normalize`` is False). A fit's
    image times ``s`` is in the data's units."""
    from ctuq.recon.scaling import data_scale

    scale = float(data_scale(scan.y, scan.op)) if normalize else 1.0
    return scale, scan.y / scale, scan.sigma / scale


def run_fit_case(case: dict, monitor_every: int = 25) -> dict:
    """FBP, TV and a DIP+TV fitted here (the size's preset), with its PSNR trace."""
    from ctuq.models.unet import preset_name_for_size
    from ctuq.recon.baselines import fbp_reconstruction, tv_reconstruction
    from ctuq.recon.dip import DIPConfig, fit_dip

    scan = simulate(case, offset=0)  # the image's first noise draw
    c, truth, op, y, sigma = scan.case, scan.truth, scan.op, scan.y, scan.sigma
    t0 = time.perf_counter()
    tv = image_metrics(truth, tv_reconstruction(y, op, noise_std=sigma))
    tv["time_s"] = time.perf_counter() - t0
    scale, y_fit, sigma_fit = fitted_data(scan)  # the DIP sees the data as ctuq.reconstruct does
    preset = preset_name_for_size(c.size)
    cfg = DIPConfig.preset_defaults(preset, device="cpu", progress_every=monitor_every)
    trace = []
    t0 = time.perf_counter()

    def monitor(iteration, image):
        trace.append((iteration, time.perf_counter() - t0,
                      image_metrics(truth, image * scale)["psnr"]))

    dip = fit_dip(y_fit, op, cfg, noise_std=sigma_fit, monitor=monitor)
    reached = next(((it, sec) for it, sec, p in trace if p >= tv["psnr"]), (None, None))
    out = {k: case[k] for k in ("id", "family", "size", "condition")}
    out["preset"] = preset
    out["methods"] = {"fbp": image_metrics(truth, fbp_reconstruction(y, op)), "tv": tv,
                      "dip_tv": {**image_metrics(truth, dip.reconstruction * scale),
                                 "time_s": dip.wall_time, "iterations": cfg.iterations}}
    out["data_scale"] = scale
    out["dip_iterations_to_tv_psnr"], out["dip_seconds_to_tv_psnr"] = reached
    out["dip_psnr_trace"] = [[it, round(sec, 2), round(p, 3)] for it, sec, p in trace]
    out["dip_minus_tv_psnr"] = out["methods"]["dip_tv"]["psnr"] - tv["psnr"]
    out["dip_minus_tv_ssim"] = out["methods"]["dip_tv"]["ssim"] - tv["ssim"]
    return out


def summarise(rows: list[dict]) -> dict:
    """Mean scores per method, DIP − TV PSNR (mean, min, max), and how often DIP reached TV."""
    out = {"images": len(rows)}
    for m in METHODS:
        if all(m in r["methods"] for r in rows):  # tv_best: scored cases only
            out[m] = {k: float(np.mean([r["methods"][m][k] for r in rows]))
                      for k in rows[0]["methods"][m]}
    d = [r["dip_minus_tv_psnr"] for r in rows]
    out["dip_minus_tv_psnr"] = {"mean": float(np.mean(d)), "min": float(np.min(d)),
                                "max": float(np.max(d))}
    if all("dip_minus_tv_best_psnr" in r for r in rows):
        b = [r["dip_minus_tv_best_psnr"] for r in rows]
        out["dip_minus_tv_best_psnr"] = {"mean": float(np.mean(b)), "min": float(np.min(b)),
                                         "max": float(np.max(b))}
        out["dip_at_least_tv_best_psnr"] = int(sum(x >= 0 for x in b))
    out["dip_minus_tv_ssim_mean"] = float(np.mean([r["dip_minus_tv_ssim"] for r in rows]))
    out["dip_at_least_tv_psnr"] = int(sum(x >= 0 for x in d))
    if all("dip_iterations_to_tv_psnr" in r for r in rows):  # fitted here, traced
        its = [r["dip_iterations_to_tv_psnr"] for r in rows]
        secs = [r["dip_seconds_to_tv_psnr"] for r in rows if r["dip_seconds_to_tv_psnr"]]
        out["reached_tv_psnr"] = int(sum(i is not None for i in its))
        out["iterations_to_tv_psnr_median_of_reached"] = \
            float(np.median([i for i in its if i is not None])) if secs else None
        out["seconds_to_tv_psnr_median_of_reached"] = float(np.median(secs)) if secs else None
    return out


def summary_by(rows: list[dict]) -> dict:
    """Per size: :func:`summarise` of all images, per family and per condition."""
    summary = {}
    for size in sorted({r["size"] for r in rows}):
        at = [r for r in rows if r["size"] == size]
        summary[str(size)] = {
            "all": summarise(at),
            "families": {f: summarise([r for r in at if r["family"] == f])
                         for f in sorted({r["family"] for r in at})},
            "conditions": {c: summarise([r for r in at if r["condition"] == c])
                           for c in sorted({r["condition"] for r in at})}}
    return summary


# ------------------------------------------------------------------------------
# Sweeps of the DIP settings on the validation split (TV weight, input, warm start)

#: TV weight factors of the oracle TV ("best of these per image"), relative to the
#: documented default weight (:func:`ctuq.recon.baselines.default_tv_weight`).
TV_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)

#: The sweep's scan conditions per size, (angles, relative noise), alternated over
#: the images of a family (those of the test-split table of docs/dip.md §5).
SWEEP_CONDITIONS = {64: [(30, 0.01), (60, 0.05)], 128: [(60, 0.01), (60, 0.05)],
                    28: [(20, 0.05)]}


def sweep_cases(size: int, per_family: int, split: str = "validation",
                families=None) -> list[dict]:
    """``per_family`` images of every family of ``split``, conditions alternated.

    Image ``i`` of a family gets condition ``i mod len(conditions)`` of
    :data:`SWEEP_CONDITIONS` (so 2 images per family cover both conditions).
    """
    from ctuq.bench.cases import _case
    from ctuq.data.splits import FAMILIES

    conds = SWEEP_CONDITIONS[size]
    return [_case(split, f, i, size, *conds[i % len(conds)])
            for i in range(per_family) for f in (families or FAMILIES[split])]


def tv_at_factors(truth, y, op, sigma: float) -> tuple[dict, float]:
    """TV (PDHG) at every weight of :data:`TV_FACTORS` × the default weight for ``sigma``.

    Returns ``({factor: metrics and time_s}, the factor of the highest PSNR)``:
    the best weight in hindsight, chosen with the truth.
    """
    from ctuq.recon.baselines import default_tv_weight, tv_reconstruction

    base = default_tv_weight(op, sigma)
    tv = {}
    for f in TV_FACTORS:
        t0 = time.perf_counter()
        rec = tv_reconstruction(y, op, weight=f * base)
        tv[f] = {**image_metrics(truth, rec), "time_s": time.perf_counter() - t0}
    return tv, max(tv, key=lambda f: tv[f]["psnr"])


def run_tv_sweep_case(case: dict, offset: int | None = 0) -> dict:
    """FBP and TV at every weight of :data:`TV_FACTORS` on the case's scan.

    ``offset``: the noise draw (:func:`~ctuq.bench.cases.simulate`; 0, the
    first, for the sweeps; None, the condition's own, for a calibration
    benchmark's cases)."""
    from ctuq.recon.baselines import fbp_reconstruction

    scan = simulate(case, offset=offset)
    tv, best = tv_at_factors(scan.truth, scan.y, scan.op, scan.sigma)
    out = {k: case[k] for k in ("id", "family", "size", "condition")}
    out["fbp"] = image_metrics(scan.truth, fbp_reconstruction(scan.y, scan.op))
    out["tv"] = {str(f): v for f, v in tv.items()}
    out["tv_default"] = tv[1.0]
    out["tv_best"] = {**tv[best], "factor": float(best)}
    return out


def run_dip_variant_case(case: dict, changes: dict, monitor_every: int = 100, *,
                         normalize: bool = True, offset: int | None = 0) -> dict:
    """DIP+TV on the case's scan: the size's preset with ``changes`` applied.

    ``changes`` are :class:`~ctuq.recon.dip.DIPConfig` fields (e.g.
    ``tv_weight_factor``, ``net_input``, ``iterations``, ``lr``,
    ``warm_start``; ``unet`` as a dict of :class:`~ctuq.models.UNetConfig`
    changes to the size's preset, e.g. ``{"channels": [16, 16, 16, 16]}``),
    and optionally ``heldout_every``: fit without every that-many-th angle
    (the held-out model error's fit,
    :func:`~ctuq.recon.model_error.heldout.heldout_fit`, at least the
    pipeline's ``heldout_min_out`` angles out) and trace the left-out
    projections' mean squared residual beside the PSNR, the ground-truth-free
    stopping signal; ``heldout_stop`` is the
    traced iterate of the lowest held-out residual (iteration, PSNR).

    The fit is monitored every ``monitor_every`` iterations: the PSNR of the
    lowest-loss iterate so far and the seconds spent, i.e. what a run stopped
    there would have returned (with the learning rate of this run's
    schedule, not that of a shorter one).

    ``normalize`` (the default, as ``ctuq.reconstruct`` does): the fit sees
    ``y / s`` with ``s`` = :func:`ctuq.recon.scaling.data_scale` (σ too),
    and its image is multiplied back by ``s`` before it is scored; False
    fits the data as simulated (docs/dip.md §6's sweeps). ``offset``: the
    noise draw, as in :func:`run_tv_sweep_case`.
    """
    from ctuq.models.unet import preset_name_for_size, unet_preset
    from ctuq.recon.config import UncertaintyConfig
    from ctuq.recon.dip import DIPConfig, fit_dip
    from ctuq.recon.model_error.heldout import heldout_fit, heldout_split

    changes = dict(changes)
    every = changes.pop("heldout_every", None)
    fields = dict(changes)
    if isinstance(fields.get("unet"), dict):  # architecture changes to the size's preset
        fields["unet"] = unet_preset(case["size"]).with_(**{
            k: tuple(v) if isinstance(v, list) else v for k, v in fields["unet"].items()})
    scan = simulate(case, offset=offset)
    scale, y, sigma = fitted_data(scan, normalize)
    cfg = DIPConfig.preset_defaults(preset_name_for_size(case["size"]), device="cpu",
                                    progress_every=monitor_every, **fields)
    trace = []
    out_mask = None  # the held-out fit's left-out angles (the pipeline's fewest left out)
    min_out = UncertaintyConfig().heldout_min_out
    if every is not None:
        out_mask = torch.as_tensor(heldout_split(scan.op.geometry.n_angles, int(every), min_out))
    t0 = time.perf_counter()

    def monitor(iteration, image):
        point = [iteration, round(time.perf_counter() - t0, 2),
                 round(image_metrics(scan.truth, image * scale)["psnr"], 3)]
        if out_mask is not None:
            with torch.no_grad():
                point.append(float(((scan.op(image) - y)[out_mask] ** 2).mean()))
        trace.append(point)

    if every is None:
        dip = fit_dip(y, scan.op, cfg, noise_std=sigma, monitor=monitor)
    else:
        _, dip = heldout_fit(y, scan.op, cfg, every=int(every), min_out=min_out,
                             noise_std=sigma, monitor=monitor)
    out = {k: case[k] for k in ("family", "size", "condition")}
    out["case"] = case["id"]
    out["changes"] = {**changes, **({} if every is None else {"heldout_every": every})}
    out["normalized"] = bool(normalize)
    out["data_scale"] = scale
    out["dip_tv"] = {**image_metrics(scan.truth, dip.reconstruction * scale),
                     "time_s": dip.wall_time, "iterations": cfg.iterations,
                     "best_iteration": dip.best_iteration, "tv_weight": dip.tv_weight}
    out["trace"] = trace
    if every is not None:
        stop = min(trace, key=lambda t: t[3])
        out["heldout_stop"] = {"iteration": stop[0], "psnr": stop[2],
                               "peak_psnr": max(t[2] for t in trace)}
    return out


def summarise_sweep(tv_rows: list[dict], dip_rows: list[dict]) -> dict:
    """Per size, variant and family: mean PSNR/SSIM, DIP − TV (default and best weight).

    ``tv_rows``: :func:`run_tv_sweep_case` rows; ``dip_rows``:
    :func:`run_dip_variant_case` rows with a ``"variant"`` name. Only cases
    present in both count.
    """
    tv = {r["id"]: r for r in tv_rows}
    out: dict = {}
    for size in sorted({r["size"] for r in dip_rows}):
        per = out.setdefault(str(size), {})
        for v in dict.fromkeys(r["variant"] for r in dip_rows if r["size"] == size):
            rows = [r for r in dip_rows if r["size"] == size and r["variant"] == v
                    and r["case"] in tv]

            def stats(sel):
                d_best = [r["dip_tv"]["psnr"] - tv[r["case"]]["tv_best"]["psnr"] for r in sel]
                d_def = [r["dip_tv"]["psnr"] - tv[r["case"]]["tv_default"]["psnr"] for r in sel]
                return {"images": len(sel),
                        "dip_psnr": float(np.mean([r["dip_tv"]["psnr"] for r in sel])),
                        "dip_ssim": float(np.mean([r["dip_tv"]["ssim"] for r in sel])),
                        "tv_best_psnr": float(np.mean([tv[r["case"]]["tv_best"]["psnr"]
                                                       for r in sel])),
                        "tv_default_psnr": float(np.mean([tv[r["case"]]["tv_default"]["psnr"]
                                                          for r in sel])),
                        "dip_minus_tv_best": float(np.mean(d_best)),
                        "dip_minus_tv_best_min": float(np.min(d_best)),
                        "dip_minus_tv_default": float(np.mean(d_def)),
                        "dip_at_least_tv_best": int(sum(x >= 0 for x in d_best)),
                        "dip_time_s": float(np.mean([r["dip_tv"]["time_s"] for r in sel])),
                        **_heldout_stop_stats(sel)}

            if not rows:
                continue
            per[v] = {"changes": rows[0]["changes"], "all": stats(rows),
                      "families": {f: stats([r for r in rows if r["family"] == f])
                                   for f in sorted({r["family"] for r in rows})}}
    return out


def _heldout_stop_stats(rows: list[dict]) -> dict:
    """Mean PSNR at the held-out stop, at the trace's peak (oracle) and at the end; {} if
    the rows were not fitted with ``heldout_every``."""
    if not rows or not all("heldout_stop" in r for r in rows):
        return {}
    stop = [r["heldout_stop"]["psnr"] for r in rows]
    return {"heldout_stop_psnr": float(np.mean(stop)),
            "heldout_peak_psnr": float(np.mean([r["heldout_stop"]["peak_psnr"] for r in rows])),
            "heldout_stop_minus_end": float(np.mean(
                [a - r["dip_tv"]["psnr"] for a, r in zip(stop, rows)])),
            "heldout_stop_iteration": [r["heldout_stop"]["iteration"] for r in rows]}


def run_reconstruct_case(case: dict, changes: dict, uncertainty: dict | None = None) -> dict:
    """``ctuq.reconstruct`` of the case's scan (noise draw 0) with DIP overrides ``changes``.

    The default pipeline (its model-error term included) apart from
    ``changes`` (``dip`` fields, e.g. ``warm_start``) and ``uncertainty``
    overrides; seed = the image index, CPU. Scores (:func:`ctuq.bench.scores.score`)
    of the Laplace posterior std alone (``posterior``) and of the total std
    (``total``): ±1/2/3σ coverage, log-likelihood, PSNR; ``dip_image``: PSNR
    and SSIM of the DIP fit itself (the reconstruction unless the method
    shows another, e.g. ``mean = 'linear'``).
    """
    import ctuq
    from ctuq.bench.cases import sinogram
    from ctuq.bench.scores import score
    from ctuq.recon.config import ReconstructionConfig

    scan = simulate(case, offset=0)
    config = ReconstructionConfig(seed=case["index"], device="cpu", threads=1, dip=changes,
                                  uncertainty=uncertainty or {})
    t0 = time.perf_counter()
    result = ctuq.reconstruct(sinogram(scan, with_truth=False), config)
    keep = ("psnr", "ssim", "coverage_1", "coverage_2", "coverage_3", "pixel_log_likelihood",
            "mean_std", "coverage_2_edges")
    x_hat = result.reconstruction
    return {"case": case["id"], "family": case["family"], "size": case["size"],
            "condition": case["condition"], "changes": changes,
            "uncertainty": uncertainty or {}, "time_s": time.perf_counter() - t0,
            "dip_image": image_metrics(scan.truth, result.dip),
            "stages_s": result.provenance.get("stages", {}).get("seconds", {}),
            "posterior": {k: v for k, v in score(scan.truth, x_hat, result.posterior_std).items()
                          if k in keep},
            "total": {k: v for k, v in score(scan.truth, x_hat, result.std).items()
                      if k in keep}}
