#!/usr/bin/env python
"""Calibration of ctuq's uncertainty on images no setting has seen (issue 21).

Prints one JSON document on stdout (progress on stderr); with ``--docs DIR``
also writes ``DIR/calibration.md`` (tables) and one reliability plot per size
(into ``--plots``, default ``benchmarks/results``).

**Cases** come from one split of :mod:`ctuq.data.splits` (``--split``; the
README's numbers come from ``test``, defaults were chosen on
``validation``): at 64², 30 and 60 parallel-beam angles × 1 % and 5 % noise;
at 128², 60 angles × 1 % and 5 %; ``--per-family`` images of every family of
the split per condition, each condition with its own images (indices run on
across conditions), each scan with its own noise draw. Noise std known to
every method.

**Methods**, all on the same simulated scan; ctuq's are scored from
``ctuq.reconstruct``'s result for it (the size's preset, default settings)
and what follows from that result (``ctuq.bench.calibration``):

- ``fbp``: FBP with :func:`ctuq.recon.baselines.fbp_variance` (propagated
  noise + an iid term that explains the excess data residual);
- ``mc_dropout``: MC-dropout DIP (p = 0.05, ``--mc-samples`` passes);
- ``posterior`` / ``posterior_predcp``: ctuq's linearised posterior alone,
  without / with TV-PredCP (the EM's MAP-II);
- ``heldout`` / ``heldout_predcp``: + the model error from held-out projections,
  its coefficients the maximum a posteriori under the preset's calibrated prior
  (``uncertainty.heldout_prior_width``; maximum likelihood where ctuq ships no
  calibration for the preset);
- ``heldout_mle`` / ``heldout_mle_predcp``: the same without the prior;
- ``calibrated`` / ``calibrated_predcp``: + the model error from the
  preset's calibration file (``--calibration DIR``: ``<preset>.json``, made by
  ``ctuq calibrate`` on the tuning split);
- ``conformal`` / ``conformal_predcp``: the posterior std × the same file's
  split-conformal multiplier;
- ``ivon`` / ``ivon_heldout`` (with ``--ivon``): IVON from the same Adam
  fit (``[uncertainty] method = "ivon"``, docs/ivon.md), alone and + the
  same held-out model error;
- ``default``: what ``ctuq reconstruct`` does with no settings (one of the
  above, named in the document).

**Scores** per method and image: ±1/2/3σ coverage overall, within one pixel
of an edge of the truth and elsewhere (:func:`ctuq.recon.model_error.edge_mask`),
per-pixel test log-likelihood with no variance floor, Spearman(std, |error|),
PSNR, the reliability curve, wall time; summarised per size and condition by
the mean and the worst image.

Usage::

    python scripts/bench_calibration.py --split test --sizes 64,128 --jobs 2 \\
        --partial bench_calibration_cases.jsonl --docs docs \\
        > benchmarks/results/bench_calibration.json
    python scripts/bench_calibration.py --quick          # minutes: a smoke run

``--partial FILE`` appends every finished case to FILE and reads it back on a
rerun, so an interrupted run resumes where it stopped; with ``--arrays DIR``
the images are kept too, and cases scored before a calibration file existed
get their ``calibrated``/``conformal`` scores on the next run.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ctuq.bench import calibration as cal
from ctuq.bench.cases import calibration_cases, case_spec, realistic_cases
from ctuq.bench.runner import dump_json, read_case_file, read_cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test", choices=("tuning", "validation", "test"))
    ap.add_argument("--sizes", default="64,128")
    ap.add_argument("--per-family", type=int, default=1)
    ap.add_argument("--calibration", default=None,
                    help="folder of <preset>.json calibration files (default: the shipped ones)")
    ap.add_argument("--mc-samples", type=int, default=128)
    ap.add_argument("--no-mc-dropout", action="store_true")
    ap.add_argument("--conditions", default=None,
                    help="a subset of the size's conditions, e.g. 30:0.01,60:0.05 "
                         "(with --realistic: angles:I0, e.g. 60:1e4)")
    ap.add_argument("--realistic", action="store_true",
                    help="the realistic condition instead (ctuq.bench.cases.realistic_cases: "
                         "off-grid, Poisson counts with flats/darks, noise level unknown, "
                         "hidden centre offset within 0.5 px)")
    ap.add_argument("--variant", action="append", default=[],
                    help="also reconstruct with these settings, scored as <method>_<NAME>: "
                         "NAME:key=value[,key=value] (e.g. gaussian:noise_model=gaussian; "
                         "dotted keys for tables: dip.iterations=500)")
    ap.add_argument("--ivon", action="store_true",
                    help="also IVON from the same Adam fit (methods ivon, ivon_heldout); "
                         "cases of --partial scored without it get it (fits redone)")
    ap.add_argument("--set", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                    help="settings of every reconstruction of the run, as in --variant "
                         "(e.g. uncertainty.laplace.mean=linear)")
    ap.add_argument("--limit", type=int, default=None,
                    help="run at most this many cases now, in the list's order (every "
                         "family and condition before a second image); the rest stay "
                         "planned and are summarised where done")
    ap.add_argument("--only-done", action="store_true",
                    help="run nothing: summarise the cases already in --partial")
    ap.add_argument("--all-done", action="store_true",
                    help="run nothing: summarise every case in --partial, whichever "
                         "--per-family or --conditions made it")
    ap.add_argument("--cases-from", default=None,
                    help="run exactly the cases of this benchmark document or --partial "
                         "file (rerun a published benchmark's images with new code), of "
                         "the sizes in --sizes and the --conditions, if given")
    ap.add_argument("--carry", default=None,
                    help="copy the methods this run skips (e.g. mc_dropout, ivon) from the "
                         "same cases of this earlier document or --partial file")
    ap.add_argument("--predcp", default="both", choices=("both", "off", "on"),
                    help="which TV-PredCP variants of the posterior methods to run")
    ap.add_argument("--normalize", default=None, choices=("on", "off"),
                    help="the reconstructions' normalize setting (default: the product's)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--partial", default=None)
    ap.add_argument("--arrays", default=None,
                    help="keep each case's truth, reconstruction and posterior variances "
                         "here, so that a later --calibration can rescore them")
    ap.add_argument("--docs", default=None, help="write calibration.md here (e.g. docs)")
    ap.add_argument("--plots", default="benchmarks/results",
                    help="with --docs: the folder of the reliability plots")
    ap.add_argument("--quick", action="store_true", help="28², 2 families, few iterations")
    ap.add_argument("--quick-iterations", type=int, default=100)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    logging.getLogger("ctuq.bench").setLevel(logging.INFO)
    if args.calibration is None:
        from ctuq.recon.model_error import DEFAULTS_DIR
        args.calibration = str(DEFAULTS_DIR)
    sizes = [28] if args.quick else [int(s) for s in args.sizes.split(",")]
    conditions = [(int(a), float(n)) for a, n in
                  (c.split(":") for c in args.conditions.split(","))] \
        if args.conditions else None
    run = cal.CalibrationRun(
        variants=tuple(cal.parse_variant(v) for v in args.variant),
        threads=args.threads, quick=args.quick, quick_iterations=args.quick_iterations,
        predcp_variants={"both": (False, True), "off": (False,), "on": (True,)}[args.predcp],
        calibration=args.calibration, arrays=args.arrays, ivon=args.ivon,
        mc_dropout=not args.no_mc_dropout, mc_samples=args.mc_samples,
        normalize=None if args.normalize is None else args.normalize == "on",
        settings=cal.parse_variant("set:" + args.set)[1] if args.set else None)
    planned = (realistic_cases if args.realistic else calibration_cases)(
        args.split, sizes, args.per_family, conditions)
    cases = planned
    if args.quick:
        cases = [c for c in cases if c["family"] in ("ellipses", "digits")][:2]
    if args.only_done:  # summarise an interrupted run as it stands
        done = read_cases(args.partial, "id")
        cases = [c for c in cases if c["id"] in done]
    if args.all_done:  # runs made with other plans: every case they finished
        cases = [case_spec(r) for r in read_cases(args.partial, "id").values()]
    if args.cases_from:  # the cases of an earlier run, whichever plans made them
        cases = [case_spec(r) for r in read_case_file(args.cases_from)
                 if r["size"] in sizes and (not conditions or (
                     r["n_angles"], r.get("I0") or r["noise"]) in conditions)]
    if args.limit is not None:  # in the list's order, sizes as given
        order = {s: k for k, s in enumerate(sizes)}
        cases = sorted(cases, key=lambda c: order[c["size"]])[:args.limit]
    doc = cal.benchmark(
        cases, run, partial=args.partial, jobs=args.jobs, carry=args.carry,
        complete_ivon=args.ivon and not (args.only_done or args.all_done),
        cases_planned=len(cases) if args.all_done or args.cases_from else len(planned),
        script="scripts/bench_calibration.py", split=args.split, sizes=sizes,
        per_family=args.per_family, conditions=conditions)
    if args.docs:
        from ctuq.bench.report import calibration_page
        calibration_page(doc, args.docs, args.plots)
    dump_json(doc)


if __name__ == "__main__":
    main()
