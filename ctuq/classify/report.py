"""Results of classification-benchmark runs and their summaries: mean ± std over seeds,
pooled reliability, rotation rows, the JSON document (docs/method.md §11)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ctuq.classify import metrics as M
from ctuq.data.classification import ClassificationData

__all__ = ["MethodResult", "BenchResult", "aggregate", "pooled_reliability", "rotation_rows", "environment",
           "benchmark_document"]


@dataclass
class MethodResult:
    """One method on one seed.

    Attributes
    ----------
    metrics : dict
        ``accuracy``, ``nll``, ``ece``, ``brier``, ``ood_auroc``,
        ``rotation_nll`` (mean NLL over the angles > 0), ``rotation_accuracy``.
    rotation : list of dict
        ``angle``, ``accuracy``, ``nll`` per angle.
    reliability : dict
        :func:`ctuq.classify.metrics.reliability` on the test set.
    seconds : float
    extra : dict
        Method specifics (prior variances, EM trace, …).
    test_probs : ndarray, shape (N, C)
        Test-set predictive probabilities (not serialised).
    """

    metrics: dict
    rotation: list
    reliability: dict
    seconds: float
    extra: dict = field(default_factory=dict)
    test_probs: np.ndarray | None = None

    def to_dict(self) -> dict:
        return {"metrics": self.metrics, "rotation": self.rotation,
                "reliability": self.reliability, "seconds": self.seconds, "extra": self.extra}


@dataclass
class BenchResult:
    """All methods on one seed.

    Attributes
    ----------
    dataset : dict
        :meth:`ClassificationData.summary`.
    config : dict
    seed : int
    methods : dict of str to MethodResult
    skipped : dict of str to str
        Methods not run, with the reason.
    train_seconds : float
    num_params : int
    data : ClassificationData
        The data (not serialised).
    """

    dataset: dict
    config: dict
    seed: int
    methods: dict
    skipped: dict
    train_seconds: float
    num_params: int
    data: ClassificationData | None = None

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, "config": self.config, "seed": self.seed,
                "num_params": self.num_params, "train_seconds": self.train_seconds,
                "skipped": self.skipped,
                "methods": {k: v.to_dict() for k, v in self.methods.items()}}


def aggregate(results: list) -> dict:
    """Mean and standard deviation over seeds of every metric and wall time.

    Parameters
    ----------
    results : list of BenchResult

    Returns
    -------
    dict
        ``method → {metric → {"mean", "std", "values"}}`` (``std`` with
        ``ddof=1``; 0 for one seed), including ``seconds`` and per-angle
        ``rotation_nll_<angle>`` / ``rotation_accuracy_<angle>``.
    """
    table: dict = {}
    for res in results:
        for name, mr in res.methods.items():
            vals = dict(mr.metrics)
            vals["seconds"] = mr.seconds
            for r in mr.rotation:
                vals[f"rotation_nll_{r['angle']:g}"] = r["nll"]
                vals[f"rotation_accuracy_{r['angle']:g}"] = r["accuracy"]
            for k, v in vals.items():
                table.setdefault(name, {}).setdefault(k, []).append(float(v))
    return {name: {k: {"mean": float(np.mean(v)),
                       "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
                       "values": v} for k, v in cols.items()}
            for name, cols in table.items()}


def pooled_reliability(results: list, n_bins: int | None = None) -> dict:
    """Method → reliability diagram of the test predictions of all seeds pooled."""
    pooled: dict = {}
    for res in results:
        y = res.data.y_test.numpy() if res.data is not None else None
        for name, mr in res.methods.items():
            if mr.test_probs is None or y is None:
                continue
            p, l = pooled.setdefault(name, ([], []))
            p.append(mr.test_probs)
            l.append(y)
    bins = n_bins or (results[0].config.get("ece_bins", M.DEFAULT_ECE_BINS) if results else 15)
    return {name: M.reliability(np.concatenate(p), np.concatenate(l), bins)
            for name, (p, l) in pooled.items()}


def rotation_rows(agg: dict) -> dict:
    """Method → ``[{"angle", "accuracy", "nll", "accuracy_std", "nll_std"}]`` from :func:`aggregate`."""
    out = {}
    for name, cols in agg.items():
        angles = sorted(float(k[len("rotation_nll_"):]) for k in cols
                        if k.startswith("rotation_nll_"))
        out[name] = [{"angle": a,
                      "accuracy": cols[f"rotation_accuracy_{a:g}"]["mean"],
                      "accuracy_std": cols[f"rotation_accuracy_{a:g}"]["std"],
                      "nll": cols[f"rotation_nll_{a:g}"]["mean"],
                      "nll_std": cols[f"rotation_nll_{a:g}"]["std"]} for a in angles]
    return out


def environment() -> dict:
    """torch version and threads, machine, Python: what a benchmark's times depend on."""
    import platform

    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.machine(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine()}


def benchmark_document(results: list) -> dict:
    """One JSON-serialisable document: aggregate over seeds, per-seed results, environment."""
    return {"aggregate": aggregate(results),
            "seeds": [r.seed for r in results],
            "runs": [r.to_dict() for r in results],
            "environment": environment()}
