"""Choosing IVON-DIP's settings on validation data: a grid of configurations per scan.

:func:`run_case` fits the Adam DIP of one scan once and continues it (or
starts afresh) with each configuration of IVON, scoring the mean and the
sample mean (:func:`ctuq.bench.scores.sample_scores`); :func:`aggregate`
averages per configuration; :func:`choose` picks the best mean
log-likelihood among the configurations that never failed.
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np

from ctuq.bench.runner import append_case
from ctuq.bench.scores import sample_scores

log = logging.getLogger("tune_ivon_dip")

VALIDATION_SEED0 = 1000      # phantom seeds / digit indices 1000…1099
VALIDATION_NOISE0 = 5000     # noise seeds 5000…5999
FAMILIES = ("ellipses", "rectangles", "shepp-variant", "digits")
ANGLES = {28: 20, 64: 60}
LL_FLOOR = 1e-6
MAX_STEP = 0.003             # lr · hess_init · clip_radius: IVON's largest step per weight


def grid(name: str) -> list[dict]:
    """The named grid of IVON-DIP settings (``lr = 0.3 / hess_init``, ``clip_radius`` 0.01)."""
    def cfg(start, it, t, h0):
        return {"start": start, "iterations": it, "temperature": t, "hess_init": h0,
                "lr": 0.3 / h0, "clip_radius": MAX_STEP / 0.3}
    if name == "main":
        # the configurations left after a first 30-configuration pass (clamped outputs,
        # docs/ivon.md): 1000-step fits from scratch, h0 = 10 and T = 1 warm starts of 300
        # steps were far behind on every family and are not repeated
        return ([cfg("scratch", 2000, t, 100.0) for t in (0.1, 0.3, 1.0)]
                + [cfg("scratch", 2000, 0.3, 1000.0)]
                + [cfg("dip", 300, t, h0) for t in (3.0, 10.0, 30.0) for h0 in (100.0, 1000.0)]
                + [cfg("dip", 1000, t, h0) for t in (0.3, 1.0) for h0 in (100.0, 1000.0)]
                # the best of the above sat at the grid's corner (T 30, h0 1000): one step out
                + [cfg("dip", 300, t, h0) for t, h0 in ((100.0, 1000.0), (30.0, 3000.0),
                                                        (100.0, 3000.0))])
    if name == "quick":
        return [cfg("scratch", 30, 1.0, 1000.0), cfg("dip", 20, 3.0, 100.0)]
    raise SystemExit(f"unknown grid {name!r}")


def config_key(c: dict) -> str:
    return (f"{c['start']}/it{c['iterations']}/T{c['temperature']:g}/h0{c['hess_init']:g}"
            f"/lr{c['lr']:.3g}/clip{c['clip_radius']:.3g}")


@functools.lru_cache(maxsize=4)
def _digit_stack(size: int, n: int) -> np.ndarray:
    from ctuq.data.phantoms import digits
    return digits(n, size, seed=0)


def validation_image(family: str, index: int, size: int) -> np.ndarray | None:
    """Validation image ``index`` (0…99) of ``family``; None if the family is unavailable."""
    from ctuq.data import phantoms

    seed = VALIDATION_SEED0 + int(index)
    if not 0 <= index < 100:
        raise SystemExit("validation index must be in 0…99")
    if family == "ellipses":
        return phantoms.ellipses(size, seed)
    if family == "rectangles":
        return phantoms.rectangles(size, seed)
    if family == "shepp-variant":
        fn = getattr(phantoms, "shepp_variant", None)
        return None if fn is None else fn(size, seed)
    if family == "digits":
        fn = getattr(phantoms, "digit", None)
        return fn(seed, size) if fn is not None else _digit_stack(size, seed + 1)[seed]
    raise SystemExit(f"unknown family {family!r}")


def split_cases(size: int, per_family: int, families, noise: float) -> list[dict]:
    """Validation cases of the project-wide split (:mod:`ctuq.data.splits`, seeds 10,000+).

    Indices start at 50, apart from the images with which the calibration benchmark's
    validation runs chose the reconstruction defaults (docs/defaults.md).
    """
    from ctuq.data.splits import Case

    out = []
    for fam in families:
        for i in range(50, 50 + per_family):
            c = Case("validation", fam, i, size)
            out.append({"id": f"validation/{fam}/{i}/{size}/{noise:g}", "family": fam,
                        "index": i, "phantom_seed": c.phantom_seed, "size": size,
                        "n_angles": ANGLES.get(size, 60), "noise": noise,
                        "noise_seed": c.noise_seed(0), "image": c.image()})
    return out


def cases(size: int, per_family: int, families, noise: float) -> tuple[list[dict], list[str]]:
    out, skipped = [], []
    for fam in families:
        for i in range(per_family):
            img = validation_image(fam, i, size)
            if img is None:
                skipped.append(fam)
                break
            out.append({"id": f"val/{fam}/{i}/{size}/{noise:g}", "family": fam, "index": i,
                        "phantom_seed": VALIDATION_SEED0 + i, "size": size,
                        "n_angles": ANGLES.get(size, 60), "noise": noise,
                        "noise_seed": VALIDATION_NOISE0 + 100 * FAMILIES.index(fam) + i,
                        "image": img})
    return out, skipped


def scores(truth, centre, std) -> dict:
    """:func:`ctuq.bench.scores.sample_scores` with the variance floor of this tuning."""
    return sample_scores(truth, centre, std, floor=LL_FLOOR)


def run_case(case: dict, configs: list[dict], done: dict, partial: str | None,
             n_samples: int) -> list[dict]:
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.recon.baselines import fbp_reconstruction
    from ctuq.recon.dip import DIPConfig, fit_dip
    from ctuq.recon.ivon_dip import IVONDIPConfig, fit_ivon_dip
    from ctuq.recon.predictive import psnr

    rows = []
    todo = [c for c in configs if (case["id"], config_key(c)) not in done]
    rows += [done[(case["id"], config_key(c))] for c in configs
             if (case["id"], config_key(c)) in done]
    if not todo:
        return rows
    op = RayTransform(Geometry.parallel(case["size"], case["n_angles"]))
    x = case["image"]
    y, sigma = simulate_sinogram(x, op, case["noise"], seed=case["noise_seed"])
    dcfg = DIPConfig.for_image_size(case["size"])
    t0 = time.perf_counter()
    adam = fit_dip(y, op, dcfg, noise_std=sigma)
    adam_s = time.perf_counter() - t0
    base = {"case": case["id"], "family": case["family"], "size": case["size"],
            "fbp_psnr": psnr(x, fbp_reconstruction(y, op)),
            "adam_psnr": psnr(x, adam.reconstruction), "adam_seconds": adam_s}
    for c in todo:
        # the grid names T; ess = d_y / T (IVONDIPConfig.ess = None)
        cfg = IVONDIPConfig(dip=dcfg, n_samples=n_samples, keep_samples=0,
                            **{"ess": None, **c})
        try:
            r = fit_ivon_dip(y, op, cfg, noise_std=sigma,
                             dip_result=adam if c["start"] == "dip" else None)
        except Exception as exc:  # noqa: BLE001 - a diverged configuration is a result
            row = {**base, "config": config_key(c), "settings": c, "error": str(exc)}
        else:
            h = 1.0 / (r.posterior.variance * r.settings.ess) - r.settings.weight_decay
            wall = r.wall_time + (adam_s if c["start"] == "dip" else 0.0)
            row = {**base, "config": config_key(c), "settings": c,
                   "mean": scores(x, r.reconstruction, r.std),
                   "sample_mean": scores(x, r.sample_mean, r.std),
                   "mean_std": float(r.std.mean()), "min_std": float(r.std.min()),
                   "hess_median": float(h.median()),
                   "hess_init_left": float(c["hess_init"] * cfg.beta2 ** c["iterations"]),
                   "seconds": wall}
        log.info("%s %s: %s", case["id"], row["config"],
                 row.get("error") or f"LL {row['mean']['ll']:.3f} cov2 "
                                     f"{row['mean']['coverage']['2']:.3f} PSNR "
                                     f"{row['mean']['psnr']:.2f} ({row['seconds']:.1f} s)")
        append_case(partial, row)
        rows.append(row)
    return rows


def aggregate(rows: list[dict], configs: list[dict]) -> list[dict]:
    out = []
    for c in configs:
        key = config_key(c)
        rs = [r for r in rows if r["config"] == key]
        ok = [r for r in rs if "error" not in r]
        entry = {"config": key, "settings": c, "cases": len(rs), "failed": len(rs) - len(ok)}
        if ok:
            for centre in ("mean", "sample_mean"):
                ll = np.array([r[centre]["ll"] for r in ok])
                entry[centre] = {
                    "ll_mean": float(ll.mean()), "ll_worst": float(ll.min()),
                    "psnr_mean": float(np.mean([r[centre]["psnr"] for r in ok])),
                    "coverage_mean": {k: float(np.mean([r[centre]["coverage"][k] for r in ok]))
                                      for k in ("1", "2", "3")},
                    "coverage2_worst": float(min(r[centre]["coverage"]["2"] for r in ok)),
                    "spearman_mean": float(np.nanmean([r[centre]["spearman"] for r in ok])),
                }
                if all("zero_std_fraction" in r[centre] for r in ok):
                    entry[centre]["zero_std_fraction_mean"] = float(
                        np.mean([r[centre]["zero_std_fraction"] for r in ok]))
                    entry[centre]["coverage2_nonzero_std_mean"] = float(
                        np.nanmean([r[centre]["coverage2_nonzero_std"] for r in ok]))
            entry["mean_std"] = float(np.mean([r["mean_std"] for r in ok]))
            entry["seconds_mean"] = float(np.mean([r["seconds"] for r in ok]))
            entry["hess_median"] = float(np.median([r["hess_median"] for r in ok]))
            entry["hess_init_left"] = ok[0]["hess_init_left"]
            entry["adam_psnr_mean"] = float(np.mean([r["adam_psnr"] for r in ok]))
            entry["fbp_psnr_mean"] = float(np.mean([r["fbp_psnr"] for r in ok]))
        out.append(entry)
    return out


def choose(agg: list[dict]) -> dict:
    """Best mean LL over (configuration, centre); a configuration that failed on any case is out."""
    best = None
    for e in agg:
        if e["failed"] or "mean" not in e:
            continue
        for centre in ("mean", "sample_mean"):
            score = e[centre]["ll_mean"]
            if best is None or score > best["ll_mean"]:
                best = {"config": e["config"], "settings": e["settings"], "centre": centre,
                        "ll_mean": score, **{k: e[centre][k] for k in
                                             ("ll_worst", "psnr_mean", "coverage_mean",
                                              "coverage2_worst", "spearman_mean")},
                        "seconds_mean": e["seconds_mean"]}
    return best
