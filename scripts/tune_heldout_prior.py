#!/usr/bin/env python
"""Choose the width of the held-out fit's calibrated prior on the validation split.

The ``'heldout'`` model error (docs/method.md §8.2) fits ``(t0, s1)`` by the
likelihood of held-out projections; where those cannot see the model error
(few angles, much noise) the likelihood is flat down to ``t0 = s1 = 0`` and
the maximum-likelihood interval is the posterior's alone. A log-normal prior
centred on the preset's calibration (``ctuq calibrate`` on the tuning split)
keeps the fit where the data cannot move it. This script refits the stored
held-out likelihoods of a ``bench_calibration.py --arrays`` run for every
width and scores each, so the runs cost seconds, not reconstructions.

Rule: among the widths whose mean ±2σ coverage lies in [90, 99] %, whose
worst image covers ≥ 85 %, and whose worst image and worst edge coverage are
no lower than the maximum-likelihood fit's (the prior may add what the scan
cannot see, not take away what it can), the one with the highest mean
per-pixel log-likelihood (a proper score); if none qualifies, the one with
the best worst-image coverage. ``inf`` is the maximum-likelihood fit; the
rule picks among the widths only. Beside them, for comparison: the
calibration alone (``calibrated``) and, with ``--floor``, each coefficient
the larger of its maximum-likelihood value and the calibration's
(``floor``). With ``--calibration-floor`` each width is also fitted with the
calibration as a lower bound (``'<width> floor'``, the setting
``heldout_calibration_floor = 'on'``), and with ``--excess-thresholds T,…``
floored only where the image leaves more than ``T`` of mean squared whitened
residual per ray (``'<width> auto <T>'``; ``'auto'`` is ``T = 1``; the excess
is the row's record, or measured on the scan simulated again); all are
candidates of the rule too. ``--noise-rules residual`` adds each width, and each
width floored by each threshold, with the held-out likelihood's noise variance
scaled by the fit's excess (``'<width> residual'``, ``'<width> auto <T> residual'``:
the setting ``heldout_noise = 'residual'``). ``--checked`` adds each width floored as
``heldout_calibration_floor = 'checked'`` does (``'<width> checked'``), and
``--texture-thresholds T,…`` each width checked with a negligible coefficient fitted
on images whose edge concentration is below ``T`` (``'<width> checked texture <T>'``:
``heldout_texture_threshold``). docs/defaults.md
tells why the third condition is
there (the validation images come from the calibration's own families).

Usage::

    python scripts/bench_calibration.py --split validation --sizes 64 --per-family 2 \\
        --predcp off --no-mc-dropout --partial val.jsonl --arrays val_arrays > /dev/null
    python scripts/tune_heldout_prior.py --partial val.jsonl --arrays val_arrays \\
        --calibration ctuq/recon/model_error_defaults/dip-64.json \\
        > benchmarks/results/tune_heldout_prior_validation.json
"""

from __future__ import annotations

import argparse

import torch

from ctuq.bench.runner import dump_json, read_cases
from ctuq.bench.tuning import tune_prior_width


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--calibration", required=True, help="the preset's calibration file")
    ap.add_argument("--widths", default="0.05,0.1,0.25,0.5,1,2,4,inf")
    ap.add_argument("--floor", action="store_true",
                    help="also the candidate 'floor': max(MLE, calibration) per coefficient")
    ap.add_argument("--calibration-floor", action="store_true",
                    help="also each width with the calibration as a lower bound "
                         "('<width> floor', heldout_calibration_floor), a candidate of the rule")
    ap.add_argument("--excess-thresholds", default="",
                    help="comma-separated T: also each width floored where the fit's excess "
                         "is above T ('<width> auto <T>'), a candidate of the rule")
    ap.add_argument("--noise-rules", default="",
                    help="comma-separated heldout_noise rules (residual): also each width, and "
                         "each width floored by each excess threshold, with the held-out "
                         "likelihood's noise variance as the rule sets it ('<width> <rule>', "
                         "'<width> auto <T> <rule>'), candidates of the rule")
    ap.add_argument("--checked", action="store_true",
                    help="also each width floored as heldout_calibration_floor = 'checked' "
                         "does ('<width> checked'), candidates of the rule")
    ap.add_argument("--texture-thresholds", default="",
                    help="comma-separated T: also each width floored as 'checked' does, with "
                         "a negligible coefficient fitted on images of edge concentration "
                         "below T ('<width> checked texture <T>', heldout_texture_threshold)")
    ap.add_argument("--split", default="validation",
                    help="the split the rows come from, recorded (a test split's refit reports "
                         "the chosen setting; it chooses nothing)")
    ap.add_argument("--variant", default="",
                    help="tune the run's variant NAME (bench_calibration --variant NAME:...) "
                         "instead of its default reconstruction")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: every fit is a small Cholesky, and more "
                         "threads than free cores stall a shared machine)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    rows = list(read_cases(args.partial, "id").values())
    tuned = tune_prior_width(rows, args.arrays, args.calibration,
                             [float(w) for w in args.widths.split(",")], floor=args.floor,
                             calibration_floor=args.calibration_floor, checked=args.checked,
                             excess_thresholds=[float(t) for t in
                                                args.excess_thresholds.split(",") if t],
                             noise_rules=[r for r in args.noise_rules.split(",") if r],
                             texture_thresholds=[float(t) for t in
                                                 args.texture_thresholds.split(",") if t],
                             suffix=f"_{args.variant}" if args.variant else "")
    dump_json({**tuned, "split": args.split})


if __name__ == "__main__":
    main()
