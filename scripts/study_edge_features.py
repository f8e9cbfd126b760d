#!/usr/bin/env python
"""How much of the interval's width the edge feature decides: an oracle on kept arrays.

The held-out and calibrated model errors add ``t0² v̄ + s1² e(x̂)²`` to the
posterior variance, ``e`` the edge feature (``ctuq.recon.model_error.edges``).
For each candidate feature this fits, against each image's own truth, the
variance ``a·var_post + t0² v̄ + s1² e²`` (an oracle: ``a``, ``t0``, ``s1`` per
image) and one ``(t0, s1)`` for the whole set (``a = 1``), and scores both
(±1σ, ±2σ, per-pixel log-likelihood, mean std over RMSE). Features:

- ``max3``: today's, the neighbour difference under a 3×3 maximum filter;
- ``neighbour``: the bare neighbour difference;
- ``gradient``: the central-difference gradient's magnitude;
- ``mean3``: the neighbour difference under a 3×3 mean filter.

Exploratory (docs/real_scans.md): no setting of ctuq. One JSON document on stdout.

Usage::

    python scripts/study_edge_features.py --partial val.jsonl --arrays val_arrays \\
        --suffix _autoc > study.json
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import minimize

from ctuq.bench.runner import dump_json, read_cases
from ctuq.bench.scores import summarise_images
from ctuq.bench.tuning import kept_case, score_variance
from ctuq.recon.model_error.edges import neighbour_difference

def features(x) -> dict:
    """The candidate edge features of an image ``(H, W)``, each ``(H, W)`` float64."""
    nd = neighbour_difference(x)
    t = torch.as_tensor(np.asarray(x)).double()
    gy, gx = torch.zeros_like(t), torch.zeros_like(t)
    gy[1:-1], gx[:, 1:-1] = (t[2:] - t[:-2]) / 2, (t[:, 2:] - t[:, :-2]) / 2
    pooled = nd[None, None]
    return {"max3": F.max_pool2d(pooled, 3, 1, 1)[0, 0], "neighbour": nd,
            "gradient": (gx ** 2 + gy ** 2).sqrt(),
            "mean3": F.avg_pool2d(pooled, 3, 1, 1, count_include_pad=False)[0, 0]}


def _nll(log_scales, r2, vp, vbar, e2):
    a, t0, s1 = np.exp(2 * np.asarray(log_scales))
    var = a * vp + t0 * vbar + s1 * e2
    return 0.5 * np.mean(r2 / var + np.log(var))


#: The scores of each variance map (``ctuq.bench.tuning.score_variance``), mean and worst.
KEYS = ("coverage_1", "coverage_2", "pixel_log_likelihood", "std_over_rmse")


def study(images: list[tuple]) -> dict:
    """``images``: ``(truth, x̂, var_post)`` arrays ``(H, W)``. Per feature, the oracle's
    and the global fit's scores (``<key>_mean``, ``<key>_worst``)."""
    out = {}
    for name in features(images[0][1]):
        data, oracle = [], []
        for truth, x_hat, var_post in images:
            r2 = ((np.asarray(truth, float) - np.asarray(x_hat, float)) ** 2).ravel()
            vp = np.asarray(var_post, float).ravel()
            e2 = (features(x_hat)[name].numpy() ** 2).ravel()
            d = (r2, vp, vp.mean(), e2)
            data.append(d)
            fit = min((minimize(_nll, np.log(start), args=d, method="Nelder-Mead",
                                options={"maxiter": 2000, "xatol": 1e-4, "fatol": 1e-8})
                       for start in ((1, 0.1, 0.3), (0.3, 0.01, 0.1))), key=lambda o: o.fun)
            a, t0, s1 = np.exp(2 * fit.x)
            oracle.append(score_variance(truth, x_hat, (a * vp + t0 * d[2] + s1 * e2)
                                         .reshape(np.shape(truth))))

        def set_nll(log_ts):
            return np.mean([_nll(np.r_[0.0, log_ts], *d) for d in data])

        g = minimize(set_nll, np.log([0.1, 0.3]), method="Nelder-Mead")
        t0, s1 = np.exp(2 * g.x)
        pooled = [score_variance(truth, x_hat, (d[1] + t0 * d[2] + s1 * d[3])
                                 .reshape(np.shape(truth)))
                  for (truth, x_hat, _), d in zip(images, data)]
        out[name] = {"oracle": summarise_images(oracle, KEYS),
                     "global": {**summarise_images(pooled, KEYS), "t0": float(math.sqrt(t0)),
                                "s1": float(math.sqrt(s1))}}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--suffix", default="", help="the variant whose arrays to read (e.g. _autoc)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    images, ids = [], []
    for case_id in sorted(read_cases(args.partial, "id")):
        kept = kept_case(args.arrays, case_id, args.suffix)
        if kept is not None:
            _, truth, x_hat, var_post = kept
            images.append((truth, x_hat.numpy(), var_post.numpy()))
            ids.append(case_id)
    dump_json({"partial": args.partial, "suffix": args.suffix, "cases": ids,
               "features": study(images) if images else {}})


if __name__ == "__main__":
    main()
