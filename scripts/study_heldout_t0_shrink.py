#!/usr/bin/env python
"""The held-out fit's constant pixel error ``t0``, shrunk: how much of it the interval needs.

Where the fit explains the data at the noise level (its excess at most
``FLOOR_EXCESS``), ``heldout_calibration_floor = 'checked'`` does not floor the
held-out coefficients, and ``t0`` is the held-out projections' own maximum-likelihood
value. With the TV image as the network's input that happens on most Gaussian scans
and widens the interval of the images that need it least (docs/dip.md §19). This
study refits the stored held-out likelihoods of a ``bench_calibration.py --arrays``
run as ``'<width> checked'`` does and scores the total std with ``t0`` multiplied by
each factor (0: ``t0`` held at zero, 1: the default), ``s1`` as fitted. It chooses
nothing; it tells how the worst image and the LL trade along the factor.

Usage::

    python scripts/study_heldout_t0_shrink.py --partial rows.jsonl --arrays rows_arrays \\
        --calibration benchmarks/results/dip_c16_1500_calibration_128.json --width 0.02 \\
        > benchmarks/results/heldout_t0_shrink.json
"""

from __future__ import annotations

import argparse
import time

import torch

from ctuq.bench.runner import dump_json, read_cases
from ctuq.bench.tuning import kept_cases, row_fit_excess, score_total, summarise
from ctuq.recon.model_error import ModelErrorCoefficients
from ctuq.recon.model_error.names import HELDOUT
from ctuq.recon.model_error.terms import fit_rule


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--calibration", required=True, help="the preset's calibration file")
    ap.add_argument("--width", type=float, default=0.02, help="the held-out prior's width")
    ap.add_argument("--factors", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--split", default="validation", help="the rows' split, recorded")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # every fit is a small Cholesky
    t_start = time.perf_counter()
    factors = [float(f) for f in args.factors.split(",")]
    prior = ModelErrorCoefficients.load(args.calibration)
    per_factor = {f: [] for f in factors}
    cases = []
    for r, lik, truth, x_hat, var_post in kept_cases(read_cases(args.partial, "id").values(),
                                                     args.arrays):
        excess = row_fit_excess(r, x_hat)
        co = lik.fit(prior, args.width, **fit_rule("checked", excess))
        case = {"id": r["id"], "family": r["family"], "condition": r["condition"],
                "fit_excess": excess, "t0": co.t0, "s1": co.s1}
        for f in factors:
            s = score_total(truth, x_hat, var_post, ModelErrorCoefficients(f * co.t0, co.s1,
                                                                           HELDOUT))
            per_factor[f].append(s)
            case[f"{f:g}"] = s
        cases.append(case)
    dump_json({"script": "scripts/study_heldout_t0_shrink.py", "split": args.split,
               "calibration": args.calibration, "width": args.width,
               "rule": f"{args.width:g} checked, t0 times each factor",
               "summary": {f"{f:g}": summarise(s) for f, s in per_factor.items() if s},
               "cases": cases, "seconds": time.perf_counter() - t_start})


if __name__ == "__main__":
    main()
