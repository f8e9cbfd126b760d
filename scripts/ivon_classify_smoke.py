#!/usr/bin/env python
"""Smoke comparison of IVON against a MAP MLP on scikit-learn's digits (issue 24, phase 1).

Prints one JSON document on stdout (progress on stderr). Per seed: the
digits split of :func:`ctuq.data.classification.load_digits_data`, 10 % of
the training images held out (stratified,
:func:`ctuq.classify.bench.validation_split`), the benchmark's MLP
(one hidden layer of 32) trained on the rest by

- ``map``: :func:`ctuq.classify.training.train_map` (Adam, 150 epochs, prior
  precision 1, the benchmark's defaults);
- ``ivon``: :func:`ctuq.classify.ivon.train_ivon` (same epochs, batch size
  and prior precision, ``ess = N``), for each (``lr``, ``hess_init``) of a
  small grid; the pair with the best **validation** NLL of the MC predictive
  is the one reported on the test set (``ivon`` = MC predictive with
  ``--samples`` weight samples, ``ivon-mean`` = the mean weights).

Test metrics: accuracy, NLL, ECE (15 bins), Brier, OOD AUROC against
permuted digits (max-softmax confidence), training seconds. Not a benchmark
of record: the full comparison (Fashion-MNIST, 5 seeds, the LLA,
laplace-torch, MC dropout) is ``ctuq bench-classify`` in phase 2.

Usage::

    python scripts/ivon_classify_smoke.py --seeds 0 1 2 > benchmarks/results/ivon_classify_smoke.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import numpy as np
import torch

from ctuq.bench.machine import machine

log = logging.getLogger("ivon_classify_smoke")

GRID = [{"lr": lr, "hess_init": h0} for lr in (1.0, 2.0, 4.0) for h0 in (3.0, 10.0, 30.0)]


def metrics(probs, labels, probs_ood) -> dict:
    from ctuq.classify.metrics import classification_metrics, ood_auroc

    return {**classification_metrics(probs, labels), "ood_auroc": ood_auroc(probs, probs_ood)}


def run_seed(seed: int, n_samples: int) -> dict:
    from ctuq.classify.ivon import train_ivon
    from ctuq.data.classification import load_digits_data
    from ctuq.models.classifiers import build_classifier
    from ctuq.classify.training import train_map
    from ctuq.classify.bench import validation_split
    from ctuq.classify.metrics import nll

    d = load_digits_data(seed=seed)
    tr, va = validation_split(d.y_train, 0.1, seed=seed)
    xt, yt, xv, yv = d.x_train[tr], d.y_train[tr], d.x_train[va], d.y_train[va]
    out = {"seed": seed, "n_train": int(len(tr)), "n_val": int(len(va)),
           "n_test": int(d.x_test.shape[0])}

    net = build_classifier("mlp", d.image_shape, d.num_classes, seed=seed)
    t0 = time.perf_counter()
    train_map(net, xt, yt, seed=seed)
    map_s = time.perf_counter() - t0
    with torch.no_grad():
        out["map"] = {**metrics(torch.softmax(net(d.x_test).double(), -1), d.y_test,
                                torch.softmax(net(d.x_ood).double(), -1)), "seconds": map_s}

    trials = []
    best = None
    for g in GRID:
        net = build_classifier("mlp", d.image_shape, d.num_classes, seed=seed)
        clf = train_ivon(net, xt, yt, seed=seed, **g)
        val_nll = nll(clf.predict(xv, n_samples), yv)
        trials.append({**g, "val_nll": val_nll, "seconds": clf.seconds})
        log.info("seed %d %s: validation NLL %.4f", seed, g, val_nll)
        if best is None or val_nll < best[0]:
            best = (val_nll, g, clf)
    _, g, clf = best
    out["ivon_grid"] = trials
    out["ivon_chosen"] = g
    out["ivon"] = {**metrics(clf.predict(d.x_test, n_samples), d.y_test,
                             clf.predict(d.x_ood, n_samples)), "seconds": clf.seconds,
                   "samples": n_samples}
    out["ivon-mean"] = {**metrics(clf.predict_mean(d.x_test), d.y_test,
                                  clf.predict_mean(d.x_ood)), "seconds": clf.seconds}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--samples", type=int, default=64, help="MC predictive weight samples")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    runs = [run_seed(s, args.samples) for s in args.seeds]
    summary = {}
    for method in ("map", "ivon", "ivon-mean"):
        summary[method] = {k: {"mean": float(np.mean([r[method][k] for r in runs])),
                               "std": float(np.std([r[method][k] for r in runs]))}
                           for k in ("accuracy", "nll", "ece", "brier", "ood_auroc", "seconds")}
    doc = {"script": "scripts/ivon_classify_smoke.py", "argv": sys.argv[1:],
           "dataset": "digits (scikit-learn), MLP (32)", "grid": GRID,
           "summary": summary, "runs": runs, "seconds": time.perf_counter() - t0,
           "machine": {**machine("cpu"),
                       "threads": args.threads}}
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
