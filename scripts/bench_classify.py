"""Classification benchmark (scikit-learn's digits by default): one JSON document on stdout.

MAP (plain and temperature-scaled), linearised Laplace with STO samples and
MacKay/EM layer-wise ARD (all weights and last layer; predictive spread as
sampled and with its scale tuned on a validation split of the training set),
the exact dense full-GGN LLA (prior by exact evidence; as is, scale-tuned and,
on request, with the prior precision tuned on validation), MC dropout, and
IVON (variational training, Monte-Carlo predictive; and the sampled LLA around
its mean), over several seeds (split, initialisation and samples follow
the seed), mean ± std. Single-threaded (``torch.set_num_threads(1)``).

    .venv/bin/python scripts/bench_classify.py --figures benchmarks/results/ > benchmarks/results/bench_classify.json
    .venv/bin/python scripts/bench_classify.py --lla-mode linear \
        --methods map,lla-sampled,lla-sampled-val > benchmarks/results/bench_classify_linear_mode.json
    .venv/bin/python scripts/bench_classify.py \
        --methods map,lla-exact,lla-exact-val,lla-exact-prior-val \
        > benchmarks/results/bench_classify_prior_val.json

The document holds ``aggregate`` (method → metric → mean/std/values),
``checks`` (the issue's targets evaluated on the means, per LLA variant), the
per-seed runs and the environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

import torch

import ctuq.classify as C
from ctuq.classify import bench as B

METHODS = ("map", "map-temp", "lla-sampled", "lla-sampled-val", "lla-last-layer",
           "lla-last-layer-val", "lla-exact", "lla-exact-val", "mc-dropout", "ivon",
           "ivon+lla", "ivon+lla-val")


def checks(agg: dict, lla: str = "lla-sampled", tie: float = 1e-9) -> dict:
    """The issue's targets for the method ``lla`` against ``map``, on the means over seeds.

    ``delta_*`` is the method's mean minus MAP's; a ``|delta| <= tie`` counts as
    equal (no worse, but not higher / better).
    """
    m, s = agg["map"], agg[lla]
    d = {k: s[k]["mean"] - m[k]["mean"]
         for k in ("accuracy", "nll", "ece", "ood_auroc", "rotation_nll")}
    out = {
        "equal_accuracy_within_0.5pct": abs(d["accuracy"]) <= 0.005,
        "nll_no_worse": d["nll"] <= tie,
        "ece_no_worse": d["ece"] <= tie,
        "ood_auroc_higher": d["ood_auroc"] > tie,
        "rotation_nll_better": d["rotation_nll"] < -tie,
        **{f"delta_{k}": v for k, v in d.items()},
    }
    if "lla-exact" in agg:
        out["time_over_exact"] = s["seconds"]["mean"] / agg["lla-exact"]["seconds"]["mean"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--dataset", default="digits", help="digits | mnist | fmnist | kmnist")
    ap.add_argument("--data-dir", default=None, help="folder of the MNIST-like IDX/NPZ files")
    ap.add_argument("--n-train", type=int, default=None, help="random training subset")
    ap.add_argument("--n-test", type=int, default=None, help="random test subset")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--prior", default="ard")
    ap.add_argument("--lla-mode", default="map", help="map (post-hoc, θ̂) | linear (θ*)")
    ap.add_argument("--train-prior-precision", type=float, default=1.0)
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--val-fraction", type=float, default=0.1,
                    help="share of the training set held out for the -val methods")
    ap.add_argument("--sto-batch-size", type=int, default=None,
                    help="mini-batch of the STO sampler (default: full batch)")
    ap.add_argument("--sto-iterations", type=int, default=300,
                    help="most STO steps (full batch stops earlier at its tolerance)")
    ap.add_argument("--ivon-lr", type=float, default=None,
                    help="default: the data set's validated setting (ctuq.classify.ivon."
                         "settings_for)")
    ap.add_argument("--ivon-hess-init", type=float, default=None, help="as --ivon-lr")
    ap.add_argument("--ivon-prior-precision", type=float, default=None,
                    help="IVON's prior precision (default: --train-prior-precision)")
    ap.add_argument("--ivon-temperature", type=float, default=None,
                    help="T of IVON's tempered likelihood (ess = N/T); as --ivon-lr")
    ap.add_argument("--ivon-samples", type=int, default=B.BenchConfig.ivon_samples,
                    help="weight samples of the ivon predictive")
    ap.add_argument("--figures", default=None,
                    help="folder for classification_reliability.png / classification_rotation.png")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = B.BenchConfig(model=args.model, prior=args.prior, epochs=args.epochs,
                        train_prior_precision=args.train_prior_precision,
                        lla_mode=args.lla_mode, val_fraction=args.val_fraction,
                        ivon_lr=args.ivon_lr, ivon_hess_init=args.ivon_hess_init,
                        ivon_samples=args.ivon_samples,
                        ivon_temperature=args.ivon_temperature,
                        ivon_prior_precision=args.ivon_prior_precision,
                        sto=replace(C.CLASSIFIER_STO, iterations=args.sto_iterations,
                                    batch_size=args.sto_batch_size))
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.perf_counter()
    results = []
    for s in seeds:
        results += B.run_seeds(args.dataset, B.parse_methods(args.methods), cfg, [s],
                               data_dir=args.data_dir, n_train=args.n_train,
                               n_test=args.n_test)
        print(f"seed {s} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    doc = B.benchmark_document(results)
    doc["wall_seconds"] = time.perf_counter() - t0
    doc["config"] = cfg.to_dict()
    agg = doc["aggregate"]
    doc["checks"] = {name: checks(agg, name) for name in agg
                     if name.startswith(("lla-", "ivon")) and "map" in agg}
    if args.figures:
        from ctuq.app.classify_figures import save_benchmark_figures

        save_benchmark_figures(args.figures, B.pooled_reliability(results),
                               B.rotation_rows(doc["aggregate"]),
                               title=f"{args.dataset}, {args.model}, {len(seeds)} seeds",
                               prefix="classification_")
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
