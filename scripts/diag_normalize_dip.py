#!/usr/bin/env python
"""The DIP fit on data divided by its scale against the same fit on the data as simulated.

Prints one JSON document on stdout. ``ctuq.reconstruct`` divides a sinogram
by its scale ``s`` (:func:`ctuq.recon.scaling.data_scale`, ``normalize =
true``) before the DIP fit and multiplies the outputs back. For validation
scans of ``--families`` (image ``--index``, ``--size``, ``--angles``,
``--noise``) and DIP seeds ``--seeds``, with the size's default DIP settings:
the PSNR of ``fit_dip(y)`` and of ``s · fit_dip(y / s)`` (noise std scaled
alike) against the truth, and their mean difference per family.

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
from ctuq.recon.scaling import data_scale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="digits,rectangles")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--angles", type=int, default=30)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--iterations", type=int, default=None, help="default: the preset's")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows, summary = [], {}
    for fam in args.families.split(","):
        scan = simulate(_case("validation", fam, args.index, args.size, args.angles, args.noise))
        s = data_scale(scan.y, scan.op)
        cfg = DIPConfig.for_image_size(args.size).with_(device="cpu", progress_every=10**6)
        if args.iterations:
            cfg = cfg.with_(iterations=args.iterations)
        for seed in (int(v) for v in args.seeds.split(",")):
            row = {"family": fam, "seed": seed, "scale": s}
            for name, c in (("unit", 1.0), ("normalized", s)):
                fit = fit_dip(scan.y / c, scan.op, cfg.with_(seed=seed), noise_std=scan.sigma / c)
                row[f"psnr_{name}"] = psnr(scan.truth, fit.reconstruction.detach().numpy() * c)
            print(row, file=sys.stderr, flush=True)
            rows.append(row)
        mine = [r for r in rows if r["family"] == fam]
        summary[fam] = {k: float(np.mean([r[k] for r in mine]))
                        for k in ("psnr_unit", "psnr_normalized")}
        summary[fam]["change_db"] = summary[fam]["psnr_normalized"] - summary[fam]["psnr_unit"]
    dump_json({"script": "scripts/diag_normalize_dip.py", "argv": sys.argv[1:],
               "split": "validation", "machine": machine("cpu"), "rows": rows,
               "summary": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
