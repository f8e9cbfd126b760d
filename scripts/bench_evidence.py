"""Benchmark the sample-based evidence (EM / MacKay) against the exact evidence.

Prints one JSON document on stdout (progress on stderr). On digit phantoms
(28×28, 20 angles, 5 % noise; the reference U-net fitted by DIP+TV), per case:

- the exact-evidence oracle: dense ``Φ`` (float64) and the L-BFGS optimum of
  the exact log evidence over the block variances and ``σ²`` (time to build
  and to optimise);
- sample-based EM (MacKay, CG sampler, no PredCP) for k ∈ {1, 2, 8, 32}:
  wall time, EM steps, the exact log evidence at its hyperparameters, and
  the error of its last ``γ̂`` against the exact ``γ`` at the same
  hyperparameters;
- sample-based EM with TV-PredCP (k = 8, lengthscales learned);
- the per-pixel test log-likelihood of the ground truth under
  ``N(x̂, diag Cov[x|y])`` and the ±2σ coverage, with the exact posterior
  variance for the hyperparameters of (a) untuned defaults (``a_b = 1``,
  ``ℓ_b = 0.1``, ``σ²`` = the true noise variance), (b) the exact optimum,
  (c) sample-based EM (each k), (d) sample-based EM + TV-PredCP; for (c, k=8)
  also with the sample-based std of 128 fresh posterior draws.

Targets (checked as booleans): (c, k=8) within 0.05 nats/pixel of (b);
(c) and (d) better than (a).

Usage::

    python scripts/bench_evidence.py                 # full: 10 phantoms, reference-28
    python scripts/bench_evidence.py --quick         # 2 phantoms, small U-net, minutes
    python scripts/bench_evidence.py --out benchmarks/results/bench_evidence.json
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch

from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json, run_resumable
from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import digits
from ctuq.bench.evidence import run_case, summarize


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 phantoms, 8-channel U-net")
    ap.add_argument("--n", type=int, default=None, help="number of phantoms (default 10)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 8, 32])
    ap.add_argument("--priors", nargs="+", default=["matern", "gprior"],
                    choices=["matern", "ard", "gprior"])
    ap.add_argument("--partial", default=None,
                    help="append each finished case here (JSON lines); cases already in "
                         "the file are read back instead of recomputed")
    ap.add_argument("--em-steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    for name in ("ctuq.recon.linearize", "ctuq.data.operators", "ctuq.recon.dip",
                 "ctuq.recon.sampling"):
        logging.getLogger(name).setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    n = args.n if args.n is not None else (2 if args.quick else 10)
    op = RayTransform(Geometry.parallel(28, 20))
    images = digits(n, 28, seed=0)
    t0 = time.perf_counter()
    cases = run_resumable([{"id": i} for i in range(n)], args.partial,  # resumes
                          lambda c: run_case(c["id"], images[c["id"]], op, args))
    ks = [str(k) for k in args.ks]
    summary = {p: summarize(cases, p, ks) for p in args.priors}
    targets = {p: summary[p].pop("targets") for p in args.priors}
    doc = {
        "benchmark": "evidence",
        "setting": {"image": "28x28 digits", "angles": 20, "noise": "5% Gaussian",
                    "n_phantoms": n, "unet": "reference-28 (8 channels)" if args.quick
                    else "reference-28", "priors": args.priors, "em_steps": args.em_steps,
                    "sampler": "cg", "learn_noise": True, "ks": args.ks,
                    "quality": "exact posterior variance at each set of hyperparameters; "
                               "test_ll = mean per-pixel log N(x_true; x_hat, var + 1e-6)"},
        "summary": summary,
        "targets": targets,
        "cases": cases,
        "machine": machine("cpu"),
        "wall_time": time.perf_counter() - t0,
    }
    dump_json(doc, sys.stdout, path=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
