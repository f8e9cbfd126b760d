#!/usr/bin/env python
"""Choose how many angles the held-out fit leaves out, on the validation split.

The ``'heldout'`` model error (docs/method.md §8.2) refits the DIP without
every k-th angle and fits ``(t0, s1)`` by the likelihood of the left-out
projections. At 30 angles, every 6th leaves five angles out: on the test
split one natural crop at 5 % noise then kept its coverage at 83 %, its
held-out rays too few to see the error off the edges. This script refits
the held-out DIP of each stored validation scan with every k-th angle left
out for each k given, fits the coefficients by maximum likelihood and under
the calibrated prior, and scores the total std on the stored truth,
reconstruction and posterior variance of a ``bench_calibration.py --arrays``
run (so only the held-out fits are recomputed).

Rule (docs/defaults.md): with the prior (the default), the k with the best
worst-image ±2σ coverage, provided its mean per-pixel log-likelihood is no
more than 0.1 nats below every 6th's (a wider interval that covers more but
scores worse is not an improvement). The setting that gives it is
``heldout_min_out``: the fewest left-out angles, which lowers k at 30 angles
and leaves 60 and more angles at every 6th.

Usage::

    python scripts/bench_calibration.py --split validation --sizes 64 --per-family 2 \\
        --predcp off --no-mc-dropout --partial val.jsonl --arrays val_arrays > /dev/null
    python scripts/tune_heldout_split.py --partial val.jsonl --arrays val_arrays \\
        --angles 30 --every 6,4,3 > benchmarks/results/tune_heldout_split_validation.json
"""

from __future__ import annotations

import argparse
import logging
import sys

from ctuq.bench.runner import dump_json, read_cases
from ctuq.bench.tuning import tune_split


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--angles", type=int, default=30, help="only scans with this many angles")
    ap.add_argument("--every", default="6,4,3")
    ap.add_argument("--width", type=float, default=0.1, help="the prior's width")
    ap.add_argument("--calibration", default="ctuq/recon/model_error_defaults/dip-64.json")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: more threads than free cores stall a "
                         "shared machine, and the refits run one after another)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    logging.getLogger("ctuq.bench").setLevel(logging.INFO)
    rows = list(read_cases(args.partial, "id").values())
    dump_json(tune_split(rows, args.arrays, args.calibration,
                         [int(k) for k in args.every.split(",")], n_angles=args.angles,
                         width=args.width))


if __name__ == "__main__":
    main()
