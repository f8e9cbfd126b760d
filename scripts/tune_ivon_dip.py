#!/usr/bin/env python
"""Choose IVON-DIP's settings on validation data (issue 24; docs/ivon.md).

Prints one JSON document on stdout (progress on stderr). For every validation
case (below) the Adam DIP+TV fit of the size's preset is run once (the
reference PSNR and the start of the ``start='dip'`` configurations) and then
every configuration of the grid; each is scored against the truth by

- the per-pixel test log-likelihood ``mean log N(x; x̂, std² + 1e-6)`` (the
  project's stated variance floor of 1e-6, as in docs/benchmarks.md),
- ±1/2/3σ coverage, Spearman(std, |error|), PSNR, the mean std,

for both centres ``x̂``: the output of the mean weights (``mean``) and the
mean of the weight samples' outputs (``sample_mean``). A configuration's
score is its mean log-likelihood over the cases (the worst case and the
coverage are reported beside it); the chosen one is the best score.

Data (the project's split; docs/ivon.md): **validation only** —
ellipses and rectangles with seeds 1000…1099, Shepp–Logan variants seeds
1000…1099 (``ctuq.data.phantoms.shepp_variant``; the family is skipped, and
listed as skipped, where that function does not exist), digits 1000…1099 of
the seed-0 order of :func:`ctuq.data.phantoms.digits` (= ``phantoms.digit(i)``),
noise seeds 5000…5999. The tuning set (digits seeds 0–9, ellipse seeds 0–99)
was used only to find a stable range of the step size; the test set (seeds
≥ 2000, noise seeds ≥ 7000, natural-image crops) is never read here.

Usage::

    python scripts/tune_ivon_dip.py --size 28 --per-family 2 --partial ivon28.jsonl > benchmarks/results/tune_ivon_dip_28.json
    python scripts/tune_ivon_dip.py --size 64 --per-family 1 \
        --configs benchmarks/results/tune_ivon_dip_64_configs.json --partial ivon64.jsonl > benchmarks/results/tune_ivon_dip_64.json

``--partial FILE`` appends each finished (case, configuration) row to FILE
and reads it back on a rerun instead of recomputing it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import torch

from ctuq.bench.machine import machine
from ctuq.bench.runner import read_cases
from ctuq.bench.ivon_tuning import VALIDATION_SEED0, VALIDATION_NOISE0, FAMILIES, LL_FLOOR, MAX_STEP, grid, split_cases, cases, run_case, aggregate, choose


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--per-family", type=int, default=2, help="validation images per family")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--noise", type=float, default=0.05, help="relative noise level")
    ap.add_argument("--split", default="legacy", choices=("legacy", "validation"),
                    help="legacy: seeds 1000-1099 (the first pass, tuning range of the "
                         "project split); validation: the project split's validation set")
    ap.add_argument("--grid", default="main", help="named grid: main, quick")
    ap.add_argument("--configs", default=None,
                    help="JSON file with a list of settings dicts (replaces --grid)")
    ap.add_argument("--samples", type=int, default=64, help="weight samples per fit")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--partial", default=None, help="JSON-lines cache of finished rows")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    if args.configs:
        with open(args.configs) as fh:
            configs = json.load(fh)
        configs = [{"lr": 0.3 / c["hess_init"], "clip_radius": MAX_STEP / 0.3, **c}
                   for c in configs]
    else:
        configs = grid(args.grid)
    # one Adam fit per case serves all its configurations: rows are (case, configuration)
    done = read_cases(args.partial, key=lambda r: (r["case"], r["config"]))
    case_list, skipped = (split_cases(args.size, args.per_family, args.families, args.noise),
                          []) if args.split == "validation" else \
        cases(args.size, args.per_family, args.families, args.noise)
    t0 = time.perf_counter()
    rows = []
    for case in case_list:
        rows += run_case(case, configs, done, args.partial, args.samples)
    agg = aggregate(rows, configs)
    doc = {
        "script": "scripts/tune_ivon_dip.py", "argv": sys.argv[1:],
        "split": {"phantom_seeds": [VALIDATION_SEED0, VALIDATION_SEED0 + 99],
                  "digit_indices_seed0_order": [VALIDATION_SEED0, VALIDATION_SEED0 + 99],
                  "noise_seeds": [VALIDATION_NOISE0, VALIDATION_NOISE0 + 999],
                  "role": "validation (first pass; the project split counts it as tuning)"}
        if args.split == "legacy" else
        {"source": "ctuq.data.splits, validation split, indices 50+ (seeds per case below)",
         "role": "validation"},
        "cases": [{k: v for k, v in c.items() if k != "image"} for c in case_list],
        "skipped_families": skipped,
        "ll_floor": LL_FLOOR,
        "chosen": choose(agg), "configs": agg, "rows": rows,
        "seconds": time.perf_counter() - t0,
        "machine": machine("cpu"),
    }
    json.dump(doc, sys.stdout, indent=1, default=float)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
