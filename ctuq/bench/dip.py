"""DIP+TV against FBP, TV (with a weight grid) and MC dropout on phantoms, and DIP's iteration times.

:func:`run_case` scores one phantom (PSNR, SSIM; :func:`ctuq.bench.scores.image_metrics`),
:func:`run_jobs` runs cases in worker processes, :func:`summarise` averages
them, :func:`timing` measures the U-net's forward/backward time per iteration
against threads.
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
import torch

from ctuq.bench.scores import image_metrics as metrics
from ctuq.data import phantoms
from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.simulate import simulate_sinogram
from ctuq.recon.baselines import default_tv_weight, fbp_reconstruction, tv_reconstruction
from ctuq.recon.dip import DIPConfig, dip_tv_loss, fit_dip
from ctuq.recon.mc_dropout import fit_mc_dropout

log = logging.getLogger("bench_dip")

TV_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)


def run_case(name, gt, op, seed, args, dip_overrides):
    y, sigma = simulate_sinogram(gt, op, args.noise, seed=seed)
    case = {"name": name, "noise_std": sigma, "seed": seed}
    t = time.perf_counter()
    case["fbp"] = {**metrics(gt, fbp_reconstruction(y, op)), "time": time.perf_counter() - t}
    t = time.perf_counter()
    tv = tv_reconstruction(y, op, noise_std=sigma)
    case["tv"] = {**metrics(gt, tv), "time": time.perf_counter() - t}
    if not args.no_tv_grid:
        w0 = default_tv_weight(op, sigma)
        best = None
        for f in TV_GRID:
            m = metrics(gt, tv_reconstruction(y, op, weight=f * w0, noise_std=sigma))
            if best is None or m["psnr"] > best["psnr"]:
                best = {**m, "weight_factor": f}
        case["tv_best"] = best
    size = op.geometry.image_shape
    cfg = DIPConfig.for_image_size(size, device=args.device, seed=seed,
                                   progress_every=10**6).with_(**dip_overrides)
    res = fit_dip(y, op, cfg, noise_std=sigma)
    # The DIP+TV loss is a TV objective; its value at the TV reconstruction says how far
    # the fit is from that objective's minimiser (equal weights: the same problem).
    with torch.no_grad():  # fit_dip moved op to the fit's device: evaluate there
        tv_obj = float(dip_tv_loss(
            torch.as_tensor(tv, dtype=torch.float32, device=op.device)[None, None],
            torch.as_tensor(y, dtype=torch.float32, device=op.device), op, res.tv_weight)[0])
    case["dip_tv"] = {**metrics(gt, res.reconstruction), "time": res.wall_time,
                      "best_iteration": res.best_iteration, "tv_weight": res.tv_weight,
                      "loss": res.best_loss, "loss_at_tv_reconstruction": tv_obj,
                      "loss_ratio_to_tv": res.best_loss / tv_obj}
    if not args.no_mc:
        mc = fit_mc_dropout(y, op, cfg, n_samples=args.mc_samples, noise_std=sigma)
        err = (mc.mean.cpu() - torch.as_tensor(gt)).abs().flatten()
        std = mc.std.cpu().flatten()
        case["mc_dropout"] = {**metrics(gt, mc.mean), "time": mc.wall_time,
                              "mean_std": float(std.mean()),
                              "std_error_corr": float(np.corrcoef(std, err)[0, 1])}
    log.info("%s: FBP %.2f  TV %.2f  DIP+TV %.2f (%.1f s, loss %.3f× TV's)%s", name,
             case["fbp"]["psnr"], case["tv"]["psnr"], case["dip_tv"]["psnr"],
             case["dip_tv"]["time"], case["dip_tv"]["loss_ratio_to_tv"],
             f"  MC-DO {case['mc_dropout']['psnr']:.2f}" if "mc_dropout" in case else "")
    return case


_OPS: dict = {}


def _case_job(kind: str, k: int, size: int, n_angles: int, args, over: dict) -> dict:
    """One benchmark case; module level so that worker processes can run it."""
    torch.set_num_threads(max(1, min(2, args.threads)))
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    key = (size, n_angles)
    if key not in _OPS:
        _OPS[key] = RayTransform(Geometry.parallel(size, n_angles))
    op = _OPS[key]
    if kind == "digit":
        gt = phantoms.digits(k + 1, size=size, seed=0)[k]
        return run_case(f"digit{k}", gt, op, 1000 + k, args, over)
    return run_case(f"ellipses{k}", phantoms.ellipses(size, seed=k), op, 2000 + k, args, over)


def _init_worker():
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")


def run_jobs(jobs, n_workers):
    """Run ``(kind, k, size, n_angles, args, over)`` jobs, in order, in ``n_workers`` processes."""
    if n_workers <= 1:
        return [_case_job(*j) for j in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(n_workers, mp_context=mp.get_context("spawn"),
                             initializer=_init_worker) as pool:
        futures = [pool.submit(_case_job, *j) for j in jobs]
        return [f.result() for f in futures]


def summarise(cases):
    out = {}
    for method in ("fbp", "tv", "tv_best", "dip_tv", "mc_dropout"):
        rows = [c[method] for c in cases if method in c]
        if rows:
            out[method] = {k: float(np.mean([r[k] for r in rows]))
                           for k in ("psnr", "ssim", "time", "loss_ratio_to_tv")
                           if k in rows[0]}
    return out


TIMING_CASES = [
    (28, "reference-28", None),
    (64, "dip-64", None),
    (64, "3x32", dict(scales=3, channels=(32,) * 3, skip_channels=(0, 4, 4))),
    (128, "dip-128", None),
    (128, "4x32", dict(scales=4, channels=(32,) * 4, skip_channels=(0, 4, 4, 4))),
    (128, "5x64", dict(scales=5, channels=(64,) * 5, skip_channels=(0, 4, 4, 4, 4))),
    (256, "dip-256", None),
    (256, "6x64", dict(scales=6, channels=(64,) * 6, skip_channels=(0,) + (4,) * 5)),
]


def timing(threads_list, repeats=20):
    """Median ms of one DIP iteration (U-net forward + A + loss + backward + Adam step)."""
    from ctuq.models.unet import UNetConfig, build_unet, count_parameters

    rows = []
    ops = {}
    for size, name, spec in TIMING_CASES:
        cfg = name if spec is None else UNetConfig(**spec)
        if size not in ops:
            ops[size] = RayTransform(Geometry.parallel(size, 20 if size == 28 else 60))
        op = ops[size]
        y = torch.zeros(1, 1, *op.geometry.range_shape)
        for threads in threads_list:
            torch.set_num_threads(threads)
            net = build_unet(cfg)
            opt = torch.optim.Adam(net.parameters(), 1e-3)
            x = torch.rand(1, 1, size, size)
            times = []
            n = max(3, min(repeats, int(repeats * 784 / size**2 * 16)))
            for k in range(n + 2):
                t = time.perf_counter()
                opt.zero_grad()
                out = net(x)
                dip_tv_loss(out, y, op, 1.0)[0].backward()
                opt.step()
                if k >= 2:
                    times.append(time.perf_counter() - t)
            rows.append({"image_size": size, "net": name, "params": count_parameters(net),
                         "threads": threads, "ms_per_iteration": 1000 * float(np.median(times)),
                         "repeats": n})
            log.info("%s", rows[-1])
    return rows
