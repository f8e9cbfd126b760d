#!/usr/bin/env python
"""Uncertainty quality and speed of ctuq against the papers' baselines (issue 10).

Prints one JSON document on stdout (progress on stderr) and writes
``docs/benchmarks.md`` (tables) with two PNGs (calibration curves, scaling).

**Quality** (``--part quality``), seeds fixed, noise std known:

- 10 digit phantoms, 28², 20 angles, 5 % and 10 % noise (``reference-28``);
- 5 ellipse phantoms, 128², 60 angles, 5 % noise (``dip-128``).

Methods, each scored by :func:`ctuq.recon.predictive.summary` (PSNR, SSIM,
per-pixel and k×k patch test log-likelihood k = 1…10, ±1/2/3σ coverage,
Spearman(std, |error|)) and a calibration curve:

- ``fbp``: FBP with :func:`ctuq.recon.baselines.fbp_variance`: propagated
  noise (FBP of 128 noise sinograms) + a homoscedastic image term ``s²``
  that explains the excess data residual, ``s² = max(0, mean r² − σ²) /
  mean_i ‖A_i‖²`` with ``r = A x_fbp − y``; diagonal, so its patch LL is
  the pixel LL;
- ``dip_fixed``: the DIP+TV reconstruction with σ² = 1 everywhere (the
  papers' "DIP (σ² = 1)"); diagonal;
- ``mc_dropout``: MC-dropout DIP (p = 0.05, 256 passes), sample mean and covariance;
- ``lla_exact`` (28² only): the exact dense linearised posterior, g-prior
  variance at its exact-evidence optimum (σ² fixed at the known noise), exact
  pixel variance, 256 exact samples for the patch covariances;
- ``ctuq``: the pipeline's uncertainty stages (sample-based EM, CG sampler,
  g-prior, preset defaults) without TV-PredCP, and ``ctuq_predcp`` with it
  (the pipeline default), both on the same DIP fit.

**Speed and scaling** (``--part scaling``) at 28², 64², 128², 256² (20
angles at 28², 60 above, so that the ray transform's cost grows like the
pixel count) with the size's preset: wall time and peak memory (RSS on CPU,
``max_memory_allocated`` on CUDA) of each stage — DIP (``--dip-iterations``
iterations, and the time per iteration × the preset's iterations), EM
(``--em-steps`` steps with TV-PredCP), predictive sampling — the time per
posterior sample (a warm ``draw`` after EM, as in the pipeline), the
log-log slope of time per sample against pixel count from 64² to 256², and
the CG sampler's overhead ratio (time per CG iteration ÷ one batched JVP +
VJP + A + Aᵀ).

Usage::

    python scripts/bench_uq.py                       # everything (about 1.5 h on 2 CPU cores)
    python scripts/bench_uq.py --part quality --jobs 2 --partial uq_cases.jsonl
    python scripts/bench_uq.py --part scaling --device cuda
    python scripts/bench_uq.py --quick               # minutes: tiny versions of both parts

With ``--partial FILE`` finished quality cases are appended to FILE and
read back on a rerun instead of recomputed; ``--scaling-json`` /
``--quality-json`` reuse a previous run's part when only the other is rerun.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from ctuq.bench.machine import machine
from ctuq.bench.runner import clean
from ctuq.bench.uq import MC_SAMPLES, run_quality, run_scaling, quiet_loggers, markdown, plots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["all", "quality", "scaling"], default="all")
    ap.add_argument("--quick", action="store_true",
                    help="2 digits, 1 ellipse at 64², few iterations; sizes 28, 64")
    ap.add_argument("--digits", type=int, default=10)
    ap.add_argument("--ellipses", type=int, default=5)
    ap.add_argument("--ellipse-size", type=int, default=128)
    ap.add_argument("--exact-max-size", type=int, default=28)
    ap.add_argument("--mc-samples", type=int, default=MC_SAMPLES)
    ap.add_argument("--jobs", type=int, default=2, help="quality cases in parallel")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per quality job")
    ap.add_argument("--partial", default=None, help="JSON-lines cache of finished cases")
    ap.add_argument("--sizes", type=int, nargs="+", default=[28, 64, 128, 256])
    ap.add_argument("--device", default="cpu", help="scaling device: cpu or cuda")
    ap.add_argument("--scaling-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dip-iterations", type=int, default=60,
                    help="DIP iterations timed per size (scaling)")
    ap.add_argument("--em-steps", type=int, default=2, help="EM steps timed per size")
    ap.add_argument("--samples-per-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quality-json", default=None, help="reuse this run's quality part")
    ap.add_argument("--scaling-json", default=None, help="reuse this run's scaling part")
    ap.add_argument("--docs", default="docs", help="folder of benchmarks.md ('' to skip)")
    ap.add_argument("--plots", default="benchmarks/results", help="folder of the PNGs")
    args = ap.parse_args(argv)
    args.quick_iterations = 150
    if args.quick:
        args.digits, args.ellipses, args.ellipse_size = 2, 1, 64
        args.sizes, args.mc_samples, args.dip_iterations = [28, 64], 32, 10
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    quiet_loggers()
    t0 = time.perf_counter()
    doc = {"benchmark": "bench_uq", "script": "scripts/bench_uq.py", "quick": args.quick,
           "machine": machine(torch.device(args.device))}
    if args.quality_json:
        doc["quality"] = json.loads(Path(args.quality_json).read_text())["quality"]
    elif args.part in ("all", "quality"):
        doc["quality"] = run_quality(args)
    if args.scaling_json:
        doc["scaling"] = json.loads(Path(args.scaling_json).read_text())["scaling"]
    elif args.part in ("all", "scaling"):
        doc["scaling"] = run_scaling(args)
    doc["settings"] = {k: v for k, v in vars(args).items() if k not in ("docs", "plots")}
    doc["wall_time_s"] = time.perf_counter() - t0
    doc = clean(doc)
    if args.docs:
        folder, figures = Path(args.docs), Path(args.plots)
        folder.mkdir(parents=True, exist_ok=True)
        figures.mkdir(parents=True, exist_ok=True)
        doc["written"] = plots(doc, figures)
        (folder / "benchmarks.md").write_text(markdown(doc, os.path.relpath(figures, folder)))
        doc["written"].append(str(folder / "benchmarks.md"))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
