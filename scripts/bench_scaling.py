#!/usr/bin/env python
"""How ctuq's stages scale with the pixel count (issue 26 item 4; docs/scaling.md).

Prints one JSON document on stdout (progress on stderr). For every size of
``--sizes`` (default 64, 128, 256, 512), each in a fresh subprocess so that
memory peaks do not carry over, with the size's own U-net preset and a
parallel-beam scan of a fixed number of angles (``--angles``, default 60; an
ellipse phantom of the test split, 5 % noise):

- ``operator``: building the ray transform (backend chosen by memory, named);
- ``dip_iteration``: one DIP+TV step (forward, projection, loss, backward,
  Adam), the median over ``--dip-iters`` timed iterations after 2 warm-up
  ones, read from the trainer's per-iteration progress events;
- ``jacobian_pair``: one ``J v`` and one ``Jᵀ u`` through network and
  operator (the unit of every sampler), median of 3;
- ``posterior_sample`` and ``em_step``: one E-step of the real engine (CG
  sampler, g-prior) with a **fixed amount of work**, so that sizes compare:
  a Nyström sketch of rank ``--rank`` (default 50) and exactly
  ``--cg-iters`` CG iterations (tolerance 0) for ``--samples`` samples
  (default 2) and the mode, solved together; time per sample = solve time /
  samples; EM step = the whole E-step (sketch, solve, statistics; the
  MacKay M-step after it is closed-form and takes microseconds);
- ``fit_posterior``: the whole engine call of that E-step (prior set-up
  included);
- peak resident memory (RSS, sampled every 5 ms) per stage (``STAGES``), and
  on CUDA the peak allocated GPU memory.

Each size runs twice (``--allocator both``, the default): with ctuq's
allocator setting (``ctuq.recon.allocator.keep_freed_memory``, what
``ctuq.reconstruct`` does) and with glibc's default, each in its own
process, so that the speed-up is a ratio measured in the same run.

The network is the DIP after the few timed iterations (not converged: the
costs do not depend on the fit). Summary: the log-log slope of each time
against the pixel count (least squares over the sizes, and between the
smallest and the largest) per allocator, the speed-up of ctuq's setting per
size, and the check ``time_per_sample_slope_at_most_1.1`` (ctuq's setting).

Usage::

    python scripts/bench_scaling.py > docs/bench_scaling.json          # CPU, 64²–512²
    python scripts/bench_scaling.py --device cuda > bench_scaling_gpu.json
    python scripts/bench_scaling.py --quick                             # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

STAGES = ("operator", "dip", "linearize", "jacobian_pair", "fit_posterior")


class PeakRSS:
    """Peak resident memory of this process while a stage runs (a 5 ms sampling thread)."""

    def __init__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.rss())

    def reset(self) -> None:
        self.peak = self.rss()

    def read(self) -> int:
        return max(self.peak, self.rss())

    def close(self):
        self._stop.set()


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
    mem = PeakRSS()
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
    """Slopes per allocator, ctuq's speed-up per size, and the issue's check."""
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=None, help="default 64,128,256,512 (--quick: 32,64)")
    ap.add_argument("--angles", type=int, default=60)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dip-iters", type=int, default=10)
    ap.add_argument("--rank", type=int, default=50)
    ap.add_argument("--cg-iters", type=int, default=10)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--quick", action="store_true",
                    help="sizes 32, 64; 3 iterations, rank 10, 3 CG iterations")
    ap.add_argument("--allocator", default="both", choices=("both", "ctuq", "system"),
                    help="ctuq's allocator setting, glibc's default, or both (default)")
    ap.add_argument("--one-size", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-allocator", default="ctuq", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.dip_iters, args.rank, args.cg_iters = 3, 10, 3
    args.sizes = args.sizes or ("32,64" if args.quick else "64,128,256,512")
    if args.one_size is not None:       # the child: one size, one JSON line
        print(json.dumps(one_size(args.one_size, args)))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_evidence import _clean
    from bench_sampling import _machine
    import torch

    allocators = ("ctuq", "system") if args.allocator == "both" else (args.allocator,)
    # glibc's default must really be the default in the "system" child
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    rows, t0 = [], time.perf_counter()
    for size in [int(s) for s in args.sizes.split(",")]:
        for allocator in allocators:
            cmd = [sys.executable, __file__, "--one-size", str(size),
                   "--one-allocator", allocator] + [
                a for a in (argv if argv is not None else sys.argv[1:])]
            cmd += ["--dip-iters", str(args.dip_iters), "--rank", str(args.rank),
                    "--cg-iters", str(args.cg_iters)]
            print(f"bench_scaling: {size}², allocator {allocator} ...", file=sys.stderr,
                  flush=True)
            res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, env=env)
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"bench_scaling: {size}² ({allocator}): DIP it "
                  f"{rows[-1]['dip_iteration_s']:.3f} s, sample "
                  f"{rows[-1]['posterior_sample_s']:.3f} s, "
                  f"peak {rows[-1]['peak_memory_mb']:.0f} MB", file=sys.stderr, flush=True)
    doc = {"script": "scripts/bench_scaling.py", "argv": sys.argv[1:] if argv is None else argv,
           "device": args.device, "threads": args.threads, "angles": args.angles,
           "work_per_sample": {"rank": args.rank, "cg_iterations": args.cg_iters,
                               "samples": args.samples},
           "network": "the DIP after its few timed iterations (costs do not depend on the fit)",
           "machine": _machine(torch.device(args.device)), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
           "sizes": rows, "summary": summarise(rows)}
    json.dump(_clean(doc), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
