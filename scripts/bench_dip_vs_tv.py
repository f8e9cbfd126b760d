#!/usr/bin/env python
"""DIP+TV against TV and FBP on the calibration benchmark's test scans (issue 26 item 3).

Prints one JSON document on stdout. The scans and DIP+TV reconstructions are
those of ``scripts/bench_calibration.py`` (its ``--partial`` case file and
``--arrays`` folder): each scan is simulated again from its case (same
phantom, geometry and noise seed: deterministic), TV (PDHG, the documented
default weight with the true noise std, 1000 iterations) and FBP are
computed on it, and the stored DIP+TV reconstruction (the size's preset,
default settings) is scored beside them. PSNR and SSIM as in
``scripts/bench_dip.py`` (scikit-image, data range of the truth).

Per size: the mean of every method, the mean DIP+TV − TV difference, the
number of images on which DIP+TV is at least as good as TV, per family and
condition; the DIP's iterations (the preset's) and wall time (from the case
file). No DIP is fitted here: the run takes seconds per case.

Usage::

    python scripts/bench_dip_vs_tv.py --partial cases.jsonl --arrays arrays/ \\
        --sizes 64,128 > docs/bench_dip_vs_tv.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: shared helpers
from bench_calibration import CONDITIONS  # noqa: E402
from bench_dip import metrics  # noqa: E402
from bench_evidence import _clean, read_cases  # noqa: E402
from bench_sampling import _machine  # noqa: E402

METHODS = ("fbp", "tv", "dip_tv")


def run_case(row: dict, arrays: Path) -> dict | None:
    """FBP, TV and the stored DIP+TV of one benchmark case; None without its arrays."""
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.data.splits import Case
    from ctuq.recon.baselines import fbp_reconstruction, tv_reconstruction
    from ctuq.recon.presets import DIP_DEFAULTS

    npz = arrays / (row["id"].replace("/", "_") + ".npz")
    if not npz.exists():
        return None
    stored = np.load(npz)
    c = Case(row["split"], row["family"], row["index"], row["size"])
    truth = c.image()
    if not np.array_equal(truth, stored["truth"]):
        raise SystemExit(f"{npz}: the stored truth is not the case's phantom")
    op = RayTransform(Geometry.parallel(c.size, row["n_angles"]))
    offset = CONDITIONS[c.size].index((row["n_angles"], row["noise"]))
    y, sigma = simulate_sinogram(truth, op, row["noise"], seed=c.noise_seed(offset))
    t0 = time.perf_counter()
    tv = tv_reconstruction(y, op, noise_std=sigma)
    t_tv = time.perf_counter() - t0
    out = {k: row[k] for k in ("id", "family", "size", "condition", "preset")}
    out["methods"] = {"fbp": metrics(truth, fbp_reconstruction(y, op)),
                      "tv": {**metrics(truth, tv), "time_s": t_tv},
                      "dip_tv": {**metrics(truth, stored["x_hat"]),
                                 "time_s": row["times_s"]["dip"],
                                 "iterations": DIP_DEFAULTS[row["preset"]]["iterations"]}}
    out["dip_minus_tv_psnr"] = out["methods"]["dip_tv"]["psnr"] - out["methods"]["tv"]["psnr"]
    out["dip_minus_tv_ssim"] = out["methods"]["dip_tv"]["ssim"] - out["methods"]["tv"]["ssim"]
    return out


def summarise(rows: list[dict]) -> dict:
    out = {"images": len(rows)}
    for m in METHODS:
        out[m] = {k: float(np.mean([r["methods"][m][k] for r in rows]))
                  for k in rows[0]["methods"][m]}
    d = [r["dip_minus_tv_psnr"] for r in rows]
    out["dip_minus_tv_psnr"] = {"mean": float(np.mean(d)), "min": float(np.min(d)),
                                "max": float(np.max(d))}
    out["dip_minus_tv_ssim_mean"] = float(np.mean([r["dip_minus_tv_ssim"] for r in rows]))
    out["dip_at_least_tv_psnr"] = int(sum(x >= 0 for x in d))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partial", required=True, help="bench_calibration's case file")
    ap.add_argument("--arrays", required=True, help="bench_calibration's --arrays folder")
    ap.add_argument("--sizes", default="64,128")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    cases = [r for r in read_cases(args.partial, "id").values() if r["size"] in sizes]
    t0 = time.perf_counter()
    rows = [r for r in (run_case(c, Path(args.arrays)) for c in cases) if r is not None]
    summary = {}
    for size in sorted({r["size"] for r in rows}):
        at = [r for r in rows if r["size"] == size]
        summary[str(size)] = {
            "all": summarise(at),
            "families": {f: summarise([r for r in at if r["family"] == f])
                         for f in sorted({r["family"] for r in at})},
            "conditions": {c: summarise([r for r in at if r["condition"] == c])
                           for c in sorted({r["condition"] for r in at})}}
    doc = {"script": "scripts/bench_dip_vs_tv.py", "argv": sys.argv[1:],
           "split": sorted({c["split"] for c in cases}), "tv": "PDHG, default weight "
           "(TV_WEIGHT_FACTOR · σ · rms column norm), true σ, 1000 iterations, x ≥ 0",
           "machine": _machine(torch.device("cpu")), "threads": args.threads,
           "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
           "summary": summary, "cases": rows}
    json.dump(_clean(doc), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
