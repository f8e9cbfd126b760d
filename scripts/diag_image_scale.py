#!/usr/bin/env python
"""Can a scan tell how wide its own interval should be? Per-image scale signals, measured.

The default's total variance ``v`` (posterior + held-out model error, the coefficients as
the run's preset fits them) is right on average and wrong per image: the factor that makes
it honest for one image, ``k* = mean((x̂ − x)² / v)`` (the per-pixel likelihood's optimum
of ``k · v``), spans a decade across scans. For the kept arrays of a
``scripts/bench_calibration.py --arrays DIR`` run this script scores

- ``oracle``: every image's ``v`` scaled by its own ``k*`` (a bound, it needs the truth);
- ``heldout_scale``: ``v`` scaled by the factor ``c`` the held-out projections' likelihood
  prefers for the whole predicted covariance ``c (M_post + t0² M_const + s1² M_edge) + σ²``
  (the held-out likelihood of docs/method.md §8.2 with one more free factor);
- ``heldout_posterior``: only the posterior's part scaled, by the factor ``a`` that
  likelihood prefers, under a log-normal prior of width 0.5 centred on 1;
- ``posterior_power p``: the posterior variance's shape sharpened, ``v_post (v_post /
  mean v_post)^(p − 1)``, with one global ``(k, s1)`` fitted to all images' errors (an
  oracle of the global kind) and with the per-image oracle;

and the rank correlation of ``k*`` with each truth-free signal, including the two DIP
fits' difference ``mean((x̂ − c x̂_in)² / v)`` (``x̂_in`` the held-out fit's image, ``c``
its least-squares scale to ``x̂``).

One JSON document on stdout: per candidate the mean and the worst image of ±1σ and ±2σ
coverage, ±2σ on the truth's edges, the per-pixel log-likelihood, Spearman and mean std /
RMSE (as ``tune_heldout_prior.py`` scores them); per image ``k*`` and the signals.

Usage::

    python scripts/diag_image_scale.py --partial rows.jsonl --arrays rows_arrays \\
        --calibration ctuq/recon/model_error_defaults/dip-64.json > doc.json
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from scipy.stats import spearmanr

from ctuq.bench.runner import dump_json, read_cases
from ctuq.bench.tuning import kept_case, row_fit_excess, score_variance, summarise
from ctuq.recon.model_error import ModelErrorCoefficients
from ctuq.recon.model_error.edges import edge_strength
from ctuq.recon.model_error.terms import fit_rule

POSTERIOR_PRIOR_WIDTH = 0.5


def _heldout_nll(lik, post_scale: float, t0: float, s1: float) -> float:
    """The held-out residuals' summed negative log-likelihood with the posterior's part
    ``M_post`` scaled by ``post_scale`` (the run's held-out likelihood otherwise)."""
    scaled = dataclasses.replace(lik, M_post=post_scale * lik.M_post)
    return len(lik.r) * scaled._nll_at_variances([t0 ** 2, s1 ** 2])


def image_case(row, arrays, prior) -> dict | None:
    kept = kept_case(arrays, row["id"])
    if kept is None or kept[0] is None:
        return None
    lik, truth, x_hat, var_post = kept
    co = lik.fit(prior, 0.1, **fit_rule("checked", row_fit_excess(row, x_hat)))
    post = var_post.numpy().astype(np.float64)
    edge2 = edge_strength(x_hat).numpy().astype(np.float64) ** 2
    model = co.t0 ** 2 * post.mean() + co.s1 ** 2 * edge2
    x = x_hat.numpy().astype(np.float64)
    # c (M_post + t0² M_const + s1² M_edge): the posterior scaled by c, the coefficients by √c
    c = math.exp(minimize_scalar(lambda lc: _heldout_nll(
        lik, math.exp(lc), math.exp(lc / 2) * co.t0, math.exp(lc / 2) * co.s1),
        bounds=(-6, 6), method="bounded").x)
    a = math.exp(minimize_scalar(lambda la: _heldout_nll(lik, math.exp(la), co.t0, co.s1)
                                 + 0.5 * la ** 2 / POSTERIOR_PRIOR_WIDTH ** 2,
                                 bounds=(-6, 3), method="bounded").x)
    x_in = lik.image.astype(np.float64)
    total = post + model
    d = x - (x * x_in).sum() / (x_in * x_in).sum() * x_in
    err = x - truth.astype(np.float64)
    return {"id": row["id"], "truth": truth, "x_hat": x_hat, "err": err,
            "post": post, "model": model, "edge2": edge2,
            "k_star": float(np.mean(err ** 2 / total)), "heldout_scale": c,
            "heldout_posterior": a, "fit_difference": float(np.mean(d ** 2 / total))}


def _power(c, p):
    return c["post"] * (c["post"] / c["post"].mean()) ** (p - 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--calibration", required=True, help="the preset's calibration file")
    ap.add_argument("--powers", default="1,1.25,1.5,2")
    args = ap.parse_args(argv)
    prior = ModelErrorCoefficients.load(args.calibration)
    cases = [c for r in sorted(read_cases(args.partial).values(), key=lambda r: r["id"])
             if (c := image_case(r, args.arrays, prior)) is not None]
    if not cases:
        raise SystemExit(f"no arrays of {args.partial} in {args.arrays}")

    def scored(variances):
        return summarise([score_variance(c["truth"], c["x_hat"], v)
                          for c, v in zip(cases, variances)])

    total = [c["post"] + c["model"] for c in cases]
    candidates = {
        "default": scored(total),
        "oracle": scored([v * c["k_star"] for c, v in zip(cases, total)]),
        "heldout_scale": scored([v * c["heldout_scale"] for c, v in zip(cases, total)]),
        "heldout_posterior": scored([c["heldout_posterior"] * c["post"] + c["model"]
                                     for c in cases]),
    }
    for p in (float(s) for s in args.powers.split(",")):
        def nll(log_ks, p=p):
            k, s1 = np.exp(log_ks)
            var = [k * (_power(c, p) + s1 ** 2 * c["edge2"]) for c in cases]
            return sum(np.mean(0.5 * np.log(2 * np.pi * v) + 0.5 * c["err"] ** 2 / v)
                       for c, v in zip(cases, var))
        k, s1 = np.exp(minimize(nll, [0.0, math.log(0.2)], method="Nelder-Mead").x)
        shaped = [_power(c, p) + s1 ** 2 * c["edge2"] for c in cases]
        candidates[f"posterior_power {p:g}"] = {"k": k, "s1": s1, **scored([k * v for v in shaped])}
        candidates[f"posterior_power {p:g} oracle"] = scored(
            [v * np.mean(c["err"] ** 2 / v) for c, v in zip(cases, shaped)])
    k_star = [c["k_star"] for c in cases]
    signals = ("heldout_scale", "heldout_posterior", "fit_difference")
    dump_json({"partial": args.partial, "calibration": args.calibration, "images": len(cases),
               "candidates": candidates,
               "spearman_with_k_star": {s: float(spearmanr(k_star, [c[s] for c in cases])[0])
                                        for s in signals},
               "cases": [{k: c[k] for k in ("id", "k_star", *signals)} for c in cases]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
