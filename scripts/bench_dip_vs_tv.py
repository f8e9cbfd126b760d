#!/usr/bin/env python
"""DIP+TV against TV and FBP on the calibration benchmark's test scans (issue 26 item 3).

Prints one JSON document on stdout. The scans and DIP+TV reconstructions are
those of ``scripts/bench_calibration.py`` (its ``--partial`` case file and
``--arrays`` folder): each scan is simulated again from its case (same
phantom, geometry and noise seed: deterministic), TV (PDHG, 1000
iterations; at the documented default weight with the true noise std, and
at the best of 0.25–4 × that weight for the image, chosen with the truth in
hindsight) and FBP are computed on it, and the stored DIP+TV reconstruction (the size's preset,
default settings) is scored beside them. PSNR and SSIM as in
``scripts/bench_dip.py`` (scikit-image, data range of the truth).

Per size: the mean of every method, the mean DIP+TV − TV difference, the
number of images on which DIP+TV is at least as good as TV, per family and
condition; the DIP's iterations (the preset's) and wall time (from the case
file). No DIP is fitted for these sizes: the run takes seconds per case.

Sizes without stored reconstructions (``--fit-sizes``, e.g. 256) are fitted
here, on the test split's cases of every family (``--per-family`` images,
``--angles`` angles, ``--noise``), with the size's preset and default DIP
settings; the fit's ``monitor`` scores the lowest-loss iterate every
``--monitor-every`` iterations, which gives the iterations and seconds the
DIP needs to reach TV's PSNR on that scan (None where it never does). These
cases are resumable (``--fit-partial``, one JSON line per finished case).

Usage::

    python scripts/bench_dip_vs_tv.py --partial cases.jsonl --arrays arrays/ \\
        --sizes 64,128 > benchmarks/results/bench_dip_vs_tv.json
    python scripts/bench_dip_vs_tv.py --sizes "" --fit-sizes 256 --per-family 2 \\
        --fit-partial dip256.jsonl > bench_dip_vs_tv_256.json
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from ctuq.bench import dip_vs_tv as B
from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json, read_cases, run_resumable


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partial", help="bench_calibration's case file (for --sizes)")
    ap.add_argument("--arrays", help="bench_calibration's --arrays folder (for --sizes)")
    ap.add_argument("--sizes", default="64,128",
                    help="sizes scored from the stored reconstructions ('' for none)")
    ap.add_argument("--fit-sizes", default="", help="sizes whose DIP is fitted here")
    ap.add_argument("--per-family", type=int, default=2, help="images per family (fitted)")
    ap.add_argument("--angles", type=int, default=60, help="angles of the fitted cases")
    ap.add_argument("--noise", type=float, default=0.05, help="noise of the fitted cases")
    ap.add_argument("--monitor-every", type=int, default=25,
                    help="iterations between PSNR checks of the fitted DIP")
    ap.add_argument("--fit-partial", help="JSON lines of finished fitted cases (resume)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    fit_sizes = [int(s) for s in args.fit_sizes.split(",") if s.strip()]
    if sizes and not (args.partial and args.arrays):
        ap.error("--sizes needs --partial and --arrays (or --sizes '' with --fit-sizes)")
    cases = [r for r in read_cases(args.partial, "id").values() if r["size"] in sizes] \
        if sizes else []
    t0 = time.perf_counter()
    rows = [r for r in (B.run_case(c, args.arrays) for c in cases) if r is not None]
    fitted = B.fit_cases(fit_sizes, args.per_family, args.angles, args.noise)
    rows += run_resumable(fitted, args.fit_partial,
                          lambda c: B.run_fit_case(c, args.monitor_every))
    cases += fitted
    dump_json({"script": "scripts/bench_dip_vs_tv.py", "argv": sys.argv[1:] if argv is None
               else argv, "split": sorted({c["split"] for c in cases}),
               "tv": "PDHG, default weight (TV_WEIGHT_FACTOR · σ · rms column norm), true σ, "
                     "1000 iterations, x ≥ 0",
               "tv_best": f"the same at the best of {list(B.TV_FACTORS)} × the default weight "
                          "per image (PSNR against the truth, in hindsight); stored cases only",
               "machine": machine("cpu"), "threads": args.threads,
               "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
               "summary": B.summary_by(rows), "cases": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
