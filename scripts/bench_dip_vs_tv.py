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
        --sizes 64,128 > docs/bench_dip_vs_tv.json
    python scripts/bench_dip_vs_tv.py --sizes "" --fit-sizes 256 --per-family 2 \\
        --fit-partial dip256.jsonl > bench_dip_vs_tv_256.json
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
from bench_evidence import _clean, read_cases, run_resumable  # noqa: E402
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


def run_fit_case(case: dict, monitor_every: int = 25) -> dict:
    """FBP, TV and a DIP+TV fitted here (the size's preset), with its PSNR trace."""
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.data.splits import Case
    from ctuq.models.unet import preset_name_for_size
    from ctuq.recon.baselines import fbp_reconstruction, tv_reconstruction
    from ctuq.recon.dip import DIPConfig, fit_dip

    c = Case(case["split"], case["family"], case["index"], case["size"])
    truth = c.image()
    op = RayTransform(Geometry.parallel(c.size, case["n_angles"]))
    y, sigma = simulate_sinogram(truth, op, case["noise"], seed=c.noise_seed(0))
    t0 = time.perf_counter()
    tv = metrics(truth, tv_reconstruction(y, op, noise_std=sigma))
    tv["time_s"] = time.perf_counter() - t0
    preset = preset_name_for_size(c.size)
    cfg = DIPConfig.preset_defaults(preset, device="cpu", progress_every=monitor_every)
    trace = []
    t0 = time.perf_counter()

    def monitor(iteration, image):
        trace.append((iteration, time.perf_counter() - t0, metrics(truth, image)["psnr"]))

    dip = fit_dip(y, op, cfg, noise_std=sigma, monitor=monitor)
    reached = next(((it, sec) for it, sec, p in trace if p >= tv["psnr"]), (None, None))
    out = {k: case[k] for k in ("id", "family", "size", "condition")}
    out["preset"] = preset
    out["methods"] = {"fbp": metrics(truth, fbp_reconstruction(y, op)), "tv": tv,
                      "dip_tv": {**metrics(truth, dip.reconstruction), "time_s": dip.wall_time,
                                 "iterations": cfg.iterations}}
    out["dip_iterations_to_tv_psnr"], out["dip_seconds_to_tv_psnr"] = reached
    out["dip_psnr_trace"] = [[it, round(sec, 2), round(p, 3)] for it, sec, p in trace]
    out["dip_minus_tv_psnr"] = out["methods"]["dip_tv"]["psnr"] - tv["psnr"]
    out["dip_minus_tv_ssim"] = out["methods"]["dip_tv"]["ssim"] - tv["ssim"]
    return out


def fit_cases(sizes, per_family: int, n_angles: int, noise: float) -> list[dict]:
    """The test split's cases for :func:`run_fit_case`: images first, then families."""
    from ctuq.data.splits import FAMILIES

    return [{"id": f"test/{family}/{i}/{size}/{n_angles}/{round(noise * 100)}",
             "split": "test", "family": family, "index": i, "size": size,
             "n_angles": n_angles, "noise": noise,
             "condition": f"{n_angles} angles, {noise:.0%} noise"}
            for size in sizes for i in range(per_family) for family in FAMILIES["test"]]


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
    if all("dip_iterations_to_tv_psnr" in r for r in rows):  # fitted here, traced
        its = [r["dip_iterations_to_tv_psnr"] for r in rows]
        secs = [r["dip_seconds_to_tv_psnr"] for r in rows if r["dip_seconds_to_tv_psnr"]]
        out["reached_tv_psnr"] = int(sum(i is not None for i in its))
        out["iterations_to_tv_psnr_median_of_reached"] = \
            float(np.median([i for i in its if i is not None])) if secs else None
        out["seconds_to_tv_psnr_median_of_reached"] = float(np.median(secs)) if secs else None
    return out


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
    rows = [r for r in (run_case(c, Path(args.arrays)) for c in cases) if r is not None]
    fitted = fit_cases(fit_sizes, args.per_family, args.angles, args.noise)
    rows += run_resumable(fitted, args.fit_partial,
                          lambda c: run_fit_case(c, args.monitor_every))
    cases += fitted
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
