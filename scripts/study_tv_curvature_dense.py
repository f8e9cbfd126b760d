#!/usr/bin/env python
"""The TV term's curvature in the posterior, computed exactly (dense) on 64² scans.

For each scan of ``--cases-from`` (a ``bench_calibration.py`` document or rows file) the
default reconstruction runs as the pipeline runs it; its state before the metrics stage
(the fit's normalised units) is kept, and then, densely in image space:

- ``dense``: ``Σx = J H⁻¹ Jᵀ`` with the EM's prior and ``σ²`` (Woodbury in observation
  space; its diagonal is the posterior variance the pipeline estimates from samples);
- ``k{κ}_{i}``: ``J (H + Jᵀ Dᵀ diag(c) D J)⁻¹ Jᵀ``, ``c = κγ/(2σ_d²ξ)`` as
  ``ctuq.recon.tv_curvature`` makes it, with ``ξ`` from the exact variance of the
  differences under ``Σx`` (``i = 0``, what the product approximates with the E-step
  samples) and once more under the result (``i = 1``, a second variational step);

each with the held-out model error refitted as the pipeline fits it (the same held-out
likelihood and rule, the new posterior variance), scored against the truth. One JSON line
per scan on stdout: per variant the scores of ``ctuq.bench.tuning.score_variance`` (±1σ,
±2σ, ±3σ, on edges, the per-pixel log-likelihood, mean std / RMSE) and the held-out
coefficients.

The pipeline's state and the held-out likelihood's arguments are captured by wrapping
its stage functions (a study, not an interface). Memory: a dense 4096² covariance and the
4096 × d_θ Jacobian (about 1 GB at 64²); a scan takes 3–4 minutes on one core.

Usage::

    python scripts/study_tv_curvature_dense.py --cases-from rows.jsonl --factors 3,10,30 \\
        > dense.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch


def _capture():
    """Wrap the pipeline's stages and the held-out likelihood; returns the capture dict."""
    import ctuq.recon.model_error.heldout as heldout
    import ctuq.recon.pipeline as pipeline

    got: dict = {}

    def wrap(name, stage):
        def run(s):
            stage(s)
            if name == "model error":  # still in the fit's normalised units
                got.update(problem=s.problem, dip=s.dip, outcome=s.outcome,
                           coefficients=s.model_error.coefficients,
                           model_error=s.model_error.variance.detach().double().cpu().numpy(),
                           x_shown=s.outcome.reconstruction.detach().double().cpu())
        return run

    pipeline.STAGES = tuple((n, wrap(n, f)) for n, f in pipeline.STAGES)
    make, fit = heldout.heldout_likelihood, heldout.HeldoutLikelihood.fit

    def make_kept(*a, **k):
        got["heldout_args"] = (a, k)
        return make(*a, **k)

    def fit_kept(self, *a, **k):
        got["fit_args"] = (a, k)
        return fit(self, *a, **k)

    heldout.heldout_likelihood, heldout.HeldoutLikelihood.fit = make_kept, fit_kept
    got["make"], got["fit"] = make, fit
    return got


def _refit(got, var_post):
    """The held-out coefficients and model-error variance with another posterior variance."""
    a, k = got["heldout_args"]
    a = list(a)
    a[4] = torch.as_tensor(var_post)           # heldout_likelihood's posterior_variance
    lik = got["make"](*a, **k)
    fa, fk = got["fit_args"]
    co = got["fit"](lik, *fa, **fk)
    return co, co.variance(got["x_shown"], torch.as_tensor(var_post)).numpy()


