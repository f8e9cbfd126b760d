"""Benchmark DIP+TV and MC-dropout DIP against FBP and TV.

Prints one JSON document on stdout (progress goes to stderr): PSNR and SSIM
(scikit-image, data range of the ground truth) and wall time of FBP, TV,
DIP+TV and MC-dropout DIP, per case and averaged, on

- 10 digit phantoms, 28×28, 20 angles, 5 % noise;
- 5 ellipse phantoms, 128×128, 60 angles, 5 % noise;

all seeds fixed, with the issue's targets checked as booleans:
DIP+TV ≥ FBP + 6 dB and ≥ TV + 0.5 dB at 28², DIP+TV ≥ TV at 128².
TV uses the baseline's documented default weight with the true noise std;
``tv_best`` is TV with the best of five weights per case (an oracle, for
reference only). ``dip_tv.loss_ratio_to_tv`` is the DIP's best loss over the
same loss evaluated at the TV reconstruction: where the DIP's TV weight is
TV's (the larger presets), the two solve one problem and a ratio above 1 is
how far the fit is from converged.

Usage::

    python scripts/bench_dip.py            # full run (slow: the 128² fits)
    python scripts/bench_dip.py --quick    # smoke test, about a minute
    python scripts/bench_dip.py --out benchmarks/results/bench_dip.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch

from ctuq.bench.machine import machine
from ctuq.recon.dip import DIPConfig
from ctuq.bench.dip import run_jobs, summarise, timing


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 2 digits, 1 ellipse phantom at 64², few iterations")
    p.add_argument("--digits", type=int, default=10, help="number of 28² digit cases")
    p.add_argument("--ellipses", type=int, default=5, help="number of ellipse cases")
    p.add_argument("--ellipse-size", type=int, default=128)
    p.add_argument("--noise", type=float, default=0.05)
    p.add_argument("--mc-samples", type=int, default=256)
    p.add_argument("--no-mc", action="store_true", help="skip MC-dropout DIP")
    p.add_argument("--no-tv-grid", action="store_true", help="skip the TV oracle grid")
    p.add_argument("--iterations-28", type=int, default=None)
    p.add_argument("--iterations-large", type=int, default=None)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest on a shared 2-core CPU)")
    p.add_argument("--jobs", type=int, default=1,
                   help="cases run in this many processes at once (default 1)")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--timing", action="store_true",
                   help="instead: time one DIP iteration per U-net preset and size")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    torch.set_num_threads(max(1, min(2, args.threads)))
    if args.timing:
        doc = {"benchmark": "bench_dip --timing", "load_average": os.getloadavg(),
               "torch": torch.__version__, "rows": timing([1, 2])}
        print(json.dumps(doc, indent=2))
        return

    if args.quick:
        args.digits, args.ellipses, args.ellipse_size = 2, 1, 64
        args.mc_samples = 16
        args.iterations_28 = args.iterations_28 or 300
        args.iterations_large = args.iterations_large or 200
        args.no_tv_grid = True

    t_all = time.perf_counter()
    doc = {
        "benchmark": "bench_dip",
        "machine": {**machine("cpu"), "cuda": torch.cuda.is_available()},
        "settings": {"quick": args.quick, "jobs": args.jobs, "noise_level": args.noise,
                     "mc_samples": args.mc_samples, "mc_dropout_p": 0.05},
    }
    jobs, where = [], []
    if args.digits > 0:
        over = {"iterations": args.iterations_28} if args.iterations_28 else {}
        doc["settings"]["digits28"] = {
            "image_size": 28, "n_angles": 20, "cases": args.digits,
            "dip": DIPConfig.for_image_size(28).with_(**over).to_dict()}
        for k in range(args.digits):
            jobs.append(("digit", k, 28, 20, args, over))
            where.append("digits28")
    if args.ellipses > 0:
        n = args.ellipse_size
        over = {"iterations": args.iterations_large} if args.iterations_large else {}
        key = f"ellipses{n}"
        doc["settings"][key] = {
            "image_size": n, "n_angles": 60, "cases": args.ellipses,
            "dip": DIPConfig.for_image_size(n).with_(**over).to_dict()}
        # the expensive cases first, so that parallel workers finish together
        for k in range(args.ellipses):
            jobs.insert(k, ("ellipses", k, n, 60, args, over))
            where.insert(k, key)
    results = run_jobs(jobs, args.jobs)
    groups = {}
    for key, case in zip(where, results):
        groups.setdefault(key, []).append(case)
    groups = {k: groups[k] for k in sorted(groups, key=lambda g: not g.startswith("digits"))}

    doc["summary"] = {g: summarise(c) for g, c in groups.items()}
    targets = {}
    s28 = doc["summary"].get("digits28")
    if s28:
        targets["digits28_dip_ge_fbp_plus_6dB"] = s28["dip_tv"]["psnr"] >= s28["fbp"]["psnr"] + 6
        targets["digits28_dip_ge_tv_plus_0.5dB"] = s28["dip_tv"]["psnr"] >= s28["tv"]["psnr"] + 0.5
    sl = doc["summary"].get(f"ellipses{args.ellipse_size}")
    if sl:
        targets[f"ellipses{args.ellipse_size}_dip_ge_tv"] = sl["dip_tv"]["psnr"] >= sl["tv"]["psnr"]
    doc["targets"] = targets
    doc["cases"] = groups
    doc["wall_time"] = time.perf_counter() - t_all
    text = json.dumps(doc, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
