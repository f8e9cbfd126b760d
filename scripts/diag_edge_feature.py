#!/usr/bin/env python
"""How sharp can one calibration of the model-error variance be, per edge feature?

For the kept arrays of a ``scripts/bench_calibration.py --arrays DIR`` run (truth, image
``x̂``, posterior variance), the variance ``a · var_post + t0² mean(var_post) + s1² f(x̂)²``
is fitted to the images' own errors, one ``(t0, s1)`` (and ``a``) for all images, by the
summed per-pixel Gaussian log-likelihood, for four edge features ``f``: the shipped
``edge_strength`` (the largest 4-neighbour difference within one pixel, ``max3``), the
neighbour difference itself (``nd``), its 3×3 mean (``mean3``) and the 3×3 mean of
``max3`` (``max3_mean3``). An oracle on the images it is fitted to (a bound on what a
global calibration of that form can do, not a setting); ``--default-s1`` scores the
shipped form at ``t0 = 0`` beside it.

One JSON document on stdout: per feature and fit the coefficients and the mean ±1σ and
±2σ coverage, ±2σ on the truth's edges, per-pixel log-likelihood, mean std / RMSE and
the worst image's ±2σ.

Usage::

    python scripts/diag_edge_feature.py --arrays rows_arrays > doc.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import minimize

from ctuq.recon.model_error.edges import edge_mask, edge_strength, neighbour_difference


def _mean3(x: torch.Tensor) -> np.ndarray:
    return F.avg_pool2d(x[None, None], 3, 1, 1, count_include_pad=False)[0, 0].numpy()


def features(x: np.ndarray) -> dict[str, np.ndarray]:
    nd, e = neighbour_difference(x), edge_strength(x)
    return {"max3": e.numpy(), "nd": nd.numpy(), "mean3": _mean3(nd), "max3_mean3": _mean3(e)}


def scores(var, err, edges) -> dict:
    z = np.abs(err) / np.sqrt(var)
    return {"coverage_1": float(np.mean(z < 1)), "coverage_2": float(np.mean(z < 2)),
            "coverage_2_edges": float(np.mean(z[edges] < 2)) if edges.any() else 1.0,
            "pixel_log_likelihood": float(np.mean(-0.5 * np.log(2 * np.pi * var)
                                                  - 0.5 * err**2 / var)),
            "std_over_rmse": float(np.mean(np.sqrt(var)) / np.sqrt(np.mean(err**2)))}


def load(folder) -> list[dict]:
    images = []
    for path in sorted(Path(folder).glob("*.npz")):
        z = np.load(path)
        x, truth = z["x_hat"].astype(np.float64), z["truth"].astype(np.float64)
        images.append({"name": path.stem, "err": x - truth, "vp": z["var_post"],
                       "feats": features(x), "edges": edge_mask(truth).numpy()})
    return images


def summary(images, feat, a, t0, s1) -> dict:
    per = [scores(a * d["vp"] + t0**2 * d["vp"].mean() + s1**2 * d["feats"][feat]**2 + 1e-12,
                  d["err"], d["edges"]) for d in images]
    out = {k: float(np.mean([p[k] for p in per])) for k in per[0]}
    out["coverage_2_worst"] = min(p["coverage_2"] for p in per)
    return out


def fit(images, feat, free_a: bool) -> tuple[float, float, float]:
    def nll(lp):
        a = float(np.exp(lp[2])) if free_a else 1.0
        return -summary(images, feat, a, *np.exp(lp[:2]))["pixel_log_likelihood"]

    res = minimize(nll, [np.log(0.01), np.log(0.3)] + ([0.0] if free_a else []),
                   method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-7})
    t0, s1 = (float(v) for v in np.exp(res.x[:2]))
    return (float(np.exp(res.x[2])) if free_a else 1.0), t0, s1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrays", required=True, help="a bench_calibration --arrays folder")
    ap.add_argument("--default-s1", type=float, default=0.2789,
                    help="s1 of the shipped form scored beside the fits (dip-64's)")
    args = ap.parse_args(argv)
    images = load(args.arrays)
    doc = {"arrays": args.arrays, "images": len(images), "fits": {},
           "shipped_form": {"feature": "max3", "t0": 0.0, "s1": args.default_s1,
                            **summary(images, "max3", 1.0, 0.0, args.default_s1)}}
    for feat in ("max3", "nd", "mean3", "max3_mean3"):
        for free_a in (False, True):
            a, t0, s1 = fit(images, feat, free_a)
            doc["fits"][f"{feat}{' +a' if free_a else ''}"] = {
                "a": a, "t0": t0, "s1": s1, **summary(images, feat, a, t0, s1)}
    json.dump(doc, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
