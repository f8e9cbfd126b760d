"""The posterior samplers' speed and accuracy on seeded toy problems (:mod:`ctuq.bench.toy`).

For each problem size: the cost of one batched JVP, VJP, ``A`` and ``Aᵀ``; the
Matheron CG sampler and the sample-then-optimise sampler (time, time per
sample and per CG iteration, iterations, set-up, the overhead ratio over the
operator calls, a warm second call); the dense float64 oracle where it fits,
and both samplers' accuracy against it on the same draws
(:func:`bench_size`).
"""

from __future__ import annotations

import logging
import math
import time

import torch

from ctuq.bench.machine import components, median_s, sync
from ctuq.bench.toy import toy_problem
from ctuq.posterior.samples import max_residual

log = logging.getLogger("bench_sampling")

PROBLEMS = {28: (20, "reference-28"), 64: (45, "dip-64"), 128: (90, "dip-128")}


def _accuracy(post, ex, var_exact, mask) -> dict:
    with torch.no_grad():
        z_ex = ex.sample(post.k, u=post.state.base_u, e=post.state.base_e)
        img_ex = z_ex @ ex.J.t()
        img = post.z.double() @ ex.J.t()
        err = (img - img_ex).norm(dim=1) / img_ex.norm(dim=1)
        ts = ex.theta_star()
        v_hat = img.square().mean(0)
        var_err = (v_hat[mask] / var_exact[mask] - 1).abs().median()
    return {"sample_image_rel_error_median": float(err.median()),
            "sample_image_rel_error_max": float(err.max()),
            "theta_star_rel_error": float((post.theta_star.double() - ts).norm() / ts.norm()),
            "variance_median_rel_error": float(var_err),
            "variance_median_rel_error_mc_expected": 0.6745 * math.sqrt(2 / post.k)}


