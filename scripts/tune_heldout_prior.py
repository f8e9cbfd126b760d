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
(``floor``). docs/defaults.md tells why the third condition is there (the
validation images come from the calibration's own families).

Usage::

    python scripts/bench_calibration.py --split validation --sizes 64 --per-family 2 \\
        --predcp off --no-mc-dropout --partial val.jsonl --arrays val_arrays > /dev/null
    python scripts/tune_heldout_prior.py --partial val.jsonl --arrays val_arrays \\
        --calibration ctuq/recon/model_error_defaults/dip-64.json \\
        > docs/tune_heldout_prior_validation.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: shared helpers
from bench_calibration import score  # noqa: E402
from bench_evidence import _clean, read_cases  # noqa: E402

KEYS = ("coverage_2", "coverage_2_edges", "pixel_log_likelihood", "spearman")


def summarise(rows: list[dict]) -> dict:
    out = {"images": len(rows)}
    for k in KEYS:
        v = [r[k] for r in rows if r.get(k) is not None]
        out[f"{k}_mean"] = float(np.mean(v))
        out[f"{k}_worst"] = float(np.min(v))
    return out


def score_total(truth, x_hat, var_post, co) -> dict:
    """The :data:`KEYS` scores of the std ``sqrt(var_post + model error of co)``.

    ``truth``, ``x_hat``, ``var_post``: one image's arrays (shape ``(H, W)``), as
    ``bench_calibration.py --arrays`` stores them; ``co``: ModelErrorCoefficients.
    """
    s = score(truth, x_hat, (var_post + co.variance(x_hat, var_post)).sqrt())
    return {k: s[k] for k in KEYS}


def choose(summary: dict) -> tuple[str, str]:
    ml = summary.get("inf")
    ok = {w: s for w, s in summary.items() if 0.90 <= s["coverage_2_mean"] <= 0.99
          and s["coverage_2_worst"] >= 0.85 and (ml is None or (
              s["coverage_2_worst"] >= ml["coverage_2_worst"]
              and s["coverage_2_edges_worst"] >= ml["coverage_2_edges_worst"]))}
    if ok:
        return max(ok, key=lambda w: ok[w]["pixel_log_likelihood_mean"]), \
            "highest mean LL among widths meeting the coverage targets without lowering " \
            "the worst image or worst edge coverage of the maximum-likelihood fit"
    return max(summary, key=lambda w: summary[w]["coverage_2_worst"]), \
        "no width met the coverage targets: best worst-image coverage"


def main(argv=None):
    from ctuq.recon.model_error import HeldoutLikelihood, ModelErrorCoefficients

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partial", required=True, help="the bench_calibration --partial file")
    ap.add_argument("--arrays", required=True, help="its --arrays folder")
    ap.add_argument("--calibration", required=True, help="the preset's calibration file")
    ap.add_argument("--widths", default="0.05,0.1,0.25,0.5,1,2,4,inf")
    ap.add_argument("--floor", action="store_true",
                    help="also the candidate 'floor': max(MLE, calibration) per coefficient")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    prior = ModelErrorCoefficients.load(args.calibration)
    widths = [float(w) for w in args.widths.split(",")]
    cases = sorted(read_cases(args.partial, "id").values(), key=lambda r: r["id"])
    per_width: dict[str, list] = {}  # candidate -> its scores per image, in order
    per_case = []
    for r in cases:
        npz = Path(args.arrays) / (r["id"].replace("/", "_") + ".npz")
        if not npz.exists():
            continue
        a = np.load(npz)
        lik = HeldoutLikelihood.from_arrays({k[len("heldout_"):]: a[k] for k in a.files
                                             if k.startswith("heldout_")})
        truth, x_hat, var_post = a["truth"], torch.as_tensor(a["x_hat"]), \
            torch.as_tensor(a["var_post"])
        row = {"id": r["id"], "condition": r["condition"], "family": r["family"]}
        mle = lik.fit()
        candidates = {str(w): mle if math.isinf(w) else lik.fit(prior, w, mle=mle)
                      for w in widths}
        candidates["calibrated"] = prior  # the calibration alone, no held-out fit
        if args.floor:  # the calibration as a floor under the MLE
            candidates["floor"] = ModelErrorCoefficients(max(mle.t0, prior.t0),
                                                         max(mle.s1, prior.s1), "heldout")
        for name, co in candidates.items():
            s = score_total(truth, x_hat, var_post, co)
            per_width.setdefault(name, []).append(s)
            row[name] = {"t0": co.t0, "s1": co.s1, **s}
        per_case.append(row)
    summary = {w: summarise(rows) for w, rows in per_width.items() if rows}
    chosen, rule = choose({w: summary[w] for w in map(str, widths) if w in summary})
    json.dump(_clean({"split": "validation", "calibration": args.calibration,
                      "prior": {"t0": prior.t0, "s1": prior.s1, "info": {
                          k: prior.info.get(k) for k in ("preset", "split", "n_images",
                                                         "angles", "noise_levels")}},
                      "widths": [str(w) for w in widths], "rule": rule, "chosen": chosen,
                      "summary": summary, "cases": per_case,
                      "seconds": time.perf_counter() - t_start}), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
