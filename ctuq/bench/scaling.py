"""How time and memory of each stage grow with the image size (ctuq's allocator or glibc's).

:func:`one_size` measures one size in the calling process (run it in a
fresh process per size and allocator, so that memory peaks do not carry
over): seconds of the operator, a DIP iteration, a Jacobian pair, a
posterior sample, a CG iteration, the sketch and an EM step, and the peak
resident memory per stage (:class:`ctuq.bench.machine.PeakMemory`).
:func:`summarise` fits log-log slopes of time against pixels per allocator
and the speed-up of ctuq's allocator setting over glibc's default.
"""

from __future__ import annotations

import time

import numpy as np

from ctuq.bench.machine import PeakMemory

__all__ = ["STAGES", "KEYS", "one_size", "slope", "summarise"]

STAGES = ("operator", "dip", "linearize", "jacobian_pair", "fit_posterior")


def one_size(size: int, args) -> dict:
    """Every measurement of one size (runs in its own process)."""
    import torch

    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.data.splits import Case
    from ctuq.posterior import Linearization
    from ctuq.posterior.em import EMOptions
    from ctuq.posterior.sampling_cg import CGOptions, CGSampler
    from ctuq.recon.dip import DIPConfig, fit_dip
    from ctuq.recon.evidence import fit_posterior

    from ctuq.recon.allocator import allocator_setting, keep_freed_memory

    if args.one_allocator == "ctuq":
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    mem = PeakMemory("cpu").start()  # process RSS; CUDA's peak is read apart
    out = {"size": size, "pixels": size * size, "angles": args.angles, "memory_mb": {},
           "gpu_memory_mb": {}, "allocator": args.one_allocator,
           "allocator_setting": allocator_setting()}

    def stage(name, fn):
        mem.reset()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        res = fn()
        if cuda:
            torch.cuda.synchronize()
            out["gpu_memory_mb"][name] = torch.cuda.max_memory_allocated() / 2**20
        out["memory_mb"][name] = mem.read() / 2**20
        return res, time.perf_counter() - t0

    truth = Case("test", "ellipses", 0, size).image()
    op, out["operator_s"] = stage("operator", lambda: RayTransform(
        Geometry.parallel(size, args.angles), device=device))
    out["backend"] = op.backend
    y, sigma = simulate_sinogram(truth, op, 0.05, seed=7)
    cfg = DIPConfig.for_image_size(size).with_(iterations=args.dip_iters + 2, progress_every=1,
                                               device=args.device)
    ticks = []
    dip, out["dip_s"] = stage("dip", lambda: fit_dip(
        y, op, cfg, noise_std=sigma, progress=lambda *a, **k: ticks.append(time.perf_counter())))
    steps = np.diff(ticks)[2:] if len(ticks) > 3 else np.diff(ticks)
    out["preset"] = dip.config.preset if hasattr(dip.config, "preset") else None
    out["dip_iteration_s"] = float(np.median(steps))
    lin, out["linearize_s"] = stage("linearize", lambda: Linearization(dip.model, dip.net_input))
    out["parameters"] = int(lin.num_params)
    gen = torch.Generator(device="cpu").manual_seed(0)
    v = torch.randn(lin.num_params, generator=gen).to(lin.device)
    w = torch.randn(*op.range_shape, generator=gen).to(lin.device)

    def pair():
        with torch.no_grad():
            op.A(lin.jvp(v))
        return lin.vjp(op.A_adjoint(w))

    times = [stage("jacobian_pair", pair)[1] for _ in range(3)]
    out["jacobian_pair_s"] = float(np.median(times))
    sampler = CGSampler(CGOptions(tol=0.0, max_iter=args.cg_iters, precond_rank=args.rank))
    post, out["fit_posterior_s"] = stage("fit_posterior", lambda: fit_posterior(
        lin, op, y, sigma**2, prior="gprior",
        em=EMOptions(n_samples=args.samples, em_steps=0, seed=0),
        sampler=sampler))
    first = post.trace[0]
    info = post.info.get("sampler", post.info)
    out["em_step_s"] = float(first["seconds"])
    out["sketch_s"] = float(info.get("precond_time", float("nan")))
    out["cg_iterations"] = int(first["solver_iterations"])
    solve = float(info.get("time_solve", float("nan")))
    out["posterior_sample_s"] = solve / args.samples
    out["cg_iteration_s"] = float(info.get("time_per_iteration", float("nan")))
    out["peak_memory_mb"] = max(out["memory_mb"].values())
    mem.close()
    return out


def slope(pixels, times) -> float | None:
    """Least-squares slope of log(time) against log(pixels)."""
    x, t = np.log(np.asarray(pixels, float)), np.asarray(times, float)
    ok = np.isfinite(t) & (t > 0)
    if ok.sum() < 2:
        return None
    return float(np.polyfit(x[ok], np.log(t[ok]), 1)[0])


KEYS = ("dip_iteration_s", "jacobian_pair_s", "posterior_sample_s", "cg_iteration_s",
        "sketch_s", "em_step_s", "peak_memory_mb")


def _slopes(rows: list[dict]) -> dict:
    px = [r["pixels"] for r in rows]
    out = {}
    for k in KEYS:
        t = [r.get(k) for r in rows]
        out[k] = {"slope_least_squares": slope(px, t),
                  "slope_endpoints": slope([px[0], px[-1]], [t[0], t[-1]])
                  if len(rows) > 1 else None}
    return out


def summarise(rows: list[dict]) -> dict:
    """Slopes per allocator, ctuq's speed-up per size, and the check of the sample time's slope."""
    by = {a: [r for r in rows if r["allocator"] == a] for a in ("ctuq", "system")}
    out = {f"slopes_{a}": _slopes(rs) for a, rs in by.items() if rs}
    if by["ctuq"] and by["system"]:
        system = {r["size"]: r for r in by["system"]}
        out["speedup_ctuq_over_system"] = {
            str(r["size"]): {k: system[r["size"]][k] / r[k] for k in KEYS
                             if k != "peak_memory_mb" and r.get(k) and system[r["size"]].get(k)}
            for r in by["ctuq"] if r["size"] in system}
        out["peak_memory_ratio_ctuq_over_system"] = {
            str(r["size"]): r["peak_memory_mb"] / system[r["size"]]["peak_memory_mb"]
            for r in by["ctuq"] if r["size"] in system}
    main = out.get("slopes_ctuq") or out.get("slopes_system")
    s = main["posterior_sample_s"]["slope_least_squares"]
    out["time_per_sample_slope_at_most_1.1"] = None if s is None else s <= 1.1
    return out
