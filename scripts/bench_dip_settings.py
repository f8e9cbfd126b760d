#!/usr/bin/env python
"""DIP+TV settings (TV weight factor, input, iterations, warm start) against TV, on the validation split.

Prints one JSON document on stdout. Per image (``--per-family`` of every
family of ``--split``, at ``--size``, the conditions of
``ctuq.bench.dip_vs_tv.SWEEP_CONDITIONS`` alternated): FBP, TV at the weight
factors ``TV_FACTORS`` (the oracle "TV best" is the best of them per image)
and one DIP+TV fit per variant: the size's preset with the variant's
``DIPConfig`` changes, monitored every ``--monitor-every`` iterations (PSNR
and seconds), on the data divided by their scale as ``ctuq.reconstruct``
fits them (``--no-normalize``: as simulated). A variant's ``"heldout_every":
k`` fits without every k-th angle and traces the left-out projections'
residual: the iterate where it is lowest is the ground-truth-free stop
(``heldout_stop``). Resumable (``--partial``, one JSON line per finished fit;
variants can be added to a finished run). ``--reconstruct``: instead, the full
``ctuq.reconstruct`` per variant and image, and the coverage of its posterior
and total std.

Usage::

    python scripts/bench_dip_settings.py --size 64 --per-family 3 \\
        --variants '{"factor 1": {}, "factor 0.5": {"tv_weight_factor": 0.5}}' \\
        --partial sweep64.jsonl > benchmarks/results/dip_tv_weight_validation.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ctuq.bench import dip_vs_tv as B
from ctuq.bench.cases import case_spec
from ctuq.bench.machine import machine
from ctuq.bench.runner import (dump_json, merge_settings, read_case_file, read_cases,
                               run_resumable)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--per-family", type=int, default=3)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--families", default="", help="comma-separated (default: all of the split)")
    ap.add_argument("--variants", default='{"default": {}}',
                    help="JSON object: variant name -> DIPConfig changes")
    ap.add_argument("--monitor-every", type=int, default=100)
    ap.add_argument("--partial", help="JSON lines of finished fits (resume)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shard", default="0/1",
                    help="i/n: run only every n-th job from the i-th (parallel runs, each with "
                         "its own --partial; a last run over all of them, their lines "
                         "concatenated, writes the summary)")
    ap.add_argument("--cases-from", default=None,
                    help="instead of --per-family: the --size cases of this calibration "
                         "benchmark document or --partial file, each with its own noise draw "
                         "(the test-split images of the published tables)")
    ap.add_argument("--no-normalize", action="store_true",
                    help="fit the data as simulated, not divided by its scale (the DIP "
                         "sweeps before the data scale)")
    ap.add_argument("--summary-only", action="store_true",
                    help="fit nothing: summarise the rows of --partial that exist")
    ap.add_argument("--reconstruct", action="store_true",
                    help="run ctuq.reconstruct per variant (coverage of its std) instead of "
                         "the DIP fit alone; no TV. A variant's \"uncertainty\" key holds "
                         "its uncertainty overrides (merged over --uncertainty)")
    ap.add_argument("--uncertainty", default="{}",
                    help="JSON object: uncertainty overrides for --reconstruct")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    variants = json.loads(args.variants)
    offset = 0  # the sweeps' scans: each image's first noise draw
    cases = B.sweep_cases(args.size, args.per_family, args.split,
                          [f for f in args.families.split(",") if f] or None)
    if args.cases_from:
        offset = None
        cases = [case_spec(r) for r in read_case_file(args.cases_from) if r["size"] == args.size]
    split = ",".join(sorted({c["split"] for c in cases})) or args.split
    jobs = [] if args.reconstruct else [{"id": f"tv|{c['id']}", "case": c} for c in cases]
    jobs += [{"id": f"{name}|{c['id']}", "case": c, "variant": name}
             for name in variants for c in cases]

    i, n = (int(v) for v in args.shard.split("/"))
    jobs = jobs[i::n]

    def run_one(job):
        if args.reconstruct:
            changes = dict(variants[job["variant"]])  # DIP changes, and its own "uncertainty"
            unc = merge_settings(json.loads(args.uncertainty), changes.pop("uncertainty", {}))
            row = B.run_reconstruct_case(job["case"], changes, unc)
            return {**row, "id": job["id"], "variant": job["variant"]}
        if "variant" not in job:
            return {**B.run_tv_sweep_case(job["case"], offset), "id": job["id"],
                    "case": job["case"]["id"]}
        row = B.run_dip_variant_case(job["case"], variants[job["variant"]], args.monitor_every,
                                     normalize=not args.no_normalize, offset=offset)
        return {**row, "id": job["id"], "variant": job["variant"]}

    t0 = time.perf_counter()
    if args.summary_only:
        done = read_cases(args.partial, "id")
        rows = [done[j["id"]] for j in jobs if j["id"] in done]
    else:
        rows = run_resumable(jobs, args.partial, run_one)
    if args.reconstruct:
        dump_json({"script": "scripts/bench_dip_settings.py",
                   "argv": sys.argv[1:] if argv is None else argv, "split": split,
                   "variants": variants, "machine": machine("cpu"), "threads": args.threads,
                   "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
                   "cases": rows})
        return 0
    tv_rows = [{**r, "id": r["case"]} for r in rows if r["id"].startswith("tv|")]
    dip_rows = [r for r in rows if not r["id"].startswith("tv|")]
    dump_json({"script": "scripts/bench_dip_settings.py",
               "argv": sys.argv[1:] if argv is None else argv, "split": split,
               "tv": "PDHG, 1000 iterations, x >= 0, weights TV_FACTORS x default (true sigma)",
               "tv_factors": B.TV_FACTORS, "variants": variants,
               "machine": machine("cpu"), "threads": args.threads,
               "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
               "summary": B.summarise_sweep(tv_rows, dip_rows), "tv_cases": tv_rows,
               "dip_cases": dip_rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
