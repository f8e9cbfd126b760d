#!/usr/bin/env python
"""Benchmark the posterior samplers; prints one JSON document on stdout.

For each problem (28² / 20 angles with the ``reference-28`` U-net, 64² / 45
angles with ``dip-64``, 128² / 90 angles with ``dip-128``; the networks are
fitted by a short Adam run, the linearisation does not need a good fit):

- ``components_s``: one batched JVP, VJP, ``A`` and ``Aᵀ`` on ``k + 1``
  vectors (medians), and their sum;
- ``cg``: the Matheron sampler (θ* and k samples): total time, time per
  sample, iterations, set-up (preconditioner) time, and the time per CG
  iteration measured on a fixed-iteration solve; the **overhead ratio** =
  time per CG iteration ÷ (JVP + VJP + A + Aᵀ); ``warm``: a second call as
  in an EM step (fresh draws, θ* and the preconditioner carried over);
- ``sto``: the sample-then-optimise sampler, the same figures;
- ``exact``: the dense float64 oracle (``J``, ``K``, Cholesky, the exact
  variance map, θ* and k exact samples) where its matrices fit in
  ``--exact-max-gb``; then the accuracy of both samplers against it (the
  same draws: image-space error of every sample ``‖J(z − z_exact)‖ /
  ‖J z_exact‖``, θ*, and the median relative error of the per-pixel
  variance from the k samples, next to its Monte-Carlo expectation
  ``0.6745·sqrt(2/k)``), and the speed-up of each sampler over it.

Usage::

    python scripts/bench_sampling.py [--quick] [--sizes 28,64,128] [--k 32]
                                     [--threads 2] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

import torch

from ctuq.bench.machine import machine
from ctuq.bench.sampling import PROBLEMS, bench_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="28² only, k = 8, few repeats (a smoke run)")
    parser.add_argument("--sizes", default="28,64,128")
    parser.add_argument("--k", type=int, default=32, help="samples per sampler run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cg-iterations", type=int, default=5)
    parser.add_argument("--sto-iterations", type=int, default=200)
    parser.add_argument("--fit-steps", type=int, default=150)
    parser.add_argument("--chunk", type=int, default=64,
                        help="most vectors per batched product (bounds the memory of the "
                             "preconditioner sketch); 0: no limit")
    parser.add_argument("--exact-max-gb", type=float, default=6.0)
    parser.add_argument("--precond-rank", type=int, default=100,
                        help="Nyström rank of both samplers (the pipeline's default, 100)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    if args.quick:
        args.sizes, args.k, args.repeats, args.fit_steps = "28", 8, 3, 50
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("CTUQ_CACHE_DIR", tempfile.mkdtemp(prefix="ctuq-bench-"))
    device = torch.device(args.device)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in PROBLEMS]
    if unknown:
        sys.exit(f"unknown size(s) {unknown}; choose from {sorted(PROBLEMS)}")

    doc = {"benchmark": "bench_sampling", "machine": machine(device),
           "settings": {k: v for k, v in vars(args).items()},
           "gpu": None if device.type == "cuda" else
           ("not measured: no CUDA device in this run" if not torch.cuda.is_available()
            else "run again with --device cuda"),
           "results": []}
    t0 = time.perf_counter()
    for size in sizes:
        doc["results"].append(bench_size(size, args, device))
    both = [r for r in doc["results"] if r.get("exact")]
    if both:
        largest = max(both, key=lambda r: r["image"])
        doc["summary"] = {
            "largest_size_with_exact": largest["image"],
            "cg_speedup_vs_exact": largest["cg"]["speedup_vs_exact"],
            "cg_warm_speedup_vs_exact": largest["cg"]["warm"]["speedup_vs_exact"],
            "sto_speedup_vs_exact": largest["sto"]["speedup_vs_exact"],
            "sto_warm_speedup_vs_exact": largest["sto"]["warm"]["speedup_vs_exact"],
        }
    else:
        doc["summary"] = {}
    doc["summary"]["overhead_ratio"] = {str(r["image"]): r["cg"]["overhead_ratio"]
                                        for r in doc["results"]}
    doc["summary"]["targets"] = {"overhead_ratio_max": 1.3, "speedup_min": 10}
    try:
        doc["machine"]["load_average_end"] = os.getloadavg()
    except OSError:
        pass
    doc["wall_s"] = time.perf_counter() - t0
    json.dump(doc, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
