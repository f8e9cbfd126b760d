"""IVON's training settings for a classification data set, chosen on the validation split only.

For each seed, the benchmark's split (``load_classification`` with the seed,
then :func:`ctuq.classify.bench.validation_split`, the held-out tenth) is
reproduced; IVON trains on the training part for every ``(lr, hess_init,
prior precision)`` of the grid and is scored by the NLL of its Monte-Carlo
predictive (``--samples`` weight draws) on the validation part; a run whose
loss diverges scores ``inf``. The test images are never evaluated. One JSON
document on stdout.

    .venv/bin/python scripts/bench_classify_ivon_val.py --dataset fmnist --n-train 10000 \
        --n-test 2000 --prior-precisions 10,100 --seeds 0,1 > benchmarks/results/bench_classify_ivon_val.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import numpy as np
import torch

from ctuq.classify import bench as B
from ctuq.classify.ivon import train_ivon
from ctuq.classify.metrics import classification_metrics
from ctuq.data.classification import load_classification
from ctuq.errors import InputError
from ctuq.models.classifiers import build_classifier


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--n-test", type=int, default=None,
                    help="as the benchmark's (it seeds the same subsets; test is not read)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--lrs", default="0.1,0.3,1")
    ap.add_argument("--hess-inits", default="0.1,1")
    ap.add_argument("--prior-precisions", default="10",
                    help="α of the Gaussian weight prior (the MAP's train_prior_precision)")
    ap.add_argument("--temperatures", default="1",
                    help="T of the tempered likelihood (ess = N/T)")
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--samples", type=int, default=64)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = B.BenchConfig(epochs=args.epochs)
    grid = list(itertools.product(*[[float(v) for v in a.split(",")] for a in
                                    (args.lrs, args.hess_inits, args.prior_precisions,
                                     args.temperatures)]))
    rows = []
    t_all = time.perf_counter()
    for seed in [int(s) for s in args.seeds.split(",")]:
        data = load_classification(args.dataset, args.data_dir, seed=seed,
                                   n_train=args.n_train, n_test=args.n_test)
        tr, va = B.validation_split(data.y_train, cfg.val_fraction, seed)
        x_tr, y_tr = data.x_train[tr], data.y_train[tr]
        x_va, y_va = data.x_train[va], data.y_train[va]
        for lr, h0, alpha, temp in grid:
            net = build_classifier(cfg.model, data.image_shape, data.num_classes, seed=seed,
                                   hidden=cfg.hidden)
            t0 = time.perf_counter()
            row = {"seed": seed, "lr": lr, "hess_init": h0, "prior_precision": alpha,
                   "temperature": temp}
            try:
                clf = train_ivon(net, x_tr, y_tr, epochs=cfg.epochs,
                                 batch_size=cfg.batch_size, lr=lr, hess_init=h0,
                                 prior_precision=alpha, temperature=temp, seed=seed)
            except InputError as err:          # the loss diverged
                row.update(val_nll=float("inf"), error=str(err),
                           seconds=time.perf_counter() - t0)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                continue
            mc = classification_metrics(clf.predict(x_va, args.samples, seed=seed), y_va)
            mean = classification_metrics(clf.predict_mean(x_va), y_va)
            row.update(val_nll=mc["nll"], val_accuracy=mc["accuracy"], val_ece=mc["ece"],
                       val_nll_mean_weights=mean["nll"], final_loss=clf.loss[-1],
                       variance_median=float(clf.posterior.variance.median()),
                       seconds=time.perf_counter() - t0)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    summary = {}
    for lr, h0, alpha, temp in grid:
        v = [r["val_nll"] for r in rows
             if (r["lr"], r["hess_init"], r["prior_precision"], r["temperature"])
             == (lr, h0, alpha, temp)]
        summary[f"lr={lr:g},hess_init={h0:g},prior_precision={alpha:g},temperature={temp:g}"] = {
            "lr": lr, "hess_init": h0, "prior_precision": alpha, "temperature": temp,
            "val_nll_mean": float(np.mean(v)), "val_nll": v}
    best = min(summary.values(), key=lambda r: r["val_nll_mean"])
    json.dump({"split": "validation (the held-out tenth of each seed's training set)",
               "dataset": args.dataset, "n_train": args.n_train,
               "epochs": args.epochs,
               "samples": args.samples, "rows": rows, "summary": summary, "best": best,
               "rule": "lowest mean validation NLL of the MC predictive over the seeds",
               "wall_seconds": time.perf_counter() - t_all,
               "environment": B.environment()}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
