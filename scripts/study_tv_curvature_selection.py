#!/usr/bin/env python
"""TV's curvature chosen per image by the held-out projections (offline, from kept runs).

Each ``--run KAPPA=ROWS:ARRAYS`` is a ``bench_calibration.py`` run with
``--set uncertainty.laplace.tv_curvature=KAPPA`` (its ``--partial`` rows and ``--arrays``
folder) over the same scans. The held-out likelihood a run keeps was made with that run's
posterior variance, so its value at the fitted model-error coefficients scores the run's
posterior on projections the fit did not see. Per scan, each run's held-out term is
refitted as the default fits it (``--width``, the floor checked, the texture threshold),
and three choices of ``κ`` are scored against the truth:

- ``fixed KAPPA``: every image the same ``κ``;
- ``heldout margin M``: the ``κ`` whose held-out log-likelihood is highest, where it
  beats the first run's (``κ = 0``) by more than ``M`` nats, else the first run's;
- ``oracle``: the ``κ`` with the highest per-pixel log-likelihood against the truth (what
  no choice without the truth can beat).

Prints one JSON document: per choice the summary of ``ctuq.bench.tuning.summarise``
(mean and worst image), and per scan the held-out log-likelihoods and scores.

Usage::

    python scripts/study_tv_curvature_selection.py --run 0=k0.jsonl:k0_arrays \\
        --run 4=k4.jsonl:k4_arrays --run 10=k10.jsonl:k10_arrays \\
        --calibration ctuq/recon/model_error_defaults/dip-64.json > selection.json
"""

from __future__ import annotations

import argparse

import torch

from ctuq.bench.runner import dump_json, read_cases
from ctuq.bench.tuning import kept_case, row_fit_excess, score_total, summarise
from ctuq.recon.model_error import ModelErrorCoefficients
from ctuq.recon.model_error.terms import edge_concentration, fit_rule


def refit(row, folder, prior, width, texture):
    """The run's held-out term refitted as the default fits it: log-likelihood and scores."""
    lik, truth, x_hat, var_post = kept_case(folder, row["id"])
    excess = row_fit_excess(row, x_hat)
    co = lik.fit(prior, width,
                 **fit_rule("checked", excess, edge_concentration(x_hat.numpy()), texture))
    loglik = -co.info["nll_per_measurement"] * len(lik.r)
    return {"heldout_loglik": loglik, "t0": co.t0, "s1": co.s1,
            **score_total(truth, x_hat, var_post, co)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True, metavar="KAPPA=ROWS:ARRAYS",
                    help="a run and its κ; the first is the reference (κ = 0)")
    ap.add_argument("--calibration", required=True, help="the preset's calibration file")
    ap.add_argument("--width", type=float, default=0.1, help="held-out prior width")
    ap.add_argument("--texture-threshold", type=float, default=0.35)
    ap.add_argument("--margins", default="0,1,2,5", help="nats, comma-separated")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # small Choleskys: one thread shares a busy machine
    runs = {}
    for spec in args.run:
        kappa, paths = spec.split("=", 1)
        rows_path, folder = paths.rsplit(":", 1)
        runs[kappa] = (read_cases(rows_path, "id"), folder)
    prior = ModelErrorCoefficients.load(args.calibration)
    kappas = list(runs)
    ids = sorted(set.intersection(*(set(rows) for rows, _ in runs.values())))
    cases = [{"id": i, "family": runs[kappas[0]][0][i]["family"],
              **{k: refit(rows[i], folder, prior, args.width, args.texture_threshold)
                 for k, (rows, folder) in runs.items()}} for i in ids]

    def by_heldout(case, margin):
        best = max(kappas, key=lambda k: case[k]["heldout_loglik"])
        gain = case[best]["heldout_loglik"] - case[kappas[0]]["heldout_loglik"]
        return best if gain > margin else kappas[0]

    choices = {f"fixed {k}": (lambda c, k=k: k) for k in kappas}
    choices.update({f"heldout margin {m:g}": (lambda c, m=m: by_heldout(c, m))
                    for m in (float(s) for s in args.margins.split(","))})
    choices["oracle"] = lambda c: max(kappas, key=lambda k: c[k]["pixel_log_likelihood"])
    summary = {}
    for name, choose in choices.items():
        picked = [choose(c) for c in cases]
        summary[name] = {**summarise([c[k] for c, k in zip(cases, picked)]),
                         "kappa_chosen": {k: picked.count(k) for k in kappas}}
    dump_json({"runs": {k: f for k, (_, f) in runs.items()}, "width": args.width,
               "calibration": args.calibration, "summary": summary, "cases": cases})


if __name__ == "__main__":
    main()
