"""MAP training of the benchmark classifiers (docs/method.md §11)."""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor, nn

from ctuq.errors import InputError
from ctuq.progress import check_cancel, emit_progress

__all__ = ["train_map"]


def train_map(model: nn.Module, x: Tensor, y: Tensor, *, epochs: int = 150,
              lr: float = 3e-3, batch_size: int = 64, prior_precision: float = 1.0,
              seed: int = 0, progress=None, cancel=None) -> dict:
    """Fit ``model`` in place by Adam on ``mean CE + prior_precision/(2N) ‖θ‖²``.

    Parameters
    ----------
    model : nn.Module
        Images ``[N, 1, H, W]`` → logits ``[N, C]``; dropout, if any, is
        active during training.
    x : Tensor, shape (N, 1, H, W)
    y : Tensor, shape (N,)
    epochs : int, optional
        Default 150.
    lr : float, optional
        Peak learning rate, cosine-decayed to 0. Default 3e-3.
    batch_size : int, optional
        Default 64.
    prior_precision : float, optional
        Isotropic Gaussian prior precision on all parameters during training
        (weight decay ``prior_precision / N`` on the mean loss). Default 1.
    seed : int, optional
        Seeds the mini-batch order and dropout masks. Default 0.
    progress, cancel : callable, optional
        Stage ``'train'``, one step per epoch.

    Returns
    -------
    dict
        ``loss`` (per-epoch mean training objective), ``seconds``.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0 or prior_precision < 0:
        raise InputError("epochs, batch_size and lr must be positive, prior_precision >= 0",
                         field="train")
    gen = torch.Generator().manual_seed(int(seed))
    n = x.shape[0]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * math.ceil(n / batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    wd = prior_precision / n
    history, t0 = [], time.perf_counter()
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        for ep in range(epochs):
            check_cancel(cancel, "training")
            perm = torch.randperm(n, generator=gen)
            total = 0.0
            for i in range(0, n, batch_size):
                idx = perm[i:i + batch_size]
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
                reg = 0.5 * wd * sum(p.square().sum() for p in model.parameters())
                opt.zero_grad()
                (loss + reg).backward()
                opt.step()
                sched.step()
                total += float((loss + reg).detach()) * idx.numel()
            history.append(total / n)
            emit_progress(progress, "train", ep + 1, epochs, f"loss {history[-1]:.4f}")
    model.eval()
    return {"loss": history, "seconds": time.perf_counter() - t0}
