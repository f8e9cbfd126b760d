#!/usr/bin/env python
"""How ``dip.net_input = 'auto'`` chooses, scored against the truth (docs/dip.md §15).

Reads pairs of ``bench_calibration.py`` row files of the same scans: a run with
the FBP input (the default) and a run with ``--set dip.net_input=auto``, whose
rows record both held-out fits' misfit on every left-out angle
(``coefficients.heldout.net_input.per_angle``). For each threshold ``t_min`` it
replays the choice (:func:`ctuq.recon.model_error.heldout.preferred_input`): a
scan takes the TV input's image where ``t > t_min`` (the auto row's, which is the
TV fit wherever the run chose it), else the FBP run's. Prints one JSON document:
per set and threshold, the scans given the TV input, the mean PSNR change over the
FBP input and the worst one; at ``--t-min`` the mean PSNR per family, and the
difference to TV at its best weight per image where ``--tv-best`` names a
``bench_dip_vs_tv.py`` document of the same scans.

Usage::

    python scripts/study_net_input_choice.py \\
        --pair standard benchmarks/results/tv_curvature_0_standard_validation_64_cases.jsonl \\
                        benchmarks/results/net_input_auto_standard_validation_64_cases.jsonl \\
        --tv-best standard benchmarks/results/net_input_auto_dip_vs_tv_standard_validation_64.json
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import sys

from ctuq.bench.runner import dump_json, read_case_file
from ctuq.recon.model_error.heldout import preferred_input
from ctuq.recon.model_error.terms import AUTO_INPUT_T

THRESHOLDS = (0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)


def scan_rows(base_file: str, auto_file: str) -> list[dict]:
    """Per scan: id, family, FBP-input PSNR, the TV input's PSNR (None where the auto run
    kept the FBP), and ``t``."""
    base = {r["id"]: r for r in read_case_file(base_file)}
    out = []
    for r in read_case_file(auto_file):
        choice = r["coefficients"]["heldout"]["net_input"]
        _, t = preferred_input(choice["per_angle"], "fbp", 0.0)
        psnr_fbp = base[r["id"]]["methods"]["heldout"]["psnr"]
        psnr_tv = r["methods"]["heldout"]["psnr"] if choice["chosen"] == "tv" else None
        out.append({"id": r["id"], "family": r["family"], "psnr_fbp": psnr_fbp,
                    "psnr_tv": psnr_tv, "t": t["tv"]})
    return out


def replay(rows: list[dict], t_min: float) -> list[float]:
    """The PSNR of every scan under the threshold ``t_min``."""
    out = []
    for r in rows:
        tv = r["t"] > t_min
        if tv and r["psnr_tv"] is None:
            raise SystemExit(f"{r['id']}: t {r['t']:.2f} > {t_min} but the auto run kept the "
                             "FBP input (its rule was stricter): rerun it with t_min 0")
        out.append(r["psnr_tv"] if tv else r["psnr_fbp"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=3, action="append", required=True,
                    metavar=("NAME", "FBP_ROWS", "AUTO_ROWS"))
    ap.add_argument("--tv-best", nargs=2, action="append", default=[],
                    metavar=("NAME", "DIP_VS_TV_JSON"))
    ap.add_argument("--t-min", type=float, default=AUTO_INPUT_T)
    args = ap.parse_args(argv)
    tv_best = {name: {c["id"]: c["methods"]["tv_best"]["psnr"]
                      for c in json.load(open(path))["cases"]} for name, path in args.tv_best}
    doc = {"script": "scripts/study_net_input_choice.py", "argv": sys.argv[1:],
           "t_min": args.t_min, "sets": {}}
    for name, base_file, auto_file in args.pair:
        rows = scan_rows(base_file, auto_file)
        fbp = [r["psnr_fbp"] for r in rows]
        sweep = {}
        for t_min in sorted(set(THRESHOLDS) | {args.t_min}):
            try:
                psnr = replay(rows, t_min)
            except SystemExit:
                continue
            gain = [p - f for p, f in zip(psnr, fbp)]
            sweep[str(t_min)] = {"tv_input": sum(r["t"] > t_min for r in rows),
                                 "psnr_change_mean": st.mean(gain),
                                 "psnr_change_worst": min(gain)}
        psnr = replay(rows, args.t_min)
        families = {}
        for r, p in zip(rows, psnr):
            f = families.setdefault(r["family"], {"fbp": [], "auto": [], "tv_best": []})
            f["fbp"].append(r["psnr_fbp"])
            f["auto"].append(p)
            if r["id"] in tv_best.get(name, {}):
                f["tv_best"].append(tv_best[name][r["id"]])
        summary = {}
        for fam, f in sorted(families.items()) + [("all", {
                k: sum((families[x][k] for x in families), []) for k in ("fbp", "auto",
                                                                           "tv_best")})]:
            s = {"scans": len(f["fbp"]), "psnr_fbp": st.mean(f["fbp"]),
                 "psnr_auto": st.mean(f["auto"])}
            if len(f["tv_best"]) == len(f["fbp"]):
                s["auto_minus_tv_best"] = st.mean(a - b for a, b in zip(f["auto"], f["tv_best"]))
                s["fbp_minus_tv_best"] = st.mean(a - b for a, b in zip(f["fbp"], f["tv_best"]))
                s["auto_minus_tv_best_worst"] = min(a - b for a, b in zip(f["auto"],
                                                                          f["tv_best"]))
            summary[fam] = s
        doc["sets"][name] = {"threshold_sweep": sweep, "at_t_min": summary,
                             "scans": [{**r, "t": round(r["t"], 3)} for r in rows]}
    dump_json(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
