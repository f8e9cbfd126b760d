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

from ctuq.bench.cases import fit_cases, simulate
from ctuq.bench.scores import image_metrics

__all__ = ["METHODS", "run_case", "run_fit_case", "fit_cases", "summarise", "summary_by"]

METHODS = ("fbp", "tv", "dip_tv")


def run_case(row: dict, arrays) -> dict | None:
    """FBP, TV and the stored DIP+TV of one calibration-benchmark case; None without its arrays.

    ``row``: the case's row of the calibration benchmark; ``arrays``: that
    run's arrays folder (its reconstruction ``x_hat``).
    """
    from ctuq.errors import InputError
    from ctuq.recon.baselines import fbp_reconstruction, tv_reconstruction
    from ctuq.recon.presets import DIP_DEFAULTS

    npz = Path(arrays) / (row["id"].replace("/", "_") + ".npz")
    if not npz.exists():
        return None
    stored = np.load(npz)
    scan = simulate(row)
    truth, op, y, sigma = scan.truth, scan.op, scan.y, scan.sigma
    if not np.array_equal(truth, stored["truth"]):
        raise InputError("the stored truth is not the case's phantom", file=npz, field="truth")
    t0 = time.perf_counter()
    tv = tv_reconstruction(y, op, noise_std=sigma)
    t_tv = time.perf_counter() - t0
    out = {k: row[k] for k in ("id", "family", "size", "condition", "preset")}
    out["methods"] = {"fbp": image_metrics(truth, fbp_reconstruction(y, op)),
                      "tv": {**image_metrics(truth, tv), "time_s": t_tv},
                      "dip_tv": {**image_metrics(truth, stored["x_hat"]),
                                 "time_s": row["times_s"]["dip"],
                                 "iterations": DIP_DEFAULTS[row["preset"]]["iterations"]}}
    out["dip_minus_tv_psnr"] = out["methods"]["dip_tv"]["psnr"] - out["methods"]["tv"]["psnr"]
    out["dip_minus_tv_ssim"] = out["methods"]["dip_tv"]["ssim"] - out["methods"]["tv"]["ssim"]
    return out


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
    preset = preset_name_for_size(c.size)
    cfg = DIPConfig.preset_defaults(preset, device="cpu", progress_every=monitor_every)
    trace = []
    t0 = time.perf_counter()

    def monitor(iteration, image):
        trace.append((iteration, time.perf_counter() - t0, image_metrics(truth, image)["psnr"]))

    dip = fit_dip(y, op, cfg, noise_std=sigma, monitor=monitor)
    reached = next(((it, sec) for it, sec, p in trace if p >= tv["psnr"]), (None, None))
    out = {k: case[k] for k in ("id", "family", "size", "condition")}
    out["preset"] = preset
    out["methods"] = {"fbp": image_metrics(truth, fbp_reconstruction(y, op)), "tv": tv,
                      "dip_tv": {**image_metrics(truth, dip.reconstruction), "time_s": dip.wall_time,
                                 "iterations": cfg.iterations}}
    out["dip_iterations_to_tv_psnr"], out["dip_seconds_to_tv_psnr"] = reached
    out["dip_psnr_trace"] = [[it, round(sec, 2), round(p, 3)] for it, sec, p in trace]
    out["dip_minus_tv_psnr"] = out["methods"]["dip_tv"]["psnr"] - tv["psnr"]
    out["dip_minus_tv_ssim"] = out["methods"]["dip_tv"]["ssim"] - tv["ssim"]
    return out


def summarise(rows: list[dict]) -> dict:
    """Mean scores per method, DIP − TV PSNR (mean, min, max), and how often DIP reached TV."""
    out = {"images": len(rows)}
    for m in METHODS:
        out[m] = {k: float(np.mean([r["methods"][m][k] for r in rows]))
                  for k in rows[0]["methods"][m]}
    d = [r["dip_minus_tv_psnr"] for r in rows]
    out["dip_minus_tv_psnr"] = {"mean": float(np.mean(d)), "min": float(np.min(d)),
                                "max": float(np.max(d))}
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
