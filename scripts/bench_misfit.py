#!/usr/bin/env python
"""The misfit check's threshold chosen on validation scans with one injected error each.

Prints one JSON document on stdout: every scan's statistics (χ²/m at the
problem's noise level, the largest per-angle χ², the verdict; for the
``full`` tier also the product's χ²/dof, the ratio learned / data σ², ±2σ
coverage and RMSE), the threshold with the smallest false-positive rate at
≥ 95 % detection (:func:`ctuq.bench.misfit.choose_threshold`) and the flag
rates per error type at it. See :mod:`ctuq.bench.misfit` for the scans.

Usage (benchmarks/results/misfit_validation.json: four shards ``--shard k/4``
with their own ``--partial``, six ``right0`` scans in a fifth run, then the
partial files concatenated and the same command once more, which only
summarises)::

    python scripts/bench_misfit.py --right 40 --per-error 8 --full-right 2 \\
        --full-centre5 4 --exact 6 --arrays arrays/ --partial misfit.jsonl \\
        > benchmarks/results/misfit_validation.json
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from ctuq.bench import misfit as B
from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json, run_resumable
from ctuq.recon.diagnostics import (ANGLE_THRESHOLD_FACTOR, MISFIT_THRESHOLD,
                                    MISREGISTRATION_PX)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--angles", type=int, default=40)
    ap.add_argument("--right", type=int, default=40, help="scans without an error")
    ap.add_argument("--exact", type=int, default=0,
                    help="right scans without the hidden centre offset (reported apart)")
    ap.add_argument("--per-error", type=int, default=8, help="scans per injected error")
    ap.add_argument("--full-right", type=int, default=8,
                    help="right scans that run the whole product (the 5-px ones always do)")
    ap.add_argument("--full-centre5", type=int, default=8,
                    help="5-px centre scans that run the whole product (the rest: DIP fit)")
    ap.add_argument("--predictive-samples", type=int, default=32)
    ap.add_argument("--partial", help="JSON lines of finished scans (resume)")
    ap.add_argument("--shard", default="0/1",
                    help="k/n: run every n-th scan from the k-th (partial files of the "
                         "shards concatenated and run again give the summary)")
    ap.add_argument("--arrays", help="folder for each scan's y, forward projection, σ²")
    ap.add_argument("--misregistration", type=float, default=MISREGISTRATION_PX,
                    help="δ (detector pixels) of the statistic, recomputed from --arrays")
    ap.add_argument("--not-required", default="pixel1.5",
                    help="errors left out of the ≥ 95 %% detection the threshold must reach "
                         "(comma-separated; their flag rates are still reported)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    k, n = (int(v) for v in args.shard.split("/"))
    torch.set_num_threads(args.threads)
    cases = B.plan(args.right, args.per_error, args.size, args.angles,
                   full_right=args.full_right, full_per_error=args.full_centre5,
                   n_exact=args.exact)
    # interleave the kinds of scan, so that a run stopped early has some of each
    pos, count = {}, {}
    for c in cases:
        count[c["error"]] = count.get(c["error"], 0) + 1
    for c in cases:
        pos[c["id"]] = sum(1 for d in cases[:cases.index(c)] if d["error"] == c["error"]) \
            / count[c["error"]]
    cases = sorted(cases, key=lambda c: pos[c["id"]])[k::n]
    t0 = time.perf_counter()
    rows = run_resumable(cases, args.partial, lambda c: B.run_case(
        c, predictive_samples=args.predictive_samples, threads=args.threads,
        arrays=args.arrays))
    if args.arrays:   # the statistic at the chosen misregistration, from the stored arrays
        rows = B.restat(rows, args.arrays, args.misregistration)
    choice_all = B.choose_threshold(rows, ANGLE_THRESHOLD_FACTOR)
    # a pixel size error in parallel beam is a scale change of the image, which
    # explains the data: no residual statistic sees it (the result JSON shows it)
    seen = [k for k in B.WRONG if k not in args.not_required.split(",")]
    choice = B.choose_threshold(rows, ANGLE_THRESHOLD_FACTOR, kinds=seen)
    t = choice["threshold"] if choice.get("threshold") else MISFIT_THRESHOLD
    dump_json({"script": "scripts/bench_misfit.py",
               "argv": sys.argv[1:] if argv is None else argv, "split": "validation",
               "noise": "white Gaussian on the line integrals, std p·mean|y|, p in [1 %, 5 %], "
                        "not given to ctuq (estimated from the air); counts at I0 = 1e9",
               "statistic": "chi2_m = ‖r‖²/m, r whitened by σ² + (δ ∂(A x̂)/∂u)², σ the "
                            f"problem's noise level, δ = {args.misregistration} px; flag when chi2_m > t or one angle's > {ANGLE_THRESHOLD_FACTOR}·t",
               "machine": machine("cpu"), "threads": args.threads,
               "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
               "misregistration_px": args.misregistration, "choice": choice, "choice_all_errors": choice_all, "threshold_before": MISFIT_THRESHOLD,
               "summary": B.summarise(rows, t, ANGLE_THRESHOLD_FACTOR),
               "summary_at_threshold_before": B.summarise(rows, MISFIT_THRESHOLD,
                                                          ANGLE_THRESHOLD_FACTOR),
               "cases": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
