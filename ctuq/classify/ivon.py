"""IVON for the image classifiers: variational training and the Monte-Carlo predictive.

Method ``ivon`` of the classification benchmark (docs/ivon.md).

Training (:func:`train_ivon`)
    ``ivon.IVON`` on the mini-batch **mean** cross-entropy (the mean negative
    log-likelihood per example), ``ess = N / T`` (``N`` training images, data
    temperature ``T``, default 1) and ``weight_decay = α T / N``: the learned
    ``q(θ) = N(m, diag v)`` is the mean-field approximation of
    ``p(θ | D) ∝ Π_n p(y_n | x_n, θ)^{1/T} · N(θ; 0, α⁻¹ I)``, with the same
    isotropic prior precision ``α`` as MAP training
    (:func:`ctuq.classify.training.train_map`'s ``prior_precision``, weight
    decay ``α/N`` on the mean loss), so MAP and IVON train the same model.
Predictive (:func:`ivon_predictive`)
    ``p(y | x) ≈ (1/S) Σ_s softmax f(x, θ_s)``, ``θ_s ~ q``, with
    ``S = DEFAULT_PREDICTIVE_SAMPLES`` (64, as the sampled LLA's predictive)
    unless told otherwise; :func:`mean_predictive` is ``softmax f(x, m)``.
``ivon+lla`` (phase 2, not built here)
    The linearised Laplace around the IVON mean ``m`` instead of the MAP
    ``θ̂``: train with :func:`train_ivon` (its model holds ``m``), then hand
    the model to the classification LLA engine exactly as after MAP training
    (``ClassifierLinearization`` → prior → EM → samples → predictive). It is
    cheap: the IVON training costs about as much as MAP's (one forward and
    backward per step, plus ``O(P)`` optimiser work) and the LLA part is
    unchanged, so ``ivon+lla`` ≈ ``ivon`` + ``lla-sampled`` without its MAP
    training. The IVON Hessian ``h`` could also seed the prior or the
    Nyström preconditioner; that is not planned.

Examples
--------
>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
>>> x, y = torch.randn(30, 1, 2, 2), torch.randint(0, 3, (30,))
>>> clf = train_ivon(net, x, y, epochs=2, batch_size=10)
>>> p = clf.predict(x, n_samples=8)
>>> tuple(p.shape), bool(torch.allclose(p.sum(1), torch.ones(30, dtype=p.dtype)))
((30, 3), True)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from ctuq.errors import InputError
from ctuq.models.ivon import DiagonalGaussian, IVONSettings, evaluate_under_samples
from ctuq.models.ivon import train_ivon as _train_ivon

__all__ = ["IVONClassifier", "train_ivon", "ivon_logit_samples", "ivon_predictive",
           "mean_predictive", "DEFAULT_PREDICTIVE_SAMPLES", "DEFAULTS",
           "DATASET_SETTINGS", "settings_for"]

log = logging.getLogger(__name__)

#: Weight samples of the Monte-Carlo predictive unless told otherwise.
DEFAULT_PREDICTIVE_SAMPLES = 64

#: Training defaults of :func:`train_ivon` (docs/ivon.md: chosen on the digits
#: validation splits of seeds 0-2 by the MC-predictive NLL).
DEFAULTS = dict(epochs=150, batch_size=64, lr=2.0, hess_init=10.0, beta2=0.999,
                prior_precision=1.0, temperature=1.0, mc_samples=1)

#: Settings chosen on a data set's validation split where they differ from
#: :data:`DEFAULTS` (docs/ivon.md §7.3, benchmarks/results/bench_classify_ivon_val.json:
#: Fashion-MNIST diverges at the digits' ``lr = 2`` and needs a tempered
#: likelihood, ``T = 0.1``, to beat the MAP's validation NLL).
DATASET_SETTINGS = {"fmnist": dict(lr=0.03, hess_init=0.03, temperature=0.1)}


def settings_for(dataset: str, **given) -> dict:
    """``lr``, ``hess_init`` and ``temperature`` for ``dataset``; a given non-None value wins.

    >>> settings_for("fmnist", lr=None, hess_init=None, temperature=None)["lr"]
    0.03
    >>> settings_for("digits", lr=1.0)["lr"]
    1.0
    """
    base = {k: DEFAULTS[k] for k in ("lr", "hess_init", "temperature")}
    base.update(DATASET_SETTINGS.get(str(dataset).lower(), {}))
    base.update({k: v for k, v in given.items() if v is not None})
    return base


@dataclass
class IVONClassifier:
    """A classifier trained by :func:`train_ivon`.

    Attributes
    ----------
    model : nn.Module
        Holds the posterior-mean weights ``m``; eval mode.
    posterior : DiagonalGaussian
        ``q`` over the trainable parameters (``parameters()`` order).
    settings : IVONSettings
        The optimiser's settings (``ess``, ``weight_decay``, ...).
    loss : list of float
        Mean training loss per epoch (at the sampled weights).
    seconds : float
        Training time.
    """

    model: nn.Module
    posterior: DiagonalGaussian
    settings: IVONSettings
    loss: list
    seconds: float

    def predict(self, x: Tensor, n_samples: int = DEFAULT_PREDICTIVE_SAMPLES, *,
                seed: int = 0) -> Tensor:
        """:func:`ivon_predictive` of this classifier, ``[N, C]`` float64."""
        return ivon_predictive(self.model, self.posterior, x, n_samples, seed=seed)

    def predict_mean(self, x: Tensor) -> Tensor:
        """:func:`mean_predictive`, ``[N, C]`` float64."""
        return mean_predictive(self.model, x)


def train_ivon(model: nn.Module, x: Tensor, y: Tensor, *,
               epochs: int = DEFAULTS["epochs"], batch_size: int = DEFAULTS["batch_size"],
               lr: float = DEFAULTS["lr"], hess_init: float = DEFAULTS["hess_init"],
               beta2: float = DEFAULTS["beta2"],
               prior_precision: float = DEFAULTS["prior_precision"],
               temperature: float = DEFAULTS["temperature"],
               mc_samples: int = DEFAULTS["mc_samples"], seed: int = 0,
               progress=None, cancel=None) -> IVONClassifier:
    """Train ``model`` in place with IVON on the mean cross-entropy.

    Parameters
    ----------
    model : nn.Module
        Images ``[N, 1, H, W]`` → logits ``[N, C]``; no dropout needed.
    x : Tensor, shape (N, 1, H, W)
    y : Tensor, shape (N,)
    epochs, batch_size : int
        Passes over the data (a seeded permutation each) and mini-batch size.
        Defaults 150 and 64 (as MAP training).
    lr : float
        Peak learning rate, cosine-decayed to 0. Default 2 (docs/ivon.md).
    hess_init : float
        IVON's initial Hessian ``h₀``. Default 10.
    beta2 : float
        Hessian averaging. Default 0.999.
    prior_precision : float
        ``α`` of the isotropic Gaussian prior. Default 1 (MAP's default).
    temperature : float
        ``T`` of the likelihood (``ess = N/T``). Default 1.
    mc_samples : int
        Weight samples per step. Default 1.
    seed : int
        Seeds the mini-batch order and the weight samples.
    progress, cancel : callable, optional
        Stage ``'train'``, one step per epoch (see ``ctuq.progress``).

    Returns
    -------
    IVONClassifier
    """
    from ctuq.progress import emit_progress

    n = int(x.shape[0])
    if n < 1 or y.shape[0] != n:
        raise InputError(f"{y.shape[0]} labels for {n} images", field="labels")
    if int(epochs) < 1 or int(batch_size) < 1:
        raise InputError("epochs and batch_size must be >= 1", field="train")
    settings = IVONSettings.for_posterior(n, prior_precision, temperature, lr=lr,
                                          hess_init=hess_init, beta2=beta2,
                                          mc_samples=mc_samples)
    per_epoch = math.ceil(n / int(batch_size))
    steps = int(epochs) * per_epoch
    gen = torch.Generator().manual_seed(int(seed))
    order: list[Tensor] = []
    epoch_loss = np.zeros(int(epochs))

    def loss_fn(step: int) -> Tensor:
        ep, b = divmod(step, per_epoch)
        if len(order) <= ep:  # one seeded permutation per epoch, drawn in order
            order.append(torch.randperm(n, generator=gen))
        idx = order[ep][b * int(batch_size):(b + 1) * int(batch_size)]
        return nn.functional.cross_entropy(model(x[idx]), y[idx])

    def on_step(step: int, loss: float) -> None:
        ep, b = divmod(step, per_epoch)
        size = min(int(batch_size), n - b * int(batch_size))
        epoch_loss[ep] += loss * size / n
        if b == per_epoch - 1:
            emit_progress(progress, "train", ep + 1, int(epochs), f"loss {epoch_loss[ep]:.4f}")

    fit = _train_ivon(model, loss_fn, settings, steps, seed=seed, on_step=on_step,
                      cancel=cancel)
    log.info("IVON classifier: %d epochs, %d steps, %.1f s, final loss %.4f", epochs, steps,
             fit.seconds, epoch_loss[-1])
    return IVONClassifier(model=model, posterior=fit.posterior, settings=settings,
                          loss=epoch_loss.tolist(), seconds=fit.seconds)


@torch.no_grad()
def ivon_logit_samples(model: nn.Module, posterior: DiagonalGaussian, x: Tensor,
                       n_samples: int = DEFAULT_PREDICTIVE_SAMPLES, *, seed: int = 0) -> Tensor:
    """Logits under ``n_samples`` weight draws ``θ_s ~ q``, ``[S, N, C]`` float64 (eval mode)."""
    model.eval()
    return evaluate_under_samples(model, posterior, lambda m: m(x).double(), n_samples,
                                  seed=seed)


def ivon_predictive(model: nn.Module, posterior: DiagonalGaussian, x: Tensor,
                    n_samples: int = DEFAULT_PREDICTIVE_SAMPLES, *, seed: int = 0) -> Tensor:
    """Monte-Carlo predictive ``(1/S) Σ_s softmax f(x, θ_s)``, ``[N, C]`` float64.

    Parameters
    ----------
    model : nn.Module
        The classifier (its weights are restored after sampling).
    posterior : DiagonalGaussian
        ``q`` over ``model``'s trainable parameters.
    x : Tensor, shape (N, 1, H, W)
    n_samples : int
        ``S``. Default :data:`DEFAULT_PREDICTIVE_SAMPLES` (64).
    seed : int
        Seed of the draws (the same seed gives the same ``θ_s`` for every ``x``).
    """
    return torch.softmax(ivon_logit_samples(model, posterior, x, n_samples, seed=seed),
                         -1).mean(0)


@torch.no_grad()
def mean_predictive(model: nn.Module, x: Tensor) -> Tensor:
    """``softmax f(x, m)`` at the posterior-mean weights the model holds, ``[N, C]`` float64."""
    model.eval()
    return torch.softmax(model(x).double(), -1)
