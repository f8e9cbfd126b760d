#!/usr/bin/env python
"""Fit a model-error calibration from the kept arrays of a calibration benchmark run.

``ctuq calibrate`` simulates its own scans (Gaussian noise of a known level on
the pixel grid). Scans of another kind — the realistic condition's photon
counts, off-grid objects and hidden centre — are simulated and reconstructed by
``scripts/bench_calibration.py --realistic --split tuning --arrays DIR``; this
script fits the same coefficients (``fit_calibration``: ``t0``, ``s1`` by the
pixel likelihood of the truths, and the conformal multiplier) to the truths,
images and posterior variances that run kept, and writes the calibration file.
Only tuning-split rows are accepted: a calibration fitted on validation or test
images would leave nothing to judge it on (docs/data_splits.md).

Usage::

    python scripts/bench_calibration.py --realistic --split tuning --sizes 64 \\
        --per-family 1 --predcp off --no-mc-dropout --jobs 2 --threads 1 \\
        --partial tune.jsonl --arrays tune_arrays > /dev/null
    python scripts/fit_calibration.py --partial tune.jsonl --arrays tune_arrays \\
        --condition realistic --out dip-64-realistic.json
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ctuq.bench.runner import read_cases
from ctuq.bench.tuning import _kept_case
from ctuq.recon.calibrate import fit_calibration


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--condition", default="gaussian",
                    help="the kind of scan the rows are, recorded in the file (e.g. "
                         "'realistic': photon counts, off-grid, centre estimated)")
    ap.add_argument("--out", required=True, help="the calibration file to write")
    args = ap.parse_args(argv)

    rows = list(read_cases(args.partial).values())
    bad = sorted({r["split"] for r in rows} - {"tuning"})
    if bad:
        sys.exit(f"{args.partial}: split {bad[0]!r} rows; a calibration is fitted on the "
                 "tuning split only")
    presets = sorted({r["preset"] for r in rows})
    if len(presets) != 1:
        sys.exit(f"{args.partial}: rows of presets {presets}; fit one preset at a time")
    truths, means, variances, scans = [], [], [], []
    for r in rows:
        kept = _kept_case(args.arrays, r["id"])
        if kept is None:
            sys.exit(f"{args.arrays}: no arrays for {r['id']}")
        _, truth, x_hat, var_post = kept
        truths.append(np.asarray(truth, np.float64))
        means.append(np.asarray(x_hat, np.float64))
        variances.append(np.asarray(var_post, np.float64))
        scans.append(r["id"])
    co = fit_calibration(
        truths, means, variances, preset=presets[0], size=int(rows[0]["size"]),
        families=sorted({r["family"] for r in rows}), split="tuning",
        angles=sorted({int(r["n_angles"]) for r in rows}),
        I0=sorted({float(r["I0"]) for r in rows if r.get("I0")}),
        condition=args.condition, scans=scans,
        made_by="scripts/fit_calibration.py from scripts/bench_calibration.py --realistic "
                "--split tuning arrays")
    co.save(args.out)
    print(f"{args.out}: t0 {co.t0:.4g}, s1 {co.s1:.4g}, conformal {co.conformal:.4g} "
          f"({len(rows)} scans)")


if __name__ == "__main__":
    main()
