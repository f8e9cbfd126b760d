"""Classification benchmark on scikit-learn's digits: one JSON document on stdout.

MAP, linearised Laplace with STO samples and MacKay/EM layer-wise ARD (MC and
probit predictive), the exact dense full-GGN LLA (prior by exact evidence,
MC and probit), and MC dropout, over several seeds (split, initialisation and
samples follow the seed), mean ± std. Single-threaded (``torch.set_num_threads(1)``).

    .venv/bin/python scripts/bench_classify.py > docs/bench_classify.json
    .venv/bin/python scripts/bench_classify.py --seeds 0,1,2 --figures docs/

The document holds ``aggregate`` (method → metric → mean/std/values),
``checks`` (the issue's targets evaluated on the means), the per-seed runs and
the environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ctuq.recon import classify_bench as B

METHODS = ("map", "lla-sampled", "lla-sampled-probit", "lla-exact", "lla-exact-probit",
           "mc-dropout")


def checks(agg: dict, lla: str = "lla-sampled") -> dict:
    """The issue's targets, evaluated on the means over seeds."""
    m, s = agg["map"], agg[lla]
    out = {
        "equal_accuracy_within_0.5pct": abs(s["accuracy"]["mean"] - m["accuracy"]["mean"])
        <= 0.005,
        "nll_no_worse": s["nll"]["mean"] <= m["nll"]["mean"],
        "ece_no_worse": s["ece"]["mean"] <= m["ece"]["mean"],
        "ood_auroc_higher": s["ood_auroc"]["mean"] > m["ood_auroc"]["mean"],
        "rotation_nll_better": s["rotation_nll"]["mean"] < m["rotation_nll"]["mean"],
    }
    if "lla-exact" in agg:
        out["time_sampled_over_exact"] = s["seconds"]["mean"] / agg["lla-exact"]["seconds"]["mean"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--prior", default="ard")
    ap.add_argument("--lla-mode", default="map", help="map (post-hoc, θ̂) | linear (θ*)")
    ap.add_argument("--train-prior-precision", type=float, default=1.0)
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--figures", default=None,
                    help="folder for classification_reliability.png / classification_rotation.png")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = B.BenchConfig(model=args.model, prior=args.prior, epochs=args.epochs,
                        train_prior_precision=args.train_prior_precision,
                        lla_mode=args.lla_mode)
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.perf_counter()
    results = []
    for s in seeds:
        results += B.run_seeds("digits", B.parse_methods(args.methods), cfg, [s])
        print(f"seed {s} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    doc = B.benchmark_document(results)
    doc["wall_seconds"] = time.perf_counter() - t0
    doc["config"] = cfg.to_dict()
    doc["checks"] = checks(doc["aggregate"]) if "map" in doc["aggregate"] and \
        "lla-sampled" in doc["aggregate"] else {}
    if args.figures:
        from ctuq.app.classify_figures import save_benchmark_figures

        save_benchmark_figures(args.figures, B.pooled_reliability(results),
                               B.rotation_rows(doc["aggregate"]),
                               title=f"digits, {args.model}, {len(seeds)} seeds",
                               prefix="classification_")
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
