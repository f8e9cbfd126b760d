"""The shared held-out fit against the fit-to-fit spread of the DIP (validation, or test).

``[uncertainty] dip_from_heldout = f`` runs the held-out fit (kept angles) first
and continues the fit on all angles from its weights for ``f`` of the
iterations (``ctuq.recon.model_error.shared``): ``1 + f`` fits' worth of
iterations instead of two separate fits. One validation scan per family and
condition, the DIP fit repeated with several seeds (the random start of the
U-net), so that a change of PSNR can be read against the spread of the
reference itself (docs/speed.md). Per scan and seed: the reference fit
(all angles, from the seeded start), the held-out fit, and its continuation
for each ``f``; the PSNR (dB) and the seconds of each. Every fit runs on the
data divided by their scale, as a reconstruction does (``normalize``).
``--split test`` repeats it on test images, to report a choice made on
validation.

One JSON line per scan and seed goes to ``--out`` (appended: a stopped run
resumes, rows already there are skipped); ``--summary`` reads the rows and
prints one JSON document (means, paired differences, the seed spread).

Usage::

    python scripts/validate_shared_fit.py --out rows.jsonl --conditions 30:0.01
    python scripts/validate_shared_fit.py --out rows.jsonl --summary
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ctuq.bench.cases import _case, simulate
from ctuq.bench.dip_vs_tv import fitted_data
from ctuq.data.splits import FAMILIES
from ctuq.recon.config import UncertaintyConfig
from ctuq.recon.dip import DIPConfig, fit_dip
from ctuq.recon.model_error.heldout import heldout_fit
from ctuq.recon.model_error.shared import continued_config
from ctuq.recon.predictive import psnr as image_psnr


def one_scan(split: str, family: str, index: int, size: int, n_angles: int, noise: float,
             seed: int, shares) -> dict:
    """PSNR and seconds of the reference, the held-out fit and its continuations."""
    case = _case(split, family, index, size, n_angles, noise)
    sc = simulate(case)
    scale, y, sigma = fitted_data(sc)  # the data as ctuq.reconstruct fits them
    cfg = DIPConfig.for_image_size((size, size), progress_every=10**6).with_(seed=seed)
    unc = UncertaintyConfig()

    def psnr(fit) -> float:
        return image_psnr(sc.truth, fit.reconstruction.detach().reshape(size, size) * scale)

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    row = {"case": case["id"], "family": family, "condition": case["condition"], "seed": seed,
           "psnr": {}, "seconds": {}}
    ref, row["seconds"]["reference"] = timed(lambda: fit_dip(y, sc.op, cfg, noise_std=sigma))
    row["psnr"]["reference"] = psnr(ref)
    (_, held), row["seconds"]["heldout"] = timed(lambda: heldout_fit(
        y, sc.op, cfg, every=unc.heldout_every, min_out=unc.heldout_min_out, noise_std=sigma))
    row["psnr"]["heldout"] = psnr(held)
    for f in shares:
        cont, sec = timed(lambda: fit_dip(y, sc.op, continued_config(cfg, f), noise_std=sigma,
                                          init_state=held.state_dict))
        row["psnr"][f"shared_{f:g}"], row["seconds"][f"shared_{f:g}"] = psnr(cont), sec
    return row


def summary(rows: list[dict]) -> dict:
    """Means per variant and condition, the paired differences and the seed spread."""
    variants = [k for k in rows[0]["psnr"] if k.startswith("shared_")]

    def stats(rs):
        ref = np.array([r["psnr"]["reference"] for r in rs])
        out = {"fits": len(rs), "reference": float(ref.mean()),
               "heldout": float(np.mean([r["psnr"]["heldout"] for r in rs]))}
        # the spread of the reference over seeds, per scan: the noise a difference is read against
        sds = [float(np.std([r["psnr"]["reference"] for r in fits], ddof=1))
               for fits in _grouped(rs, "case").values() if len(fits) > 1]
        out["reference_seed_sd"] = float(np.mean(sds)) if sds else None
        for v in variants:
            d = np.array([r["psnr"][v] for r in rs]) - ref
            scan_means = np.array([np.mean([r["psnr"][v] - r["psnr"]["reference"] for r in fits])
                                   for fits in _grouped(rs, "case").values()])
            out[v] = {"psnr": float(np.mean([r["psnr"][v] for r in rs])),
                      "minus_reference": float(d.mean()),
                      "minus_reference_min": float(d.min()),
                      "minus_reference_max": float(d.max()),
                      "fits_better": int((d > 0).sum()),
                      "scans_better_on_average": int((scan_means > 0).sum()),
                      "scans": len(scan_means),
                      # the seconds of the held-out fit plus the continuation, over the two
                      # separate fits' (reference + held-out)
                      "seconds_over_two_fits": float(np.mean(
                          [(r["seconds"]["heldout"] + r["seconds"][v])
                           / (r["seconds"]["reference"] + r["seconds"]["heldout"]) for r in rs]))}
        return out

    by_condition = {**_grouped(rows, "condition"), "all": rows}
    return {"split": rows[0]["case"].split("/")[0],
            "by_condition": {c: stats(rs) for c, rs in by_condition.items()},
            "by_family": {f: stats(rs) for f, rs in _grouped(rows, "family").items()}}


def _grouped(rows: list[dict], key: str) -> dict[str, list[dict]]:
    """The rows by their value of ``key``, in first-seen order."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON lines, appended (resumable)")
    ap.add_argument("--split", default="validation", choices=("validation", "test"))
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--conditions", default="30:0.01,60:0.05",
                    help="angles:relative noise, comma-separated")
    ap.add_argument("--families", default=None, help="default: every family of the split")
    ap.add_argument("--indices", default="0", help="image indices of every family")
    ap.add_argument("--seeds", default="0,1,2", help="DIP seeds")
    ap.add_argument("--shares", default="0.3,0.5", help="values of dip_from_heldout")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--summary", action="store_true", help="summarise --out and stop")
    args = ap.parse_args(argv)
    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if args.summary:
        if not done:
            print(f"error: {out}: no rows to summarise", file=sys.stderr)
            return 2
        print(json.dumps(summary(done), indent=1))
        return 0
    torch.set_num_threads(args.threads)
    seen = {(r["case"], r["seed"]) for r in done}
    shares = [float(s) for s in args.shares.split(",")]
    families = args.families.split(",") if args.families else FAMILIES[args.split]
    plan = [(c, f, int(i), int(s)) for i in args.indices.split(",")
            for c in args.conditions.split(",") for f in families for s in args.seeds.split(",")]
    for cond, family, index, seed in plan:
        n_angles, noise = int(cond.split(":")[0]), float(cond.split(":")[1])
        cid = _case(args.split, family, index, args.size, n_angles, noise)["id"]
        if (cid, seed) in seen:
            continue
        row = one_scan(args.split, family, index, args.size, n_angles, noise, seed, shares)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({"case": row["case"], "seed": seed,
                          **{k: round(v, 2) for k, v in row["psnr"].items()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
