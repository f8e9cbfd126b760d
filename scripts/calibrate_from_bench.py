#!/usr/bin/env python
"""A model-error calibration from a tuning-split run of ``bench_calibration.py --arrays``.

``ctuq calibrate`` reconstructs its own tuning scans; this fits the same
coefficients (:func:`ctuq.recon.calibrate.fit_calibration`: ``t0``, ``s1`` by
the pixel likelihood of the truths, and the conformal multiplier) to the
images a calibration benchmark already made and kept, for example with
``--set uncertainty.laplace.mean=linear-heldout``, whose image is not the DIP
output and needs its own calibration
(``ctuq/recon/model_error_defaults/<preset>.<image>.json``). Only tuning-split
cases are read: a calibration fitted on validation or test images would
leak into every figure measured there. Scans ``ctuq calibrate`` cannot
simulate (``bench_calibration.py --realistic``: photon counts, off-grid objects,
a hidden centre) are calibrated the same way (``--condition realistic``).

Usage::

    python scripts/bench_calibration.py --split tuning --sizes 64 --predcp off \\
        --no-mc-dropout --set uncertainty.laplace.mean=linear-heldout \\
        --partial tune.jsonl --arrays tune_arrays > /dev/null
    python scripts/calibrate_from_bench.py --partial tune.jsonl --arrays tune_arrays \\
        --settings uncertainty.laplace.mean=linear-heldout \\
        --out ctuq/recon/model_error_defaults/dip-64.linear-heldout.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ctuq.bench.runner import parse_variant, read_cases
from ctuq.recon.calibrate import fit_calibration


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--out", required=True, help="the calibration file to write (JSON)")
    ap.add_argument("--settings", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                    help="the run's --set, recorded as the settings the file is for")
    ap.add_argument("--condition", default=None,
                    help="the kind of scan the run made, recorded in the file (e.g. "
                         "'realistic': bench_calibration.py --realistic, photon counts, "
                         "off-grid objects, the centre estimated)")
    args = ap.parse_args(argv)
    rows = sorted(read_cases(args.partial, "id").values(), key=lambda r: r["id"])
    if not rows:
        sys.exit(f"{args.partial}: no finished cases")
    others = sorted({r["split"] for r in rows} - {"tuning"})
    if others:
        sys.exit(f"{args.partial}: cases of the {', '.join(others)} split; a calibration "
                 "is fitted on the tuning split only")
    truths, means, variances, used = [], [], [], []
    for r in rows:
        npz = Path(args.arrays) / (r["id"].replace("/", "_") + ".npz")
        if not npz.exists():
            sys.exit(f"{npz}: missing (the run's --arrays folder?)")
        a = np.load(npz)
        truths.append(a["truth"])
        means.append(a["x_hat"])
        variances.append(a["var_post"])
        used.append(r["id"])
    settings = parse_variant("set:" + args.settings)[1] if args.settings else {}
    fitted = fit_calibration(
        truths, means, variances, preset=rows[0]["preset"], size=int(rows[0]["size"]),
        families=sorted({r["family"] for r in rows}), split="tuning",
        angles=sorted({int(r["n_angles"]) for r in rows}),
        noise_levels=sorted({r["noise"] for r in rows if r.get("noise") is not None}),
        **({"I0": sorted({float(r["I0"]) for r in rows})} if any(r.get("I0") for r in rows)
           else {}),
        **({"condition": args.condition} if args.condition else {}),
        scans=used, made_by="scripts/calibrate_from_bench.py",
        uncertainty=settings.get("uncertainty", {}))
    fitted.save(args.out)
    print(f"wrote {args.out}: t0 {fitted.t0:.4g}, s1 {fitted.s1:.4g}, conformal "
          f"{fitted.conformal:.4g} ({len(used)} tuning scans)", file=sys.stderr)


if __name__ == "__main__":
    main()
