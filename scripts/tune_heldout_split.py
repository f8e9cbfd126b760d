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
        --angles 30 --every 6,4,3 > docs/tune_heldout_split_validation.json
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
from bench_calibration import _scan  # noqa: E402
from bench_evidence import _clean, read_cases  # noqa: E402
from tune_heldout_prior import score_total, summarise  # noqa: E402

LL_SLACK = 0.1  # nats/pixel a choice may lose against every 6th


def choose(summary: dict, base: str = "6_prior") -> str:
    """The variant with the best worst-image coverage among those within LL_SLACK of ``base``."""
    ll0 = summary[base]["pixel_log_likelihood_mean"]
    ok = [k for k, s in summary.items() if k.endswith("_prior")
          and s["pixel_log_likelihood_mean"] >= ll0 - LL_SLACK]
    return max(ok, key=lambda k: (summary[k]["coverage_2_worst"],
                                  summary[k]["pixel_log_likelihood_mean"]))


def main(argv=None):
    from ctuq.recon import model_error as me

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--angles", type=int, default=30, help="only scans with this many angles")
    ap.add_argument("--every", default="6,4,3")
    ap.add_argument("--width", type=float, default=0.1, help="the prior's width")
    ap.add_argument("--calibration", default="ctuq/recon/model_error_defaults/dip-64.json")
    args = ap.parse_args(argv)
    everies = [int(k) for k in args.every.split(",")]
    prior = me.ModelErrorCoefficients.load(args.calibration)
    scan_args = argparse.Namespace(threads=1, quick=False, quick_iterations=100)
    t_start = time.perf_counter()
    cases = []
    for row in read_cases(args.partial, "id").values():
        if row["n_angles"] != args.angles:
            continue
        a = np.load(Path(args.arrays) / (row["id"].replace("/", "_") + ".npz"))
        s = _scan(row, scan_args)
        truth, x_hat, var_post = a["truth"], torch.as_tensor(a["x_hat"]), \
            torch.as_tensor(a["var_post"])
        out = {"id": row["id"], "condition": row["condition"], "family": row["family"]}
        for every in everies:
            mask, dip_in = me.heldout_fit(s["y"], s["op"], s["dip"].config, every=every,
                                          noise_std=s["sigma"])
            lik = me.heldout_likelihood(s["op"], s["y"], mask,
                                        dip_in.reconstruction.detach().cpu(), var_post,
                                        s["sigma"] ** 2)
            mle = lik.fit()
            for name, co in (("mle", mle), ("prior", lik.fit(prior, args.width, mle=mle))):
                out[f"{every}_{name}"] = {"t0": co.t0, "s1": co.s1, "n_out": int(mask.sum()),
                                          **score_total(truth, x_hat, var_post, co)}
        cases.append(out)
        print(f"{row['id']}: " + ", ".join(
            f"{k} {v['coverage_2']:.3f}" for k, v in out.items() if isinstance(v, dict)),
            file=sys.stderr, flush=True)
    variants = [f"{e}_{n}" for e in everies for n in ("mle", "prior")]
    summary = {v: summarise([c[v] for c in cases]) for v in variants}
    doc = {"split": "validation", "angles": args.angles, "width": args.width,
           "calibration": args.calibration, "every": everies,
           "rule": f"with the prior: best worst-image ±2σ coverage among the splits whose "
                   f"mean LL is within {LL_SLACK} nats of every 6th's",
           "chosen": choose(summary), "summary": summary, "cases": cases,
           "seconds": time.perf_counter() - t_start}
    json.dump(_clean(doc), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
