#!/usr/bin/env python
"""Two variants of the held-out model error, scored on the kept arrays of a validation run.

Both refit the stored held-out likelihoods of a ``bench_calibration.py
--arrays`` run (docs/defaults.md, "The calibration as a lower bound"):

- ``half_normal``: instead of holding ``t0`` at zero where the calibration
  has none, a half-normal prior of scale τ on it (τ in units of the RMS
  posterior std, as ``t0``), the log-normal of width ``--width`` on ``s1``
  and the calibration as a floor under ``s1``;
- ``posterior_scale``: a third coefficient ``p`` on the posterior variance,
  ``p·var_post + s0² + s1² e²``. Fitted on the held-out projections (the
  maximum likelihood of ``(p, t0², s1²)``), and, against the truth, the
  grid ``p × {1, 1.25, 1.5}·s1_cal`` with ``t0 = 0``: what the held-out data
  choose beside what the truth prefers.

Exploratory: neither is a setting of ctuq. One JSON document on stdout.

Usage::

    python scripts/study_heldout_variants.py --partial val.jsonl --arrays val_arrays \\
        --calibration ctuq/recon/model_error_defaults/dip-64.json > study.json
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from scipy.optimize import minimize

from ctuq.bench.runner import dump_json, read_cases
from ctuq.bench.tuning import kept_cases, score_total, score_variance, summarise
from ctuq.recon.model_error import ModelErrorCoefficients, edge_strength
from ctuq.recon.model_error.coefficients import _VAR_MIN
from ctuq.recon.model_error.names import HELDOUT


def _half_normal_fit(lik, calibration, tau: float, width: float) -> ModelErrorCoefficients:
    """MAP of ``(t0², s1²)``: half-normal of scale ``tau`` on ``t0``, log-normal of ``width``
    on ``s1`` around the calibration, then ``s1`` at least the calibration's."""
    centre = math.log(calibration.s1)

    def objective(v):
        total, grad = lik._total_nll_and_grad(v)
        if math.isfinite(tau):
            total += 0.5 * v[0] / tau ** 2
            grad[0] += 0.5 / tau ** 2
        z = (0.5 * math.log(v[1]) - centre) / width
        total += 0.5 * z * z
        grad[1] += z / width * 0.5 / v[1]
        return total, grad

    best = minimize(objective, np.array([1e-2, 1e-2]), jac=True, method="L-BFGS-B",
                    bounds=[(_VAR_MIN, 1e8)] * 2,
                    options={"ftol": 1e-13, "gtol": 1e-8, "maxiter": 500})
    t0, s1 = (math.sqrt(v) if v > _VAR_MIN else 0.0 for v in best.x)
    return ModelErrorCoefficients(t0, max(s1, calibration.s1), HELDOUT)


def _posterior_scale_fit(lik) -> tuple[float, float, float]:
    """Held-out maximum likelihood of ``(p, t0², s1²)`` with ``M = p M_post + t0² M_const +
    s1² M_edge + noise``."""
    parts = [torch.as_tensor(m) for m in (lik.M_post, lik.M_const, lik.M_edge)]
    noise = lik.noise_var * (torch.as_tensor(lik.ray_variance)
                             if lik.ray_variance is not None else torch.ones(len(lik.r)))
    r = torch.as_tensor(lik.r)

    def objective(v):
        M = sum(float(vk) * Mk for vk, Mk in zip(v, parts)) + torch.diag(noise.double())
        L, info = torch.linalg.cholesky_ex(M)
        if int(info):
            return 1e300, np.zeros(3)
        alpha = torch.cholesky_solve(r[:, None], L)[:, 0]
        inv = torch.cholesky_inverse(L)
        total = float(0.5 * r @ alpha + torch.log(torch.diagonal(L)).sum())
        return total, np.array([0.5 * (float((inv * Mk).sum()) - float(alpha @ (Mk @ alpha)))
                                for Mk in parts])

    best = minimize(objective, np.array([1.0, 1e-2, 1e-2]), jac=True, method="L-BFGS-B",
                    bounds=[(1e-6, 1e4)] * 3,
                    options={"ftol": 1e-13, "gtol": 1e-8, "maxiter": 500})
    p, v0, v1 = best.x
    return float(p), math.sqrt(v0), math.sqrt(v1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--calibration", required=True, help="the preset's calibration file")
    ap.add_argument("--taus", default="0.1,0.25,0.5,1,inf")
    ap.add_argument("--width", type=float, default=0.1)
    ap.add_argument("--scales", default="0.1,0.25,0.5,1")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    cal = ModelErrorCoefficients.load(args.calibration)
    taus = [float(t) for t in args.taus.split(",")]
    scales = [float(p) for p in args.scales.split(",")]
    per: dict[str, list] = {}
    cases = []
    for r, lik, truth, x_hat, var_post in kept_cases(read_cases(args.partial, "id").values(),
                                                     args.arrays):
        row = {"id": r["id"], "condition": r["condition"]}
        for tau in taus:
            co = _half_normal_fit(lik, cal, tau, args.width)
            s = score_total(truth, x_hat, var_post, co)
            per.setdefault(f"half_normal {tau}", []).append(s)
            row[f"half_normal {tau}"] = {"t0": co.t0, "s1": co.s1, **s}
        p, t0, s1 = _posterior_scale_fit(lik)
        e2 = edge_strength(x_hat).double().square()
        mean_var = var_post.double().mean()  # s0² = t0² · rms(std_post)²
        s = score_variance(truth, x_hat,
                           p * var_post.double() + t0 ** 2 * mean_var + s1 ** 2 * e2)
        per.setdefault("posterior_scale heldout", []).append(s)
        row["posterior_scale heldout"] = {"p": p, "t0": t0, "s1": s1, **s}
        for q in scales:
            for f in (1.0, 1.25, 1.5):
                name = f"posterior_scale {q} s1x{f}"
                s = score_variance(truth, x_hat,
                                   q * var_post.double() + (f * cal.s1) ** 2 * e2)
                per.setdefault(name, []).append(s)
                row[name] = s
        cases.append(row)
    dump_json({"split": "validation", "calibration": args.calibration, "width": args.width,
               "summary": {k: summarise(v) for k, v in per.items()}, "cases": cases,
               "seconds": time.perf_counter() - t_start})


if __name__ == "__main__":
    main()
