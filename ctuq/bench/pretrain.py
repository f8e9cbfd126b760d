"""Pretraining of the educated warm start: a preset's U-net as a post-processor of the FBP.

The educated DIP (Barbano et al. 2022) starts the DIP fit of a scan from
U-net weights trained, supervised, to map the FBP of simulated noisy scans to
their phantoms; the fit then refines them on the scan as a DIP. Here the
training pairs come from the **tuning** split only (:mod:`ctuq.data.splits`:
its phantom families, each image's own noise seed), scanned in every
condition of the calibration benchmark's size (:data:`ctuq.bench.cases.CONDITIONS`),
and the network input is exactly the DIP's: ``op.fbp(y)``
(:func:`ctuq.recon.dip.make_net_input`). Everything is seeded; nothing is
downloaded. :func:`pretrain` returns the network and a record of the run;
:func:`save_half` writes the shipped weights (``ctuq/recon/weights/<preset>.pt``,
float16); how they were made: docs/dip.md §6.1.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

__all__ = ["training_pairs", "pretrain", "save_half"]


def training_pairs(size: int, n_images: int, seed: int = 0, split: str = "tuning",
                   conditions=None) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """``n_images`` (FBP, truth) pairs of ``split``, float32 ``[n, 1, size, size]`` each.

    Image ``k`` is drawn (seeded by ``seed``) from a family of the split, an
    index within it and a condition ``(angles, relative noise)`` of
    ``conditions`` (default: ``CONDITIONS[size]``); its scan uses the image's
    own noise seed (:meth:`ctuq.data.splits.Case.noise_seed`, offset 0).
    Returns the FBPs, the truths and one dict per pair (family, index,
    condition).
    """
    from ctuq.bench.cases import CONDITIONS
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.data.splits import DIGIT_RANGES, FAMILIES, SEEDS_PER_SPLIT, Case

    conds = list(conditions or CONDITIONS[size])
    rng = np.random.default_rng(seed)
    ops = {a: RayTransform(Geometry.parallel(size, a)) for a in {a for a, _ in conds}}
    fams = FAMILIES[split]
    fbps, truths, info, seen = [], [], [], set()
    while len(truths) < n_images:
        fam = fams[int(rng.integers(len(fams)))]
        cap = (DIGIT_RANGES[split][1] - DIGIT_RANGES[split][0]) if fam == "digits" \
            else SEEDS_PER_SPLIT
        index = int(rng.integers(cap))
        if (fam, index) in seen:
            continue
        seen.add((fam, index))
        n_angles, noise = conds[int(rng.integers(len(conds)))]
        case = Case(split, fam, index, size)
        truth = case.image()
        op = ops[n_angles]
        y, _ = simulate_sinogram(truth, op, noise, seed=case.noise_seed(0))
        with torch.no_grad():
            fbps.append(op.fbp(y).float().reshape(1, size, size))
        truths.append(torch.as_tensor(truth, dtype=torch.float32).reshape(1, size, size))
        info.append({"family": fam, "index": index, "n_angles": n_angles, "noise": noise})
    return torch.stack(fbps), torch.stack(truths), info


def pretrain(preset: str, fbp: torch.Tensor, truth: torch.Tensor, *, steps: int = 1000,
             batch: int = 8, lr: float = 2e-3, seed: int = 0, val: tuple | None = None,
             report_every: int = 100, log=None):
    """Train ``preset``'s U-net to map ``fbp`` to ``truth`` (mean squared error, Adam).

    Parameters
    ----------
    preset : str
        U-net preset (:data:`ctuq.models.unet.PRESETS`).
    fbp, truth : Tensor, shape (n, 1, H, W)
        The training pairs (:func:`training_pairs`).
    steps : int
        Adam steps, cosine learning rate from ``lr`` to ``lr / 100``. Default 1000.
    batch : int
        Pairs per step, drawn without replacement per epoch. Default 8.
    lr : float
        Peak learning rate. Default 2e-3.
    seed : int
        Seed of the initial weights and the batch order. Default 0.
    val : (fbp, truth), optional
        Held-out pairs scored (PSNR) every ``report_every`` steps.
    log : callable, optional
        ``log(message)`` at every report.

    Returns
    -------
    model : UNet
        Trained, eval mode, on the CPU.
    record : dict
        Settings, the training-loss and validation-PSNR history, seconds.
    """
    from ctuq.models.unet import build_unet, unet_preset

    model = build_unet(unet_preset(preset), seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * min(1.0, i / steps))))
    gen = torch.Generator().manual_seed(seed)
    order, pos = torch.randperm(len(fbp), generator=gen), 0
    history, t0, running = [], time.perf_counter(), []
    model.train()
    for step in range(1, steps + 1):
        if pos + batch > len(order):
            order, pos = torch.randperm(len(fbp), generator=gen), 0
        idx = order[pos:pos + batch]
        pos += batch
        opt.zero_grad(set_to_none=True)
        loss = (model(fbp[idx]) - truth[idx]).square().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running.append(loss.item())
        if step % report_every == 0 or step == steps:
            entry = {"step": step, "seconds": round(time.perf_counter() - t0, 1),
                     "train_mse": float(np.mean(running))}
            running = []
            if val is not None:
                entry["val_psnr"] = _psnr_mean(model, *val)
                model.train()
            history.append(entry)
            if log is not None:
                log(str(entry))
    model.eval()
    record = {"preset": preset, "steps": steps, "batch": batch, "lr": lr, "seed": seed,
              "train_pairs": len(fbp), "seconds": time.perf_counter() - t0,
              "history": history}
    return model, record


def _psnr_mean(model, fbp, truth) -> float:
    from ctuq.recon.predictive import psnr

    model.eval()
    with torch.no_grad():
        out = model(fbp)
    return float(np.mean([psnr(t[0], o[0]) for t, o in zip(truth, out)]))


def save_half(model, path) -> None:
    """:func:`ctuq.recon.dip.save_weights` with the floating tensors stored as float16.

    Halves the file (a 64² preset: ≈ 0.23 MB); loading casts them back to the
    model's float32.
    """
    from ctuq.recon.dip import save_weights

    class _Half:  # what save_weights reads of a model: its config and state dict
        config = model.config

        @staticmethod
        def state_dict():
            return {k: v.half() if v.is_floating_point() else v
                    for k, v in model.state_dict().items()}

    save_weights(_Half, path)
