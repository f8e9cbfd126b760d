"""Metrics of the classification benchmark (docs/method.md §11).

All functions take predictive class probabilities ``probs`` ``[N, C]`` (rows
sum to one) and integer labels ``labels`` ``[N]`` (``0 … C−1``), as torch
tensors or numpy arrays, and return Python floats (or dicts of them).

- :func:`accuracy`: fraction of ``argmax probs == label``.
- :func:`nll`: mean ``−log p(label)`` (nats), probabilities clipped below at
  ``1e-12`` so that one confident mistake is large but finite.
- :func:`ece`: expected calibration error with ``n_bins`` **equal-width**
  bins of the confidence ``max_c p_c`` on ``[0, 1]`` (default **15 bins**,
  the usual choice in the LLA literature): ``Σ_b |B_b|/N · |acc(B_b) −
  conf(B_b)|``; a confidence of exactly ``k/n_bins`` falls in bin ``k−1``
  (bins are closed on the right, the first also on the left).
- :func:`reliability`: the per-bin counts, accuracies and confidences behind it.
- :func:`brier`: ``mean_n Σ_c (p_{nc} − 1[c = y_n])²`` (sum over classes,
  range 0–2).
- :func:`ood_auroc`: area under the ROC curve for telling in-distribution
  (positive) from OOD (negative) inputs by the max-softmax confidence
  (scikit-learn's :func:`~sklearn.metrics.roc_auc_score`; 1 is perfect,
  0.5 is chance).
- :func:`predictive_entropy`: ``−Σ_c p_c log p_c`` per input, ``[N]``.
- :func:`classification_metrics`: the four in-distribution metrics at once.
"""

from __future__ import annotations

import numpy as np

from ctuq.errors import InputError

__all__ = ["accuracy", "nll", "ece", "reliability", "brier", "ood_auroc",
           "predictive_entropy", "classification_metrics", "DEFAULT_ECE_BINS"]

#: Bins of :func:`ece` unless told otherwise.
DEFAULT_ECE_BINS = 15
_EPS = 1e-12


def _np(a) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def _check(probs, labels=None):
    p = _np(probs).astype(np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise InputError(f"expected probabilities [N, C] with C >= 2, got {p.shape}",
                         field="probs")
    if not np.all(np.isfinite(p)) or np.any(p < -1e-6) or \
            np.any(np.abs(p.sum(1) - 1) > 1e-3):
        raise InputError("probabilities must be finite, non-negative and sum to 1 per row",
                         field="probs")
    if labels is None:
        return p, None
    y = _np(labels).astype(np.int64).reshape(-1)
    if y.shape[0] != p.shape[0]:
        raise InputError(f"{y.shape[0]} labels for {p.shape[0]} predictions", field="labels")
    if y.size and (y.min() < 0 or y.max() >= p.shape[1]):
        raise InputError(f"labels must be in 0..{p.shape[1] - 1}", field="labels")
    return p, y


def accuracy(probs, labels) -> float:
    """Fraction of inputs whose most probable class is the label."""
    p, y = _check(probs, labels)
    return float(np.mean(p.argmax(1) == y))


def nll(probs, labels) -> float:
    """Mean negative log-probability of the labels (nats), ``p`` clipped at ``1e-12``."""
    p, y = _check(probs, labels)
    return float(-np.mean(np.log(np.clip(p[np.arange(y.size), y], _EPS, None))))


def reliability(probs, labels, n_bins: int = DEFAULT_ECE_BINS) -> dict:
    """The reliability diagram: equal-width confidence bins.

    Parameters
    ----------
    probs : array, shape (N, C)
    labels : array, shape (N,)
    n_bins : int, optional
        Default 15.

    Returns
    -------
    dict
        ``edges`` (``n_bins + 1``), ``count``, ``accuracy`` and ``confidence``
        per bin (NaN for empty bins), ``n_bins``.
    """
    p, y = _check(probs, labels)
    n_bins = int(n_bins)
    if n_bins < 1:
        raise InputError(f"must be >= 1, got {n_bins}", field="n_bins")
    conf = p.max(1)
    correct = (p.argmax(1) == y).astype(np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # bin k holds (edges[k], edges[k+1]]; confidence 0 joins bin 0
    idx = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.bincount(idx, weights=correct, minlength=n_bins) / count
        cnf = np.bincount(idx, weights=conf, minlength=n_bins) / count
    return {"edges": edges.tolist(), "count": count.astype(int).tolist(),
            "accuracy": acc.tolist(), "confidence": cnf.tolist(), "n_bins": n_bins}


def ece(probs, labels, n_bins: int = DEFAULT_ECE_BINS) -> float:
    """Expected calibration error with ``n_bins`` equal-width bins (default 15)."""
    r = reliability(probs, labels, n_bins)
    count = np.asarray(r["count"], dtype=np.float64)
    gap = np.abs(np.nan_to_num(np.asarray(r["accuracy"]) - np.asarray(r["confidence"])))
    return float(np.sum(count / max(count.sum(), 1.0) * gap))


def brier(probs, labels) -> float:
    """Brier score ``mean_n Σ_c (p_nc − onehot_nc)²`` (range 0–2)."""
    p, y = _check(probs, labels)
    onehot = np.zeros_like(p)
    onehot[np.arange(y.size), y] = 1.0
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


def ood_auroc(probs_in, probs_out) -> float:
    """AUROC of max-softmax confidence, in-distribution = positive class.

    Parameters
    ----------
    probs_in : array, shape (N, C)
        Predictions on in-distribution test inputs.
    probs_out : array, shape (M, C)
        Predictions on OOD inputs.
    """
    from sklearn.metrics import roc_auc_score

    p_in, _ = _check(probs_in)
    p_out, _ = _check(probs_out)
    if p_in.shape[0] == 0 or p_out.shape[0] == 0:
        raise InputError("need in-distribution and OOD predictions", field="probs_out")
    scores = np.concatenate([p_in.max(1), p_out.max(1)])
    truth = np.concatenate([np.ones(p_in.shape[0]), np.zeros(p_out.shape[0])])
    return float(roc_auc_score(truth, scores))


def predictive_entropy(probs) -> np.ndarray:
    """``−Σ_c p_c log p_c`` (nats) per input, ``[N]``."""
    p, _ = _check(probs)
    return -np.sum(p * np.log(np.clip(p, _EPS, None)), axis=1)


def classification_metrics(probs, labels, n_bins: int = DEFAULT_ECE_BINS) -> dict:
    """``accuracy``, ``nll``, ``ece`` (``n_bins`` bins) and ``brier`` in one dict."""
    return {"accuracy": accuracy(probs, labels), "nll": nll(probs, labels),
            "ece": ece(probs, labels, n_bins), "brier": brier(probs, labels)}
