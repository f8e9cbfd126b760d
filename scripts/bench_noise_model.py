#!/usr/bin/env python
"""The count noise model against the scalar Gaussian one on realistic VALIDATION scans.

Prints one JSON document on stdout (:mod:`ctuq.bench.noise_model`): per case
and noise model PSNR, ±1σ/±2σ coverage, mean std / RMSE, and their means per
I0. Resumable with ``--partial`` (one JSON line per finished case).

Usage::

    python scripts/bench_noise_model.py --partial nm.jsonl \\
        > benchmarks/results/counts_noise_model_validation.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ctuq.bench import noise_model as B
from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json, run_resumable


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--angles", type=int, default=48)
    ap.add_argument("--I0", default="1e3,1e4,1e5", help="comma-separated open-beam counts")
    ap.add_argument("--families", default="shepp-variant,ellipses")
    ap.add_argument("--per-family", type=int, default=1)
    ap.add_argument("--settings", default='{"threads": 1, "device": "cpu", '
                    '"dip": {"iterations": 300}, "uncertainty": {"em_steps": 2, '
                    '"n_samples": 8, "predictive_samples": 32, "stored_samples": 0}}',
                    help="ReconstructionConfig fields as JSON (the same for every model)")
    ap.add_argument("--partial", help="JSON-lines file of finished cases (resume)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    settings = json.loads(a.settings)
    cases = B.cases([float(v) for v in a.I0.split(",")], a.families.split(","),
                    a.per_family, size=a.size, n_angles=a.angles)
    t0 = time.time()
    rows = run_resumable(cases, a.partial, lambda c: B.run_case(c, settings))
    dump_json({"benchmark": "counts_noise_model", "split": "validation", "settings": settings,
               "size": a.size, "n_angles": a.angles, "machine": machine(),
               "wall_s": time.time() - t0, "summary": B.summarise(rows), "cases": rows},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
