"""Benchmark DIP+TV and MC-dropout DIP against FBP and TV.

Prints one JSON document on stdout (progress goes to stderr): PSNR and SSIM
(scikit-image, data range of the ground truth) and wall time of FBP, TV,
DIP+TV and MC-dropout DIP, per case and averaged, on

- 10 digit phantoms, 28×28, 20 angles, 5 % noise;
- 5 ellipse phantoms, 128×128, 60 angles, 5 % noise;

all seeds fixed, with the issue's targets checked as booleans:
DIP+TV ≥ FBP + 6 dB and ≥ TV + 0.5 dB at 28², DIP+TV ≥ TV at 128².
TV uses the baseline's documented default weight with the true noise std;
``tv_best`` is TV with the best of five weights per case (an oracle, for
reference only). ``dip_tv.loss_ratio_to_tv`` is the DIP's best loss over the
same loss evaluated at the TV reconstruction: where the DIP's TV weight is
TV's (the larger presets), the two solve one problem and a ratio above 1 is
how far the fit is from converged.

Usage::

    python scripts/bench_dip.py            # full run (slow: the 128² fits)
    python scripts/bench_dip.py --quick    # smoke test, about a minute
    python scripts/bench_dip.py --out benchmarks/results/bench_dip.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np
import torch

from ctuq.bench.machine import machine
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 2 digits, 1 ellipse phantom at 64², few iterations")
    p.add_argument("--digits", type=int, default=10, help="number of 28² digit cases")
    p.add_argument("--ellipses", type=int, default=5, help="number of ellipse cases")
    p.add_argument("--ellipse-size", type=int, default=128)
    p.add_argument("--noise", type=float, default=0.05)
    p.add_argument("--mc-samples", type=int, default=256)
    p.add_argument("--no-mc", action="store_true", help="skip MC-dropout DIP")
    p.add_argument("--no-tv-grid", action="store_true", help="skip the TV oracle grid")
    p.add_argument("--iterations-28", type=int, default=None)
    p.add_argument("--iterations-large", type=int, default=None)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest on a shared 2-core CPU)")
    p.add_argument("--jobs", type=int, default=1,
                   help="cases run in this many processes at once (default 1)")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--timing", action="store_true",
                   help="instead: time one DIP iteration per U-net preset and size")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    torch.set_num_threads(max(1, min(2, args.threads)))
    if args.timing:
        doc = {"benchmark": "bench_dip --timing", "load_average": os.getloadavg(),
               "torch": torch.__version__, "rows": timing([1, 2])}
        print(json.dumps(doc, indent=2))
        return

    if args.quick:
        args.digits, args.ellipses, args.ellipse_size = 2, 1, 64
        args.mc_samples = 16
        args.iterations_28 = args.iterations_28 or 300
        args.iterations_large = args.iterations_large or 200
        args.no_tv_grid = True

    t_all = time.perf_counter()
    doc = {
        "benchmark": "bench_dip",
        "machine": {**machine("cpu"), "cuda": torch.cuda.is_available()},
        "settings": {"quick": args.quick, "jobs": args.jobs, "noise_level": args.noise,
                     "mc_samples": args.mc_samples, "mc_dropout_p": 0.05},
    }
    jobs, where = [], []
    if args.digits > 0:
        over = {"iterations": args.iterations_28} if args.iterations_28 else {}
        doc["settings"]["digits28"] = {
            "image_size": 28, "n_angles": 20, "cases": args.digits,
            "dip": DIPConfig.for_image_size(28).with_(**over).to_dict()}
        for k in range(args.digits):
            jobs.append(("digit", k, 28, 20, args, over))
            where.append("digits28")
    if args.ellipses > 0:
        n = args.ellipse_size
        over = {"iterations": args.iterations_large} if args.iterations_large else {}
        key = f"ellipses{n}"
        doc["settings"][key] = {
            "image_size": n, "n_angles": 60, "cases": args.ellipses,
            "dip": DIPConfig.for_image_size(n).with_(**over).to_dict()}
        # the expensive cases first, so that parallel workers finish together
        for k in range(args.ellipses):
            jobs.insert(k, ("ellipses", k, n, 60, args, over))
            where.insert(k, key)
    results = run_jobs(jobs, args.jobs)
    groups = {}
    for key, case in zip(where, results):
        groups.setdefault(key, []).append(case)
    groups = {k: groups[k] for k in sorted(groups, key=lambda g: not g.startswith("digits"))}

    doc["summary"] = {g: summarise(c) for g, c in groups.items()}
    targets = {}
    s28 = doc["summary"].get("digits28")
    if s28:
        targets["digits28_dip_ge_fbp_plus_6dB"] = s28["dip_tv"]["psnr"] >= s28["fbp"]["psnr"] + 6
        targets["digits28_dip_ge_tv_plus_0.5dB"] = s28["dip_tv"]["psnr"] >= s28["tv"]["psnr"] + 0.5
    sl = doc["summary"].get(f"ellipses{args.ellipse_size}")
    if sl:
        targets[f"ellipses{args.ellipse_size}_dip_ge_tv"] = sl["dip_tv"]["psnr"] >= sl["tv"]["psnr"]
    doc["targets"] = targets
    doc["cases"] = groups
    doc["wall_time"] = time.perf_counter() - t_all
    text = json.dumps(doc, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
