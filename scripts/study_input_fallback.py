#!/usr/bin/env python
"""The TV image where the DIP fit from it is worse: ``uncertainty.heldout_input_fallback``
replayed on earlier runs and scored against the truth (docs/dip.md §18).

Reads ``bench_calibration.py`` row files of runs with ``dip.net_input = 'auto'`` on
Gaussian scans: their rows record, for the chosen input, the held-out fit's misfit
on every left-out angle and that of its network input, the TV (or FBP) image of
the kept angles (``coefficients.<term>.net_input.per_angle`` and
``input_per_angle``). Per scan: ``t`` of the input against the fit, by the
pipeline's own rule (:func:`ctuq.recon.model_error.terms.input_fallback_from_misfits`),
the fit's PSNR,
the PSNR of the input image on all angles (remade here as the fit made it: TV at
the default weight for the true noise std, or FBP) and TV at its best weight in
hindsight (factors 0.25–4, :func:`ctuq.bench.dip_vs_tv.tv_at_factors`, or read from
the ``bench_dip_vs_tv.py`` documents of ``--tv-scores``); the image
shown is the input where ``t > --t-min``. Prints one JSON document: the scans and,
per file, the mean PSNR of the fit, of the image shown and of TV at its best
weight, and per family the image shown minus TV at its best weight. Count scans
(rows with ``I0``) are refused: their input depends on the noise model a run
estimated.

Usage::

    python scripts/study_input_fallback.py \\
        benchmarks/results/dip_c16_1500_auto_standard_validation_128_cases.jsonl \\
        > benchmarks/results/input_fallback_standard_validation_128.json
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import sys

from ctuq.bench.cases import case_spec, simulate
from ctuq.bench.dip_vs_tv import tv_at_factors
from ctuq.bench.runner import dump_json, read_case_file
from ctuq.recon import predictive
from ctuq.recon.baselines import tv_reconstruction
from ctuq.recon.model_error.terms import AUTO_INPUT_T, input_fallback_from_misfits


def choice_of(row: dict) -> tuple[str, dict] | None:
    """The row's first model-error entry that recorded the input's held-out misfit,
    as ``(its key, its net_input record)``; None where none did."""
    for key, c in (row.get("coefficients") or {}).items():
        choice = c.get("net_input") if isinstance(c, dict) else None
        if isinstance(choice, dict) and "input_per_angle" in choice:
            return key, choice
    return None


def scan_row(row: dict, t_min: float) -> dict | None:
    """One scan's replay (module docstring); None for a row without the record."""
    found = choice_of(row)
    if found is None:
        return None
    if row.get("I0"):
        raise SystemExit(f"{row['id']}: a count scan (module docstring)")
    key, choice = found
    name = choice["chosen"]
    rule = input_fallback_from_misfits(choice["per_angle"][name],
                                       choice["input_per_angle"][name], t_min=t_min)
    # the method row of the same variant: 'heldout_auto' -> 'posterior_auto'
    method = "posterior" + key[len("heldout"):].replace("_mle", "")
    known = _KNOWN.get(row["id"])
    if known is not None:  # a bench_dip_vs_tv.py document of the same scans
        m = known["methods"]
        psnr_input, tv_best, best = (m["tv" if name == "tv" else "fbp"]["psnr"],
                                     m["tv_best"]["psnr"], m["tv_best"]["factor"])
    else:
        psnr_input, tv_best, best = _truth_scores(row["id"], name, case_spec(row))
    psnr_fit = float(row["methods"][method]["psnr"])
    used = name == "tv" and rule["used"]  # as the pipeline: the TV input only
    return {"id": row["id"], "family": row["family"], "input": name, "t": rule["t"],
            "psnr_fit": psnr_fit, "psnr_input": psnr_input,
            "psnr_shown": psnr_input if used else psnr_fit, "fallback": used,
            "tv_best": tv_best, "tv_factor": best}


#: ``--tv-scores``: the cases of ``bench_dip_vs_tv.py`` documents by scan id.
_KNOWN: dict[str, dict] = {}

#: :func:`_truth_scores` by (scan id, input): a scan in two files is scored once.
_SCORED: dict[tuple[str, str], tuple[float, float, float]] = {}


def _truth_scores(scan_id: str, name: str, spec: dict) -> tuple[float, float, float]:
    """The input image's PSNR, TV's at its best weight and that weight's factor."""
    if (scan_id, name) not in _SCORED:
        scan = simulate(spec)
        image = (tv_reconstruction(scan.y, scan.op, noise_std=scan.sigma) if name == "tv"
                 else scan.op.fbp(scan.y.reshape(scan.op.geometry.range_shape)))
        tv, best = tv_at_factors(scan.truth, scan.y, scan.op, scan.sigma)
        _SCORED[scan_id, name] = (float(predictive.psnr(scan.truth, image.detach().cpu().numpy())),
                                  float(tv[best]["psnr"]), best)
    return _SCORED[scan_id, name]


def summary(rows: list[dict]) -> dict:
    families = sorted({r["family"] for r in rows})
    return {"scans": len(rows), "fallback": [r["id"] for r in rows if r["fallback"]],
            "psnr_fit": st.mean(r["psnr_fit"] for r in rows),
            "psnr_shown": st.mean(r["psnr_shown"] for r in rows),
            "tv_best": st.mean(r["tv_best"] for r in rows),
            "fit_minus_tv_best": st.mean(r["psnr_fit"] - r["tv_best"] for r in rows),
            "shown_minus_tv_best": st.mean(r["psnr_shown"] - r["tv_best"] for r in rows),
            "shown_minus_tv_best_per_family": {
                f: st.mean(r["psnr_shown"] - r["tv_best"] for r in rows if r["family"] == f)
                for f in families},
            "t_not_used_max": max((r["t"] for r in rows if not r["fallback"]), default=None),
            "t_used_min": min((r["t"] for r in rows if r["fallback"]), default=None)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="bench_calibration.py row files (auto runs)")
    ap.add_argument("--t-min", type=float, default=AUTO_INPUT_T)
    ap.add_argument("--tv-scores", nargs="*", default=[],
                    help="bench_dip_vs_tv.py documents of the same scans: their FBP, TV "
                         "(default weight, true σ: the TV input) and TV at its best weight "
                         "instead of remaking them")
    args = ap.parse_args(argv)
    for path in args.tv_scores:
        with open(path) as f:
            _KNOWN.update({c["id"]: c for c in json.load(f)["cases"]})
    doc = {"script": "scripts/study_input_fallback.py", "argv": sys.argv[1:],
           "t_min": args.t_min, "files": {}}
    for path in args.files:
        rows = [r for r in (scan_row(row, args.t_min) for row in read_case_file(path))
                if r is not None]
        if not rows:
            raise SystemExit(f"{path}: no row records the input's held-out misfit "
                             "(coefficients.*.net_input.input_per_angle)")
        doc["files"][path] = {"summary": summary(rows), "scans": rows}
    dump_json(doc)


if __name__ == "__main__":
    main()
