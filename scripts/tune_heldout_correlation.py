#!/usr/bin/env python
"""Choose the held-out term's pixel correlation length on the validation split.

The ``'heldout'`` model error (docs/method.md §8.2) reads the residuals of
left-out projections as sums of pixel errors. Errors correlated along a ray
add up more than independent ones, so read as independent they would give
coefficients larger than the error at a pixel;
``uncertainty.heldout_correlation_length`` reads them as errors correlated over
that many pixels (what it did on validation scans: docs/real_scans.md). This script rebuilds the
stored held-out likelihoods of a ``bench_calibration.py --arrays`` run at every
length and refits them as the pipeline does, so a length costs seconds, not a
reconstruction.

Rule (:func:`ctuq.bench.tuning.choose_correlation_length`): among the lengths
whose mean ±2σ coverage lies in [90, 99] %, whose worst image covers ≥ 85 % and
whose mean edge coverage is ≥ 85 %, the highest mean per-pixel log-likelihood.

Usage::

    python scripts/bench_calibration.py --realistic --split validation --sizes 64 \\
        --per-family 2 --limit 20 --predcp off --no-mc-dropout --jobs 2 --threads 1 \\
        --partial val.jsonl --arrays val_arrays > /dev/null
    python scripts/tune_heldout_correlation.py --partial val.jsonl --arrays val_arrays \\
        --calibration ctuq/recon/model_error_defaults/dip-64.json \\
        > benchmarks/results/tune_heldout_correlation_validation_64.json
"""

from __future__ import annotations

import argparse
import logging

from ctuq.bench.runner import dump_json, read_cases
from ctuq.bench.tuning import tune_correlation_length


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--calibration", default=None,
                    help="the preset's calibration file (the prior's centre); none: the "
                         "maximum-likelihood fit, as for a preset without one")
    ap.add_argument("--width", type=float, default=0.1, help="the prior's width")
    ap.add_argument("--lengths", default="0,0.5,1,1.5,2,3")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a line per scan, to stderr
    rows = list(read_cases(args.partial, "id").values())
    dump_json(tune_correlation_length(rows, args.arrays,
                                      [float(x) for x in args.lengths.split(",")],
                                      calibration=args.calibration, width=args.width))


if __name__ == "__main__":
    main()
