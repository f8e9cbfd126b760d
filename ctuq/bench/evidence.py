"""The sample-based evidence (EM / MacKay) against the exact evidence, on digit phantoms.

Per case (28², 20 angles, 5 % noise; the reference U-net fitted by DIP+TV):
the exact-evidence oracle (dense Φ, L-BFGS over the block variances and σ²);
sample-based EM for several numbers of samples k (time, steps, the exact log
evidence at its hyperparameters, the error of its γ̂); EM with TV-PredCP; and
the per-pixel test log-likelihood and ±2σ coverage of the exact posterior
variance at (a) untuned, (b) exact-optimum, (c) EM and (d) EM + PredCP
hyperparameters (:func:`ctuq.bench.scores.quality`). :func:`run_case` runs one
phantom, :func:`summarize` averages per prior.
"""

from __future__ import annotations

import copy
import logging
import time

import numpy as np
import torch

from ctuq.bench.scores import quality
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
