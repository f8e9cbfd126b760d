"""Benchmark the sample-based evidence (EM / MacKay) against the exact evidence.

Prints one JSON document on stdout (progress on stderr). On digit phantoms
(28×28, 20 angles, 5 % noise; the reference U-net fitted by DIP+TV), per case:

- the exact-evidence oracle: dense ``Φ`` (float64) and the L-BFGS optimum of
  the exact log evidence over the block variances and ``σ²`` (time to build
  and to optimise);
- sample-based EM (MacKay, CG sampler, no PredCP) for k ∈ {1, 2, 8, 32}:
  wall time, EM steps, the exact log evidence at its hyperparameters, and
  the error of its last ``γ̂`` against the exact ``γ`` at the same
  hyperparameters;
- sample-based EM with TV-PredCP (k = 8, lengthscales learned);
- the per-pixel test log-likelihood of the ground truth under
  ``N(x̂, diag Cov[x|y])`` and the ±2σ coverage, with the exact posterior
  variance for the hyperparameters of (a) untuned defaults (``a_b = 1``,
  ``ℓ_b = 0.1``, ``σ²`` = the true noise variance), (b) the exact optimum,
  (c) sample-based EM (each k), (d) sample-based EM + TV-PredCP; for (c, k=8)
  also with the sample-based std of 128 fresh posterior draws.

Targets (checked as booleans): (c, k=8) within 0.05 nats/pixel of (b);
(c) and (d) better than (a).

Usage::

    python scripts/bench_evidence.py                 # full: 10 phantoms, reference-28
    python scripts/bench_evidence.py --quick         # 2 phantoms, small U-net, minutes
    python scripts/bench_evidence.py --out benchmarks/results/bench_evidence.json
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import time

import numpy as np
import torch

from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json, run_resumable
from ctuq.bench.scores import quality
from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import digits
from ctuq.data.simulate import simulate_sinogram
from ctuq.models.unet import unet_preset
from ctuq.recon import predictive
from ctuq.posterior import EMOptions, EvidenceOracle, ExactPosterior, Linearization
from ctuq.recon.dip import DIPConfig, fit_dip
from ctuq.recon.evidence import ct_likelihood, fit_posterior, initial_prior
from ctuq.recon.predcp import PredCPOptions

log = logging.getLogger("bench_evidence")


def exact_variance(orc: EvidenceOracle, ex: ExactPosterior, prior, noise_var, lengthscales):
    """Exact per-pixel posterior variance (fast path unless the lengthscales moved)."""
    if not lengthscales:
        return orc.posterior_variance(prior.variances.detach(), noise_var)
    ex.prior, ex.noise_var = prior, noise_var
    return ex.posterior_var_image()


def run_case(i: int, gt: np.ndarray, op, args) -> dict:
    y, sigma = simulate_sinogram(gt, op, 0.05, seed=1000 + i)
    case = {"id": i, "index": i, "noise_std": sigma}
    dcfg = DIPConfig.for_image_size(28, seed=i, progress_every=10**6)
    if args.quick:
        dcfg = dcfg.with_(iterations=300, unet=unet_preset("reference-28").with_(channels=(8,) * 3))
    dip = fit_dip(y, op, dcfg, noise_std=sigma)
    x_hat = dip.reconstruction.detach()
    case["dip"] = {"time": dip.wall_time, "tv_weight": dip.tv_weight,
                   "psnr": predictive.psnr(gt, x_hat)}
    log.info("case %d: DIP %.1f s, PSNR %.2f dB", i, dip.wall_time, case["dip"]["psnr"])
    lin = Linearization(dip.model, dip.net_input)
    lik = ct_likelihood(lin, op, y)
    t0 = time.perf_counter()
    shared = None
    em = EMOptions(learn_noise=True, seed=i, em_steps=args.em_steps)
    for prior_name in args.priors:
        prior0 = initial_prior(lik, prior_name, init_variance=1.0,
                               generator=torch.Generator().manual_seed(i))
        if shared is None:
            shared = ExactPosterior(lik, prior0, sigma**2)  # dense J and Φ, once
            t_dense = time.perf_counter() - t0
        case[prior_name] = run_prior(i, gt, op, y, sigma, dip, lik, x_hat, prior_name, em,
                                     prior0, shared, t_dense, args)
    return case


def run_prior(i, gt, op, y, sigma, dip, lik, x_hat, name, em, prior0, shared, t_dense, args):
    out = {}
    lin = lik.lin
    gt_t = torch.as_tensor(gt, dtype=torch.float64)
    # the oracle
    t0 = time.perf_counter()
    orc = EvidenceOracle(lik, prior0, exact=shared)
    t_build = t_dense + time.perf_counter() - t0
    opt = orc.optimize(sigma**2, learn_noise=True)
    out["exact"] = {"build_time": t_build, "optimize_time": opt["seconds"],
                    "time": t_build + opt["seconds"], "log_evidence": opt["log_evidence"],
                    "a_b": opt["a_b"], "sigma2": opt["sigma2"], "gamma": opt["gamma"]}
    log.info("case %d %s: oracle %.1f s + %.1f s, log evidence %.3f", i, name, t_build,
             opt["seconds"], opt["log_evidence"])

    # (a) untuned defaults, (b) exact optimum
    a0 = prior0.variances.detach()
    out["a_untuned"] = {**quality(gt_t, x_hat, orc.posterior_variance(a0, sigma**2)),
                        "log_evidence": float(orc.log_evidence(a0, sigma**2))}
    a_opt = torch.tensor(opt["a_b"], dtype=torch.float64)
    out["b_exact"] = {**quality(gt_t, x_hat, orc.posterior_variance(a_opt, opt["sigma2"])),
                      "log_evidence": opt["log_evidence"]}

    # (c) sample-based EM for each k
    out["c_em"] = {}
    for k in args.ks:
        prior = copy.deepcopy(prior0)
        t0 = time.perf_counter()
        post = fit_posterior(lin, op, y, sigma**2, prior=prior, em=em.with_(n_samples=k))
        el = time.perf_counter() - t0
        hp = post.hyperparameters()
        a = torch.tensor(hp["a_b"], dtype=torch.float64)
        g_exact = orc.gamma(a, hp["sigma2"])
        g_hat = post.stats.gamma_hat
        entry = {"time": el, "em_steps": hp["em_steps"], "converged": hp["converged"],
                 "log_evidence": float(orc.log_evidence(a, hp["sigma2"])),
                 "a_b": hp["a_b"], "sigma2": hp["sigma2"],
                 "gamma_hat": [float(v) for v in g_hat], "gamma_exact": g_exact.tolist(),
                 "gamma_abs_error": float((g_hat - g_exact).abs().sum()),
                 "gamma_total_rel_error": float(abs(g_hat.sum() - g_exact.sum())
                                                / g_exact.sum()),
                 **quality(gt_t, x_hat, orc.posterior_variance(a, hp["sigma2"]))}
        if k > 1:
            entry["gamma_z_max"] = float(((g_hat - g_exact).abs()
                                          / post.stats.gamma_hat_se).nan_to_num(0).max())
        if k == 8:
            z = post.draw(128, generator=torch.Generator().manual_seed(i + 77))
            std_s = predictive.pixel_std(predictive.image_samples(lin, z)).double()
            entry["sampled_std"] = quality(gt_t, x_hat, std_s.square())
        out["c_em"][str(k)] = entry
        log.info("case %d %s: EM k=%d %.1f s, %d steps, log evidence %.3f, test LL %.4f", i,
                 name, k, el, hp["em_steps"], entry["log_evidence"], entry["test_ll"])

    # (d) sample-based EM + TV-PredCP
    prior = copy.deepcopy(prior0)
    t0 = time.perf_counter()
    post = fit_posterior(lin, op, y, sigma**2, prior=prior, predcp=PredCPOptions(),
                         em=em.with_(n_samples=8, learn_lengthscales=name == "matern"),
                         tv_weight=dip.tv_weight)
    el = time.perf_counter() - t0
    hp = post.hyperparameters()
    var = exact_variance(orc, shared, post.prior, hp["sigma2"],
                         post.options.learn_lengthscales)
    with torch.no_grad():
        le = float(orc.log_evidence(noise_var=hp["sigma2"], prior=post.prior))
    out["d_em_predcp"] = {"time": el, "em_steps": hp["em_steps"], "a_b": hp["a_b"],
                          "l_b": hp["l_b"], "sigma2": hp["sigma2"],
                          "predcp_weight": hp["predcp_weight"],
                          "kappa_first": post.trace[0].get("kappa"),
                          "kappa_last": post.trace[-2].get("kappa") if len(post.trace) > 1
                          else None,
                          "log_evidence": le, **quality(gt_t, x_hat, var)}
    log.info("case %d %s: EM+PredCP %.1f s, test LL %.4f", i, name, el,
             out["d_em_predcp"]["test_ll"])
    return out


def summarize(cases, prior, ks) -> dict:
    def m(*path):
        return mean_of(cases, [prior, *path])

    s = {
        "exact_time": m("exact", "time"),
        "em_time": {k: m("c_em", k, "time") for k in ks},
        "em_time_per_step": {k: float(np.mean([c[prior]["c_em"][k]["time"]
                                               / max(1, c[prior]["c_em"][k]["em_steps"] + 1)
                                               for c in cases])) for k in ks},
        "em_steps": {k: m("c_em", k, "em_steps") for k in ks},
        "predcp_time": m("d_em_predcp", "time"),
        "gamma_total_rel_error": {k: m("c_em", k, "gamma_total_rel_error") for k in ks},
        "log_evidence": {"a_untuned": m("a_untuned", "log_evidence"),
                         "b_exact": m("b_exact", "log_evidence"),
                         **{f"c_em_k{k}": m("c_em", k, "log_evidence") for k in ks},
                         "d_em_predcp": m("d_em_predcp", "log_evidence")},
    }
    for metric in ("test_ll", "coverage_2sigma", "mean_std"):
        s[metric] = {"a_untuned": m("a_untuned", metric), "b_exact": m("b_exact", metric),
                     **{f"c_em_k{k}": m("c_em", k, metric) for k in ks},
                     "d_em_predcp": m("d_em_predcp", metric)}
        if "8" in ks:
            s[metric]["c_em_k8_sampled_std"] = m("c_em", "8", "sampled_std", metric)
    tl = s["test_ll"]
    t = {}
    if "8" in ks:
        t["c_k8_within_0.05_of_b"] = abs(tl["c_em_k8"] - tl["b_exact"]) <= 0.05
    t["c_better_than_a"] = all(tl[f"c_em_k{k}"] > tl["a_untuned"] for k in ks)
    t["d_better_than_a"] = tl["d_em_predcp"] > tl["a_untuned"]
    s["targets"] = t
    return s


def mean_of(cases, path) -> float:
    vals = []
    for c in cases:
        v = c
        for p in path:
            v = v[p]
        vals.append(v)
    return float(np.mean(vals))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 phantoms, 8-channel U-net")
    ap.add_argument("--n", type=int, default=None, help="number of phantoms (default 10)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 8, 32])
    ap.add_argument("--priors", nargs="+", default=["matern", "gprior"],
                    choices=["matern", "ard", "gprior"])
    ap.add_argument("--partial", default=None,
                    help="append each finished case here (JSON lines); cases already in "
                         "the file are read back instead of recomputed")
    ap.add_argument("--em-steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    for name in ("ctuq.recon.linearize", "ctuq.data.operators", "ctuq.recon.dip",
                 "ctuq.recon.sampling"):
        logging.getLogger(name).setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    n = args.n if args.n is not None else (2 if args.quick else 10)
    op = RayTransform(Geometry.parallel(28, 20))
    images = digits(n, 28, seed=0)
    t0 = time.perf_counter()
    cases = run_resumable([{"id": i} for i in range(n)], args.partial,  # resumes
                          lambda c: run_case(c["id"], images[c["id"]], op, args))
    ks = [str(k) for k in args.ks]
    summary = {p: summarize(cases, p, ks) for p in args.priors}
    targets = {p: summary[p].pop("targets") for p in args.priors}
    doc = {
        "benchmark": "evidence",
        "setting": {"image": "28x28 digits", "angles": 20, "noise": "5% Gaussian",
                    "n_phantoms": n, "unet": "reference-28 (8 channels)" if args.quick
                    else "reference-28", "priors": args.priors, "em_steps": args.em_steps,
                    "sampler": "cg", "learn_noise": True, "ks": args.ks,
                    "quality": "exact posterior variance at each set of hyperparameters; "
                               "test_ll = mean per-pixel log N(x_true; x_hat, var + 1e-6)"},
        "summary": summary,
        "targets": targets,
        "cases": cases,
        "machine": machine("cpu"),
        "wall_time": time.perf_counter() - t0,
    }
    dump_json(doc, sys.stdout, path=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