def one_scan(case, run, factors, got, predcp: bool = False) -> dict:
    import ctuq
    from ctuq.bench.calibration import reconstruction_config
    from ctuq.bench.cases import simulate, sinogram
    from ctuq.bench.tuning import score_variance
    from ctuq.posterior.likelihood import dense_matrix
    from ctuq.recon.tv_curvature import differences, tv_curvature_weights

    t0 = time.perf_counter()
    scan = simulate(case)
    res = ctuq.reconstruct(sinogram(scan, with_truth=False),
                           reconstruction_config(case, run, {}, predcp=predcp))
    post, lin = got["outcome"].posterior.fitted, got["outcome"].posterior.linearization
    sigma2 = float(post.noise_var)
    del res
    h, w = lin.image_shape[-2:]
    n = h * w
    with torch.no_grad():
        rows, unit = [], torch.eye(n, dtype=torch.float32)
        for i in range(0, n, 256):                 # Lᵀ Jᵀ e_i, so that J Σ Jᵀ = R Rᵀ
            u = unit[i:i + 256].reshape(-1, h, w)
            rows.append(post.prior.cov_sqrt(lin.vjp(u).double(), transpose=True).float())
        R = torch.cat(rows)
        prior_cov = (R @ R.T).double()
        del R, rows, unit
        A = dense_matrix(post.likelihood.operator)  # V^{-1/2} A
        AS = A @ prior_cov
        K = AS @ A.T + sigma2 * torch.eye(A.shape[0], dtype=torch.float64)
        cov = prior_cov - AS.T @ torch.cholesky_solve(AS, torch.linalg.cholesky(K))
        del AS, K, prior_cov
        evals, U = torch.linalg.eigh(cov)
        Q = U * evals.clamp_min(0).sqrt()          # Σx = Q Qᵀ
        del U
        DQ = differences(Q.T.reshape(-1, h, w)).T  # D Q, [K, n]
        var = {"dense": cov.diagonal().clamp_min(0).reshape(h, w).numpy()}
        gamma, sigma_d = float(got["dip"].tv_weight), float(got["problem"].noise.std)
        x_hat = lin.x_hat.reshape(h, w)
        eye = torch.eye(Q.shape[1], dtype=torch.float64)
        var_d_dense = DQ.square().sum(1)           # Var d under Σx: every κ's first step
        for kappa in factors:
            var_d = var_d_dense
            for it in range(2):
                c = tv_curvature_weights(x_hat, var_d, factor=kappa, tv_weight=gamma,
                                         noise_std=sigma_d)
                B = c.sqrt()[:, None] * DQ
                L = torch.linalg.cholesky(eye + B.T @ B)
                W = torch.linalg.solve_triangular(L, Q.T, upper=False)   # Σx' = Wᵀ W
                var[f"k{kappa:g}_{it}"] = W.square().sum(0).reshape(h, w).numpy()
                var_d = torch.linalg.solve_triangular(L, DQ.T, upper=False).square().sum(0)
    # scored in data units (the fit's times the data scale s), as bench_calibration scores
    s = float(got["problem"].scale)
    truth, shown = np.asarray(scan.truth, np.float64), got["x_shown"].numpy() * s
    s2 = s * s
    out = {"id": case["id"], "data_scale": s, "sigma2": sigma2, "sigma_d": sigma_d,
           "tv_weight": gamma, "pipeline_coefficients": [got["coefficients"].t0,
                                                         got["coefficients"].s1],
           "variants": {}}
    pipeline_var = np.asarray(got["outcome"].variance, np.float64).reshape(h, w)
    out["pipeline"] = score_variance(truth, shown,
                                     s2 * (pipeline_var + got["model_error"].reshape(h, w)))
    for name, v in var.items():
        co, me = _refit(got, v)
        out["variants"][name] = {**score_variance(truth, shown, s2 * (v + me)),
                                 "posterior_alone": score_variance(truth, shown, s2 * v),
                                 "coefficients": [co.t0, co.s1]}
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv=None) -> int:
    from ctuq.bench.calibration import CalibrationRun
    from ctuq.bench.cases import case_spec
    from ctuq.bench.runner import read_cases

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases-from", required=True, help="bench_calibration rows (JSON lines)")
    ap.add_argument("--factors", default="3,10,30", help="values of κ")
    ap.add_argument("--limit", type=int, default=None, help="the first N scans only")
    ap.add_argument("--predcp", action="store_true",
                    help="with the TV-PredCP hyperprior (not the default)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = read_cases(args.cases_from, "id")
    cases = [case_spec(rows[k]) for k in rows][:args.limit]
    run = CalibrationRun(threads=1, predcp_variants=(args.predcp,), mc_dropout=False)
    got = _capture()
    factors = [float(f) for f in args.factors.split(",")]
    for case in cases:
        print(json.dumps(one_scan(case, run, factors, got, args.predcp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