def bench_size(size: int, args, device) -> dict:
    from ctuq.posterior import (BlockPrior, CGOptions, CGSampler, ExactPosterior,
                                ObservationKernel, STOOptions, STOSampler, batched_cg)
    from ctuq.recon.evidence import ct_likelihood

    n_angles, preset = PROBLEMS[size]
    t0 = time.perf_counter()
    pb = toy_problem(size, n_angles, unet=preset, channels=None, fit_steps=args.fit_steps,
                     seed=0, device=str(device), threads=None)
    lin = pb.linearization(chunk_size=args.chunk or None)
    op = pb.op
    lik = ct_likelihood(lin, op, pb.y)
    prior = BlockPrior(lin)  # reference initialisation a_b = 1, ℓ_b = 0.1
    s2 = pb.noise_std**2
    k = args.k
    m = k + 1
    d_y = math.prod(op.range_shape)
    res = {"image": size, "n_angles": n_angles, "d_y": d_y, "unet": preset,
           "d_theta": lin.num_params, "k": k, "noise_std": pb.noise_std,
           "setup_s": time.perf_counter() - t0}
    gen = torch.Generator().manual_seed(0)

    log.info("size %d: problem ready (%.0f s), d_theta %d", size, res["setup_s"],
             lin.num_params)
    # -- components on k + 1 vectors
    comp = components(lin, op, m, args.repeats, device, gen)
    res["components_s"] = comp

    log.info("size %d: components %s", size, comp)
    # -- the CG sampler, end to end
    t = time.perf_counter()
    cg_sampler = CGSampler(CGOptions(precond_rank=args.precond_rank))
    cg = cg_sampler.sample(lik, prior, s2, k, generator=torch.Generator().manual_seed(1))
    sync(device)
    t_cg = time.perf_counter() - t
    # time per CG iteration on a fixed number of iterations (no convergence check exits)
    kern = ObservationKernel(lik, prior, s2)
    pc = cg.state.preconditioner
    B = torch.randn(m, d_y, generator=gen).to(device)
    n_it = args.cg_iterations

    def fixed_cg():
        batched_cg(kern, B, precond=lambda R: pc(R, s2), tol=0.0, max_iter=n_it,
                   patience=None, true_residual=False)

    t_iter = median_s(fixed_cg, max(1, args.repeats // 2), device) / n_it
    # an EM step: fresh draws, θ* and the preconditioner carried over
    t = time.perf_counter()
    cg2 = cg_sampler.sample(lik, prior, s2, k, warm_start=cg, redraw=True,
                            generator=torch.Generator().manual_seed(3))
    sync(device)
    t_cg_warm = time.perf_counter() - t
    res["cg"] = {"time_total_s": t_cg, "time_per_sample_s": t_cg / max(k, 1),
                 "iterations": cg.info["iterations"], "converged": cg.info["converged"],
                 "max_residual": max_residual(cg.info),
                 "setup_s": cg.info["time_setup"], "precond_rank": cg.info["precond_rank"],
                 "precond_build_s": cg.info["precond_time"],
                 "time_per_iteration_s": t_iter,
                 "overhead_ratio": t_iter / comp["sum"],
                 "warm": {"time_total_s": t_cg_warm, "time_per_sample_s": t_cg_warm / max(k, 1),
                          "iterations": cg2.info["iterations"],
                          "converged": cg2.info["converged"]}}

    log.info("size %d: CG %.1f s, %d iterations", size, t_cg, cg.info["iterations"])
    # -- the STO sampler, end to end
    t = time.perf_counter()
    sto_sampler = STOSampler(STOOptions(iterations=args.sto_iterations,
                                        precond_rank=args.precond_rank))
    sto = sto_sampler.sample(lik, prior, s2, k, generator=torch.Generator().manual_seed(1))
    sync(device)
    t_sto = time.perf_counter() - t
    t = time.perf_counter()
    sto2 = sto_sampler.sample(lik, prior, s2, k, warm_start=sto, redraw=True,
                              generator=torch.Generator().manual_seed(3))
    sync(device)
    t_sto_warm = time.perf_counter() - t
    res["sto"] = {"time_total_s": t_sto, "time_per_sample_s": t_sto / max(k, 1),
                  "iterations": sto.info["iterations"], "converged": sto.info["converged"],
                  "max_residual": max_residual(sto.info),
                  "setup_s": sto.info["time_setup"],
                  "precond_build_s": sto.info["precond_time"],
                  "time_per_iteration_s": sto.info["time_per_iteration"],
                  "overhead_ratio": sto.info["time_per_iteration"] / comp["sum"],
                  "warm": {"time_total_s": t_sto_warm,
                           "time_per_sample_s": t_sto_warm / max(k, 1),
                           "iterations": sto2.info["iterations"],
                           "converged": sto2.info["converged"]}}

    log.info("size %d: STO %.1f s, %d iterations", size, t_sto, sto.info["iterations"])
    # -- the exact dense path where it fits
    d_x = lin.num_outputs
    # J, a row block of J Σ, S and the whitened A S (float64)
    need_gb = 8 * (lin.num_params * (d_x + 512) + 2 * d_x * d_x + d_y * d_x) / 1024**3
    res["exact_memory_gb"] = need_gb
    if need_gb <= args.exact_max_gb:
        t = time.perf_counter()
        ex = ExactPosterior(lik, prior, s2)
        t_j = time.perf_counter() - t
        log.info("size %d: dense J in %.0f s", size, t_j)
        with torch.no_grad():
            var = ex.posterior_var_image().reshape(-1)
            ex.theta_star()
            ex.sample(k, torch.Generator().manual_seed(2))
        sync(device)
        t_ex = time.perf_counter() - t
        log.info("size %d: exact %.0f s", size, t_ex)
        mask = var > 1e-10 * var.max()
        res["exact"] = {"time_total_s": t_ex, "time_per_sample_s": t_ex / max(k, 1),
                        "time_dense_jacobian_s": t_j,
                        "pixels_with_nonzero_variance": int(mask.sum())}
        res["cg"]["accuracy"] = _accuracy(cg, ex, var, mask)
        res["sto"]["accuracy"] = _accuracy(sto, ex, var, mask)
        for name, t_cold, t_warm in (("cg", t_cg, t_cg_warm), ("sto", t_sto, t_sto_warm)):
            res[name]["speedup_vs_exact"] = t_ex / t_cold
            res[name]["warm"]["speedup_vs_exact"] = t_ex / t_warm
        del ex
    else:
        res["exact"] = None
        res["exact_skipped"] = (f"needs ≈{need_gb:.1f} GB (J, S and A S in float64) > "
                                f"--exact-max-gb {args.exact_max_gb}")
    return res
