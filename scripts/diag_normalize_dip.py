#!/usr/bin/env python
"""The DIP fit on data divided by its scale against the same fit on the data as simulated.

Prints one JSON document on stdout. ``ctuq.reconstruct`` divides a sinogram
by its scale ``s`` (:func:`ctuq.recon.scaling.data_scale`, ``normalize =
true``) before the DIP fit and multiplies the outputs back. For validation
scans of ``--families`` (images ``--indices``, ``--size``, conditions
``--conditions`` as ``angles:noise`` pairs) and DIP seeds ``--seeds``, with the size's default DIP settings:
the PSNR of ``fit_dip(y)`` and of ``s · fit_dip(y / s)`` (noise std scaled
alike) against the truth, and their mean difference per family. With
``--factors f1,f2,…`` also the fit on ``y / (s · f / SCALE_FACTOR)`` for each
``f``: the data normalised with scale factor ``f`` in place of the
default's; each row records the normalised truth's maximum (``max(x) / s``
at factor 2). ``--no-unit`` skips the fit on the data as simulated.

Usage::

    python scripts/diag_normalize_dip.py > benchmarks/results/normalize_dip_validation_64_30_1.json
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from ctuq.bench.cases import _case, simulate
from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json
from ctuq.recon.dip import DIPConfig, fit_dip
from ctuq.recon.predictive import psnr
from ctuq.recon.scaling import SCALE_FACTOR, data_scale


def scan_rows(args, fam: str, index: int, angles: int, noise: float) -> list[dict]:
    """One validation scan, every DIP seed, every variant: one row per seed."""
    scan = simulate(_case("validation", fam, index, args.size, angles, noise))
    s = data_scale(scan.y, scan.op)
    cfg = DIPConfig.for_image_size(args.size).with_(device="cpu", progress_every=10**6)
    if args.iterations:
        cfg = cfg.with_(iterations=args.iterations)
    variants = [] if args.no_unit else [("unit", 1.0)]
    variants += [("normalized", s)]
    variants += [(f"factor_{f}", s * float(f) / SCALE_FACTOR) for f in args.factors.split(",") if f]
    rows = []
    for seed in (int(v) for v in args.seeds.split(",")):
        row = {"family": fam, "index": index, "angles": angles, "noise": noise, "seed": seed,
               "scale": s, "normalized_max": float(np.max(scan.truth)) / s}
        for name, c in variants:
            fit = fit_dip(scan.y / c, scan.op, cfg.with_(seed=seed), noise_std=scan.sigma / c)
            row[f"psnr_{name}"] = psnr(scan.truth, fit.reconstruction.detach().numpy() * c)
        print(row, file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="digits,rectangles")
    ap.add_argument("--indices", default="0")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--conditions", default="30:0.01", help="angles:noise pairs, comma-separated")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--iterations", type=int, default=None, help="default: the preset's")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--factors", default="", help="other scale factors, comma-separated")
    ap.add_argument("--no-unit", action="store_true", help="skip the fit on the data as simulated")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows, summary = [], {}
    conditions = [(int(a), float(n)) for a, n in
                  (c.split(":") for c in args.conditions.split(","))]
    for fam in args.families.split(","):
        for index in (int(v) for v in args.indices.split(",")):
            for angles, noise in conditions:
                rows += scan_rows(args, fam, index, angles, noise)
        mine = [r for r in rows if r["family"] == fam]
        summary[fam] = {k: float(np.mean([r[k] for r in mine]))
                        for k in mine[0] if k.startswith("psnr_")}
        if "psnr_unit" in summary[fam]:
            summary[fam]["change_db"] = summary[fam]["psnr_normalized"] - summary[fam]["psnr_unit"]
    summary["all"] = {k: float(np.mean([r[k] for r in rows]))
                      for k in rows[0] if k.startswith("psnr_")}
    dump_json({"script": "scripts/diag_normalize_dip.py", "argv": sys.argv[1:],
               "split": "validation", "machine": machine("cpu"), "rows": rows,
               "summary": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
