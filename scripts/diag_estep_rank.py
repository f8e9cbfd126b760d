#!/usr/bin/env python
"""How the Nyström rank decides whether an E-step's CG solve converges: one slow solve.

A benchmark case (``ctuq.bench.cases``; a realistic one with ``--I0``) is
reconstructed with the default settings (``--set`` changes them) until the
EM's first CG solve that ends above its tolerance (or, with ``--first``, the
first solve whatever its end). That system (the same right-hand sides, prior
and noise variance) is then solved again from zero with a fresh Nyström
preconditioner at each rank of ``--ranks``, with no patience rule and
``--max-iter`` iterations, and the reconstruction is stopped.

One JSON document on stdout: the failing solve (rows, iterations, residual,
``σ²``, the prior's log-hyperparameters) and per rank ``λ_1/σ²``, ``λ_r/σ²``, the
sketch's seconds, the iterations, whether it converged, the largest final residual and the
residual history every 10 iterations. ``"reached": false`` when the
reconstruction ended without such a solve.

Usage::

    python scripts/diag_estep_rank.py --split validation --family photos --index 52 \\
        --size 128 --angles 60 --I0 1e5 --ranks 400,800 --max-iter 300
"""

from __future__ import annotations

import argparse
import time

import torch

import ctuq
import ctuq.posterior.sampling_cg as sampling_cg
from ctuq.bench.calibration import CalibrationRun, reconstruction_config
from ctuq.bench.cases import simulate, sinogram
from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json, parse_variant
from ctuq.posterior.preconditioner import NystromPreconditioner, hyper_vector


class _Reached(Exception):
    """Raised inside the reconstruction once the solve is studied."""


def study(case: dict, ranks, max_iter: int, settings: dict, first: bool, threads: int,
          seed: int = 5) -> dict:
    """Reconstruct ``case`` until its first slow CG solve and re-solve it at ``ranks``."""
    torch.set_num_threads(threads)
    solve, kernels, out = sampling_cg.batched_cg, [], {"reached": False}
    kernel_class = sampling_cg.ObservationKernel

    class Kernel(kernel_class):  # remembers the sampler's kernel: P, σ², d_y
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            kernels.append(self)

    def watched(apply_K, B, X0=None, precond=None, **kw):
        X, info = solve(apply_K, B, X0=X0, precond=precond, **kw)
        if info["converged"] and not first:
            return X, info
        kern = kernels[-1]
        out.update(reached=True, rows=int(B.shape[0]), d_y=kern.d_y,
                   noise_var=kern.noise_var, warm_start=X0 is not None,
                   prior_log_hyperparameters=hyper_vector(kern.prior).tolist(),
                   solve={"iterations": info["iterations"], "converged": info["converged"],
                          "stagnated": info["stagnated"],
                          "max_residual": float(info["residuals"].max())},
                   ranks=[])
        kw = {k: v for k, v in kw.items() if k not in ("callback", "patience", "max_iter")}
        for rank in ranks:
            t = time.perf_counter()
            pc = NystromPreconditioner.build(kern.P, kern.d_y, rank,
                                             generator=torch.Generator().manual_seed(seed))
            built = time.perf_counter() - t
            t = time.perf_counter()
            _, i = solve(kern, B, precond=lambda R, pc=pc: pc(R, kern.noise_var),
                         patience=None, max_iter=max_iter, **kw)
            out["ranks"].append({
                "rank": pc.rank, "lambda_1_over_noise": float(pc.eigvals[0]) / kern.noise_var,
                "lambda_r_over_noise": pc.ratio(kern.noise_var),
                "sketch_s": round(built, 1), "solve_s": round(time.perf_counter() - t, 1),
                "iterations": i["iterations"], "converged": i["converged"],
                "max_residual": float(i["residuals"].max()),
                "history_every_10": [round(h, 5) for h in i["residual_history"][::10]]})
        raise _Reached

    sampling_cg.batched_cg, sampling_cg.ObservationKernel = watched, Kernel
    try:
        scan = simulate(case)
        config = reconstruction_config(case, CalibrationRun(threads=threads), settings,
                                       predcp=False)
        ctuq.reconstruct(sinogram(scan, with_truth=False), config)
    except _Reached:
        pass
    finally:
        sampling_cg.batched_cg, sampling_cg.ObservationKernel = solve, kernel_class
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", default="validation")
    ap.add_argument("--family", default="photos")
    ap.add_argument("--index", type=int, default=52)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--angles", type=int, default=60)
    ap.add_argument("--I0", type=float, default=None, help="realistic counts (else --noise)")
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--ranks", default="400,800")
    ap.add_argument("--max-iter", type=int, default=300)
    ap.add_argument("--set", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                    help="settings of the reconstruction, as bench_calibration's --set")
    ap.add_argument("--first", action="store_true",
                    help="study the first solve even when it converged")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    case = {"split": args.split, "family": args.family, "index": args.index,
            "size": args.size, "n_angles": args.angles,
            "noise": None if args.I0 else args.noise, "I0": args.I0}
    settings = parse_variant("set:" + args.set)[1] if args.set else {}
    doc = {"case": case, "settings": settings, "max_iter": args.max_iter,
           "machine": machine(),
           **study(case, [int(r) for r in args.ranks.split(",")], args.max_iter, settings,
                   args.first, args.threads)}
    dump_json(doc)


if __name__ == "__main__":
    main()
