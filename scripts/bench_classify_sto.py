"""Full-batch against mini-batched sample-then-optimise in the classification LLA: one JSON document.

The sampling paper's claim (docs/method.md §5.2): with the variance-reduced
objective the data term of the sampler can be mini-batched. For each seed and
each sampler variant this runs the benchmark's ``map``, ``lla-sampled`` and
``lla-sampled-val`` (:func:`ctuq.classify.bench.run_benchmark`; MacKay
EM, 10 steps × 8 samples, 64 predictive samples): the full-batch sampler, which
stops at its tolerance, and each requested mini-batch size, which runs a fixed
number of Polyak-averaged steps. The MAP network is retrained for every variant
from the same seed, and the script checks that it is the same network (equal
MAP metrics). Per variant and seed it records the wall time of the EM, of the
final predictive draw and of the whole LLA, the EM's prior variances, the
largest relative STO residual of the predictive draw, and the test metrics;
the speed-ups (full-batch time over the variant's, per seed) and the
differences from the full-batch sampler are measured in the same run.
Single-threaded (``torch.set_num_threads(1)``), like ``bench_classify.py``.

    apt-get install dataset-fashion-mnist      # Debian's copy: offline at run time
    .venv/bin/python scripts/bench_classify_sto.py --dataset fmnist \\
        --data-dir /usr/share/datasets --n-train 10000 --n-test 2000 \\
        --train-prior-precision 10 --batch-sizes 1000 > benchmarks/results/bench_classify_sto.json
    .venv/bin/python scripts/bench_classify_sto.py --quick      # digits, a minute
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace

import torch

import ctuq.classify as C
from ctuq.classify import bench as B

METHODS = ("map", "lla-sampled", "lla-sampled-val")
METRICS = ("accuracy", "nll", "ece", "ood_auroc", "rotation_nll")


def _record(res: B.BenchResult) -> dict:
    """The sampler-related figures of one run."""
    lla = res.methods["lla-sampled"]
    ex = lla.extra
    return {"seed": res.seed, "n_train": res.dataset["n_train"], "n_val": res.dataset["n_val"],
            "n_test": res.dataset["n_test"], "lla_seconds": lla.seconds,
            "em_seconds": ex["em_seconds"], "draw_seconds": ex["sto_seconds"], "draw_iterations": ex["sto_iterations"],
            "draw_max_residual": ex["sto_max_residual"], "variances": ex["variances"],
            "scale": res.methods["lla-sampled-val"].extra["scale"],
            "metrics": {m: {k: res.methods[m].metrics[k] for k in METRICS} for m in METHODS}}


def _mean_std(values: list) -> dict:
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}


def compare(runs: dict) -> dict:
    """Variant → speed-ups and differences from ``runs['full']``, over seeds."""
    full = runs["full"]
    out = {}
    for name, recs in runs.items():
        row = {k: _mean_std([r[k] for r in recs])
               for k in ("lla_seconds", "em_seconds", "draw_seconds", "draw_max_residual")}
        if name != "full":
            row["speedup_lla"] = _mean_std([f["lla_seconds"] / r["lla_seconds"]
                                            for f, r in zip(full, recs)])
            row["speedup_em"] = _mean_std([f["em_seconds"] / r["em_seconds"]
                                           for f, r in zip(full, recs)])
            row["variance_rel_diff_max"] = max(
                abs(a / b - 1) for f, r in zip(full, recs)
                for a, b in zip(r["variances"], f["variances"]))
            row["delta"] = {m: {k: _mean_std([r["metrics"][m][k] - f["metrics"][m][k]
                                              for f, r in zip(full, recs)])
                                for k in METRICS} for m in METHODS[1:]}
        out[name] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--dataset", default="digits", help="digits | mnist | fmnist | kmnist")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--n-test", type=int, default=None)
    ap.add_argument("--train-prior-precision", type=float, default=1.0)
    ap.add_argument("--batch-sizes", default="1000",
                    help="comma-separated mini-batch sizes compared with the full batch")
    ap.add_argument("--iterations", type=int, default=300,
                    help="steps of the mini-batched sampler (the full batch stops at its "
                         "tolerance, at most this many steps)")
    ap.add_argument("--quick", action="store_true",
                    help="digits, seed 0, mini-batch 200: a smoke run")
    args = ap.parse_args(argv)
    if args.quick:
        args.dataset, args.seeds, args.batch_sizes = "digits", "0", "200"
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = {"full": None, **{b: int(b) for b in args.batch_sizes.split(",")}}
    base = B.BenchConfig(train_prior_precision=args.train_prior_precision)
    runs: dict = {name: [] for name in variants}
    t0 = time.perf_counter()
    for s in seeds:
        for name, bs in variants.items():
            cfg = base.with_(sto=replace(C.CLASSIFIER_STO, iterations=args.iterations,
                                          batch_size=bs))
            res = B.run_seeds(args.dataset, METHODS, cfg, [s], data_dir=args.data_dir,
                              n_train=args.n_train, n_test=args.n_test)[0]
            runs[name].append(_record(res))
            if runs[name][-1]["metrics"]["map"] != runs["full"][-1]["metrics"]["map"]:
                raise RuntimeError(f"seed {s}: the MAP network differs between variants")
            print(f"seed {s}, {name}: {runs[name][-1]['lla_seconds']:.0f} s "
                  f"({time.perf_counter() - t0:.0f} s in all)", file=sys.stderr, flush=True)
    # what does not depend on the seed (the per-seed sizes are in the runs)
    data = {k: v for k, v in res.dataset.items() if k not in ("seed", "n_train", "n_val",
                                                              "n_test", "n_ood")}
    doc = {"dataset": data, "seeds": seeds, "iterations": args.iterations,
           "config": base.to_dict(), "comparison": compare(runs), "runs": runs,
           "wall_seconds": time.perf_counter() - t0,
           "environment": B.environment()}
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
