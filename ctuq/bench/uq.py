"""Uncertainty quality and speed of ctuq against the papers' baselines.

Quality (:func:`run_quality`): per phantom and noise level, FBP with its
residual variance, DIP with a fixed variance, MC dropout, the exact
linearised Laplace (dense oracle) and ctuq's posterior with and without
TV-PredCP, scored by :func:`ctuq.bench.scores.uq_summary` (pixel and patch
log-likelihoods, coverage, Spearman, reliability). Speed and scaling
(:func:`run_scaling`): time and peak memory of each stage against the image
size. :func:`markdown` and :func:`plots` write the results page and figures
from the document.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ctuq.bench.machine import PeakMemory, components, median_s, sync
from ctuq.bench.runner import clean, run_resumable
from ctuq.bench.scores import uq_summary

log = logging.getLogger("bench_uq")

METHODS = ("fbp", "dip_fixed", "mc_dropout", "lla_exact", "ctuq", "ctuq_predcp")
LABELS = {"fbp": "FBP (residual variance)", "dip_fixed": "DIP (σ² = 1)",
          "mc_dropout": "MC-dropout DIP", "lla_exact": "exact linearised DIP",
          "ctuq": "ctuq (EM, no PredCP)", "ctuq_predcp": "ctuq (EM + TV-PredCP)"}
PATCH_SIZES = tuple(range(1, 11))
MC_SAMPLES = 256
EXACT_SAMPLES = 256


# ------------------------------------------------------------------------------
# quality


def quality_cases(args) -> list[dict]:
    """The case list: one dict per (phantom, noise level), longest first."""
    cases = []
    for k in range(args.ellipses):
        cases.append({"id": f"ellipses{args.ellipse_size}_5pct_{k}", "set": f"ellipses{args.ellipse_size}_5pct",
                      "phantom": "ellipses", "index": k, "size": args.ellipse_size,
                      "n_angles": 60, "noise": 0.05, "seed": 2000 + k})
    for noise in (0.05, 0.10):
        tag = f"{round(noise * 100)}pct"
        for i in range(args.digits):
            cases.append({"id": f"digits28_{tag}_{i}", "set": f"digits28_{tag}",
                          "phantom": "digits", "index": i, "size": 28, "n_angles": 20,
                          "noise": noise, "seed": 1000 + i + (0 if noise == 0.05 else 100)})
    return cases


def score(truth, mean, std, samples=None) -> dict:
    """Every metric of one method (:func:`ctuq.bench.scores.uq_summary`, patch sizes 1–10)."""
    return uq_summary(truth, mean, std, samples, patch_sizes=PATCH_SIZES)


def exact_lla(dip, op, y, noise_std: float, seed: int):
    """Exact linearised posterior at the exact-evidence g-prior optimum (σ² fixed)."""
    from ctuq.posterior import EvidenceOracle, ExactPosterior, Linearization
    from ctuq.recon.evidence import ct_likelihood, initial_prior

    lin = Linearization(dip.model, dip.net_input)
    lik = ct_likelihood(lin, op, y)
    prior0 = initial_prior(lik, "gprior", generator=torch.Generator().manual_seed(seed))
    ex = ExactPosterior(lik, prior0, noise_std**2)
    opt = EvidenceOracle(lik, prior0, exact=ex).optimize(noise_std**2, learn_noise=False)
    prior = copy.deepcopy(prior0)
    prior.set_hyperparameters(variances=torch.tensor(opt["a_b"], dtype=torch.float64))
    ex.prior = prior
    cov = ex.posterior_cov_image()
    cov = 0.5 * (cov + cov.t())
    L, _ = torch.linalg.cholesky_ex(cov + 1e-10 * cov.diagonal().mean() * torch.eye(
        cov.shape[0], dtype=cov.dtype))
    z = torch.randn(EXACT_SAMPLES, cov.shape[0], generator=torch.Generator().manual_seed(seed),
                    dtype=cov.dtype)
    samples = (z @ L.t()).reshape(-1, *lin.image_shape)
    var = cov.diagonal().clamp_min(0).reshape(lin.image_shape)
    return var.sqrt(), samples, {"a_b": opt["a_b"], "log_evidence": opt["log_evidence"]}


def run_quality_case(case: dict, args) -> dict:
    from ctuq.data import phantoms
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.recon.baselines import fbp_variance
    from ctuq.recon.config import ReconstructionConfig
    from ctuq.recon.dip import fit_dip
    from ctuq.recon.mc_dropout import fit_mc_dropout
    from ctuq.recon.pipeline import posterior_uncertainty

    torch.set_num_threads(args.threads)
    size = case["size"]
    truth = (phantoms.digits(case["index"] + 1, size=size, seed=0)[case["index"]]
             if case["phantom"] == "digits" else phantoms.ellipses(size, seed=case["index"]))
    op = RayTransform(Geometry.parallel(size, case["n_angles"]))
    y, sigma = simulate_sinogram(truth, op, case["noise"], seed=case["seed"])
    y = torch.as_tensor(y, dtype=torch.float32)
    out = {**case, "noise_std": sigma, "methods": {}, "times_s": {}}
    rcfg = ReconstructionConfig(seed=case["index"], device="cpu",
                                dip={"iterations": args.quick_iterations} if args.quick else {},
                                uncertainty={"em_steps": 2, "predictive_samples": 32}
                                if args.quick else {})
    dip_cfg, unc = rcfg.resolve((size, size))
    m = out["methods"]

    t0 = time.perf_counter()
    x_fbp, var_fbp, info = fbp_variance(y, op, sigma, seed=case["seed"])
    out["times_s"]["fbp"] = time.perf_counter() - t0
    m["fbp"] = {**score(truth, x_fbp, var_fbp.sqrt()), **info}

    dip = fit_dip(y, op, dip_cfg, noise_std=sigma)
    x_dip = dip.reconstruction.detach()
    out["times_s"]["dip"] = dip.wall_time
    m["dip_fixed"] = score(truth, x_dip, torch.ones_like(x_dip))
    log.info("%s: DIP %.1f s, PSNR %.2f dB", case["id"], dip.wall_time, m["dip_fixed"]["psnr"])

    for name, predcp in (("ctuq", False), ("ctuq_predcp", True)):
        u = posterior_uncertainty(dip, op, y, sigma, dataclasses.replace(unc, predcp=predcp),
                                  learn_noise=False, seed=case["index"])
        out["times_s"][name] = u["timings"]
        hp = u["posterior"].hyperparameters()
        m[name] = {**score(truth, x_dip, u["std"], u["image_samples"]),
                   "g": hp["a_b"][0] if hp["prior"] == "gprior" else None,
                   "em_steps": hp["em_steps"]}
        log.info("%s: %s LL %.3f, ±2σ %.3f (%.1f s)", case["id"], name,
                 m[name]["pixel_log_likelihood"], m[name]["coverage"]["2"],
                 sum(u["timings"].values()))

    if size <= args.exact_max_size:
        t0 = time.perf_counter()
        std, samples, info = exact_lla(dip, op, y, sigma, case["index"])
        out["times_s"]["lla_exact"] = time.perf_counter() - t0
        m["lla_exact"] = {**score(truth, x_dip, std, samples), **info}
        log.info("%s: exact LL %.3f (%.1f s)", case["id"], m["lla_exact"]["pixel_log_likelihood"],
                 out["times_s"]["lla_exact"])

    mc = fit_mc_dropout(y, op, dip_cfg, n_samples=args.mc_samples, noise_std=sigma,
                        keep_samples=True)
    out["times_s"]["mc_dropout"] = mc.wall_time
    m["mc_dropout"] = score(truth, mc.mean, mc.std, mc.samples - mc.mean)
    log.info("%s: MC dropout LL %.3f (%.1f s)", case["id"],
             m["mc_dropout"]["pixel_log_likelihood"], mc.wall_time)
    return clean(out)


def _worker(case, args):
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    quiet_loggers()
    return run_quality_case(case, args)


def run_quality(args) -> dict:
    cases = quality_cases(args)
    t0 = time.perf_counter()
    results = run_resumable(cases, args.partial,
                            functools.partial(run_quality_case, args=args), args.jobs,
                            functools.partial(_worker, args=args))
    return {"cases": results, "summary": summarize_quality(results),
            "wall_time_s": time.perf_counter() - t0}


def summarize_quality(results: list[dict]) -> dict:
    """Per set and method: the mean (and std over cases) of every metric."""
    sets = {}
    for r in results:
        sets.setdefault(r["set"], []).append(r)
    out = {}
    for name, rs in sets.items():
        s = {"cases": len(rs), "size": rs[0]["size"], "n_angles": rs[0]["n_angles"],
             "noise": rs[0]["noise"], "methods": {}}
        for meth in METHODS:
            ms = [r["methods"][meth] for r in rs if meth in r["methods"]]
            if not ms:
                continue
            row = {}
            for key in ("psnr", "ssim", "pixel_log_likelihood", "spearman_std_abs_error",
                        "mean_std", "rmse"):
                vals = [x[key] for x in ms if x.get(key) is not None]  # None: constant std
                row[key] = float(np.mean(vals)) if vals else None
                row[key + "_std"] = float(np.std(vals)) if vals else None
            for key in ("coverage", "patch_log_likelihood"):
                row[key] = {k: float(np.mean([x[key][k] for x in ms])) for k in ms[0][key]}
            row["reliability"] = np.mean([x["reliability"] for x in ms], 0).tolist()
            times = []
            for r in rs:
                t = r["times_s"].get(meth)
                if meth in ("ctuq", "ctuq_predcp"):
                    t = r["times_s"]["dip"] + sum(t.values())
                elif meth == "dip_fixed":
                    t = r["times_s"]["dip"]
                elif meth == "lla_exact" and t is not None:
                    t = t + r["times_s"]["dip"]
                if t is not None:
                    times.append(t)
            row["time_s"] = float(np.mean(times)) if times else None
            s["methods"][meth] = row
        meths = s["methods"]
        if "ctuq_predcp" in meths:
            c = meths["ctuq_predcp"]
            s["targets"] = {
                "ctuq_ll_above_dip_fixed": c["pixel_log_likelihood"]
                > meths["dip_fixed"]["pixel_log_likelihood"],
                "ctuq_ll_above_mc_dropout": c["pixel_log_likelihood"]
                > meths["mc_dropout"]["pixel_log_likelihood"],
                "ctuq_coverage_2sigma_in_90_99": 0.90 <= c["coverage"]["2"] <= 0.99,
            }
        out[name] = s
    return out


# ------------------------------------------------------------------------------
# speed and scaling


def run_scaling_size(size: int, args, device) -> dict:
    from ctuq.data import phantoms
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.recon.config import ReconstructionConfig
    from ctuq.recon.dip import fit_dip
    from ctuq.recon.pipeline import posterior_uncertainty
    from ctuq.posterior import ObservationKernel, batched_cg

    n_angles = 20 if size <= 28 else 60
    truth = (phantoms.digits(1, size=size, seed=0)[0] if size <= 28
             else phantoms.ellipses(size, seed=0))
    op = RayTransform(Geometry.parallel(size, n_angles), device=device)
    y, sigma = simulate_sinogram(truth, op, 0.05, seed=3000 + size)
    y = torch.as_tensor(y, dtype=torch.float32, device=device)
    rcfg = ReconstructionConfig(seed=0, device=str(device))
    dip_cfg, unc = rcfg.resolve((size, size))
    n_iter = min(args.dip_iterations, dip_cfg.iterations)
    res = {"image": size, "pixels": size * size, "n_angles": n_angles,
           "preset": rcfg.preset_for((size, size)), "dip_iterations_timed": n_iter,
           "dip_iterations_preset": dip_cfg.iterations}

    with PeakMemory(device) as mem:
        dip = fit_dip(y, op, dip_cfg.with_(iterations=n_iter), noise_std=sigma)
    res["dip"] = {"time_s": dip.wall_time, "time_per_iteration_s": dip.wall_time / n_iter,
                  "time_preset_estimate_s": dip.wall_time / n_iter * dip_cfg.iterations,
                  "peak_memory_mb": mem.peak_bytes / 2**20}
    res["d_theta"] = int(sum(p.numel() for p in dip.model.parameters()))
    log.info("scaling %d²: DIP %.2f s/iteration", size, res["dip"]["time_per_iteration_s"])

    k = args.samples_per_size
    unc = dataclasses.replace(unc, em_steps=args.em_steps, predictive_samples=k)
    with PeakMemory(device) as mem:
        u = posterior_uncertainty(dip, op, y, sigma, unc, learn_noise=False, seed=0)
    sync(device)
    post, lin = u["posterior"], u["linearization"]
    e_steps = len(post.trace)
    res["em"] = {"time_s": u["timings"]["em"], "e_steps": e_steps,
                 "time_per_step_s": u["timings"]["em"] / max(1, e_steps),
                 "n_samples": unc.n_samples, "predcp_samples": unc.predcp_samples,
                 "peak_memory_mb": mem.peak_bytes / 2**20}
    res["predictive"] = {"time_s": u["timings"]["predictive"], "samples": k,
                         "peak_memory_mb": mem.peak_bytes / 2**20}
    # time per posterior sample: a warm draw of k samples (as the pipeline's predictive)
    gen = torch.Generator().manual_seed(11)
    with PeakMemory(device) as mem:
        t0 = time.perf_counter()
        post.draw(k, generator=gen)
        sync(device)
        t_draw = time.perf_counter() - t0
    res["sample"] = {"time_per_sample_s": t_draw / k, "batch": k,
                     "cg_iterations": int(post.draw_info[0].get("iterations", 0)),
                     "peak_memory_mb": mem.peak_bytes / 2**20}
    res["em"]["cg_iterations_per_e_step"] = [t.get("solver_iterations") for t in post.trace]
    # the CG sampler's overhead against its floor, on a batch of k + 1 right-hand sides
    mb = k + 1
    gen = torch.Generator().manual_seed(12)
    comp = components(lin, op, mb, args.repeats, device, gen)
    s2 = float(post.noise_var)
    kern = ObservationKernel(post.likelihood, post.prior, s2)
    pc = post.sample_state.state.preconditioner
    B = torch.randn(mb, math.prod(op.range_shape), generator=gen).to(device)
    n_it = 10
    t_iter = median_s(lambda: batched_cg(kern, B, precond=(lambda R: pc(R, s2)) if pc else None,
                                          tol=0.0, max_iter=n_it, patience=None,
                                          true_residual=False),
                       max(1, args.repeats // 2), device) / n_it
    res["cg"] = {"components_s": comp, "time_per_iteration_s": t_iter,
                 "overhead_ratio": t_iter / comp["sum"]}
    # the same products in one batch: what the automatic chunking saves
    chunk, lin.chunk_size = lin.chunk_size, None
    try:
        one = components(lin, op, mb, max(1, args.repeats // 2), device, gen)
    finally:
        lin.chunk_size = chunk
    res["chunk"] = {"auto_chunk_size": chunk, "activation_numel": lin.activation_numel(),
                    "jvp_vjp_auto_s": comp["jvp"] + comp["vjp"],
                    "jvp_vjp_one_batch_s": one["jvp"] + one["vjp"]}
    res["memory_kind"] = mem.kind
    log.info("scaling %d²: %.3f s/sample, overhead %.2f", size,
             res["sample"]["time_per_sample_s"], res["cg"]["overhead_ratio"])
    return clean(res)


def loglog_slope(pixels, times) -> float:
    return float(np.polyfit(np.log(pixels), np.log(times), 1)[0])


def run_scaling(args) -> dict:
    device = torch.device(args.device)
    torch.set_num_threads(args.scaling_threads)
    rows = [run_scaling_size(s, args, device) for s in args.sizes]
    big = [r for r in rows if r["image"] >= 64]
    out = {"device": str(device), "threads": torch.get_num_threads(), "rows": rows}
    if len(big) >= 2:
        slope = loglog_slope([r["pixels"] for r in big],
                             [r["sample"]["time_per_sample_s"] for r in big])
        out["time_per_sample_slope_64_256"] = slope
        out["targets"] = {"time_per_sample_slope_le_1.1": slope <= 1.1}
    return out


# ------------------------------------------------------------------------------
# output


def quiet_loggers():
    for name in ("ctuq.recon.linearize", "ctuq.data.operators", "ctuq.recon.dip",
                 "ctuq.recon.sampling", "ctuq.recon.evidence", "ctuq.recon.mc_dropout"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _f(v, fmt="{:.2f}"):
    return "–" if v is None else fmt.format(v)


def _chunk_cell(c: dict | None) -> str:
    if not c:
        return "–"
    return (f"{c['jvp_vjp_auto_s']:.2f} ({c['auto_chunk_size']}) / "
            f"{c['jvp_vjp_one_batch_s']:.2f}")


def markdown(doc: dict, plots: str = ".") -> str:
    """The results page; ``plots``: the folder of the PNGs, relative to the page."""
    m = doc["machine"]
    lines = ["# Benchmarks: uncertainty quality and speed", "",
             f"Written by `{doc.get('script', 'ctuq.bench.uq')}`; the JSON is "
             "`benchmarks/results/bench_uq.json`. Rerun everything with `make bench-uq`.", "",
             f"Machine: {m.get('cpu') or 'unknown CPU'}, {m.get('cpu_count')} cores, torch "
             f"{m.get('torch')}.", ""]
    q = doc.get("quality")
    if q:
        lines += ["## Quality", "",
                  "Methods: **FBP** with a per-pixel variance from propagated noise plus an iid "
                  "image term that explains the excess data residual "
                  "(`ctuq.recon.baselines.fbp_variance`); **DIP (σ² = 1)**, the DIP+TV "
                  "reconstruction with unit variance; **MC-dropout DIP** (Dropout2d p = 0.05 "
                  "after every 3×3 conv, trained the same way, 256 passes); the **exact "
                  "linearised DIP** (28² only: dense float64 posterior, g-prior at its exact "
                  "evidence optimum); **ctuq**: the pipeline's sample-based EM (g-prior, CG "
                  "sampler, preset defaults) without and with TV-PredCP (the default), on the "
                  "same DIP fit. The noise std is known to every method.", "",
                  "Per-pixel test log-likelihood (LL, nats/pixel, of the truth under "
                  "N(mean, std²), no variance floor; – where a method has zero std on a "
                  "pixel it gets wrong), ±1/2/3σ coverage (nominal 68.3 / 95.4 / 99.7 %), "
                  "Spearman correlation of std with |error|, patch LL for 2×2 and 10×10 patches "
                  "(off-diagonals halved; diagonal methods: = pixel LL), PSNR, mean over cases; "
                  "wall time per case includes the DIP fit where the method needs it.", ""]
        for name, s in q["summary"].items():
            lines += [f"### {name}: {s['cases']} cases, {s['size']}², {s['n_angles']} angles, "
                      f"{round(100 * s['noise'])} % noise", "",
                      "| method | PSNR dB | LL | patch LL 2² | patch LL 10² | ±1σ | ±2σ | ±3σ "
                      "| Spearman | time s |", "|---|---|---|---|---|---|---|---|---|---|"]
            for meth, r in s["methods"].items():
                c, p = r["coverage"], r["patch_log_likelihood"]
                lines.append(
                    f"| {LABELS[meth]} | {r['psnr']:.2f} | {_f(r['pixel_log_likelihood'])} "
                    f"± {_f(r['pixel_log_likelihood_std'])} | {_f(p['2'])} | {_f(p['10'])} | "
                    f"{100 * c['1']:.1f} | {100 * c['2']:.1f} | {100 * c['3']:.1f} | "
                    f"{_f(r['spearman_std_abs_error'])} | {_f(r['time_s'], '{:.0f}')} |")
            if "targets" in s:
                lines += ["", "Targets: " + ", ".join(
                    f"{k} **{'met' if v else 'NOT met'}**" for k, v in s["targets"].items())]
            lines.append("")
        lines += [f"![calibration curves]({plots}/bench_uq_calibration.png)", ""]
    sc = doc.get("scaling")
    if sc:
        lines += ["## Speed and scaling", "",
                  f"Device {sc['device']}, {sc['threads']} threads. DIP: time per iteration "
                  "and that × the preset's iterations; EM: the pipeline's settings with "
                  "TV-PredCP, per E/M step; sample: a warm `draw` after EM (preconditioner "
                  "reused), per sample; overhead: time per CG iteration ÷ one batched "
                  "JVP + VJP + A + Aᵀ; JVP+VJP: one batched JVP + VJP of the CG's batch in "
                  "chunks of the automatic size (`Linearization(chunk_size='auto')`) against "
                  "one batch. Peak memory: " + sc["rows"][0].get("memory_kind", "") + ".",
                  "", "| image | preset | d_θ | DIP s/it | DIP (preset) s | EM s/step | "
                  "s/sample | CG its/draw | CG overhead | JVP+VJP s: chunked (size) / one batch "
                  "| peak MB DIP / EM / sample |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sc["rows"]:
            lines.append(
                f"| {r['image']}² ({r['n_angles']} angles) | {r['preset']} | {r['d_theta']:,} | "
                f"{r['dip']['time_per_iteration_s']:.3f} | "
                f"{r['dip']['time_preset_estimate_s']:.0f} | {r['em']['time_per_step_s']:.1f} | "
                f"{r['sample']['time_per_sample_s']:.3f} | {r['sample']['cg_iterations']} | "
                f"{r['cg']['overhead_ratio']:.2f} | {_chunk_cell(r.get('chunk'))} | "
                f"{r['dip']['peak_memory_mb']:.0f} / {r['em']['peak_memory_mb']:.0f} / "
                f"{r['sample']['peak_memory_mb']:.0f} |")
        if "time_per_sample_slope_64_256" in sc:
            ok = sc["targets"]["time_per_sample_slope_le_1.1"]
            lines += ["", f"Log-log slope of time per sample against pixel count, 64²–256²: "
                          f"**{sc['time_per_sample_slope_64_256']:.2f}** (target ≤ 1.1: "
                          f"{'met' if ok else 'NOT met'})."]
        lines += ["", f"![scaling]({plots}/bench_uq_scaling.png)", ""]
    return "\n".join(lines) + "\n"


def plots(doc: dict, folder: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    q = doc.get("quality")
    if q:
        sets = list(q["summary"].items())
        fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 4.2), squeeze=False)
        nominal = np.linspace(0.05, 0.95, 19)
        colors = {m: f"C{i}" for i, m in enumerate(METHODS)}  # one colour per method
        for ax, (name, s) in zip(axes[0], sets):
            ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--")
            for meth, r in s["methods"].items():
                ax.plot(nominal, r["reliability"], marker=".", color=colors[meth],
                        label=LABELS[meth])
            ax.set(title=name, xlabel="nominal coverage", ylabel="observed coverage",
                   xlim=(0, 1), ylim=(0, 1.02))
        widest = max(range(len(sets)), key=lambda i: len(sets[i][1]["methods"]))
        axes[0][widest].legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = folder / "bench_uq_calibration.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    sc = doc.get("scaling")
    if sc:
        rows = sc["rows"]
        px = [r["pixels"] for r in rows]
        fig, ax = plt.subplots(figsize=(5.5, 4.2))
        for key, label in (("sample", "time per posterior sample"),
                           ("em", "EM, per step"), ("dip", "DIP, per iteration")):
            field = {"sample": "time_per_sample_s", "em": "time_per_step_s",
                     "dip": "time_per_iteration_s"}[key]
            ax.loglog(px, [r[key][field] for r in rows], marker="o", label=label)
        ref = np.array(px, float)
        t_ref = rows[-1]["sample"]["time_per_sample_s"]
        ax.loglog(ref, t_ref * ref / ref[-1], color="0.6", ls="--", lw=1, label="slope 1")
        ax.set(xlabel="pixels", ylabel="seconds", title=f"scaling on {sc['device']}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = folder / "bench_uq_scaling.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written
