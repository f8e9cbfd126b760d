"""Pretrain a DIP U-net on simulated ellipse phantoms.

The reference pretrains its large network on synthetic ellipses so that the
DIP fit of a real image starts from a sensible post-processing network. Here
each step draws a batch of random ellipse phantoms, simulates noisy sinograms
(parallel beam, Gaussian noise), and trains the U-net to map their FBPs to
the phantoms (``--loss supervised``, mean squared error), or fits each batch
with the DIP loss ``‖A f(FBP) − y‖² + γ TV`` (``--loss dip``).

The weights are written with :func:`ctuq.recon.dip.save_weights`; use them
with ``DIPConfig(..., init_weights=PATH)`` for the same preset. One JSON
document (the settings, the final loss and the output path) goes to stdout.

Usage::

    python scripts/pretrain_dip.py --size 64 --steps 200 --out weights/dip-64.pt
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import numpy as np
import torch

from ctuq.data import phantoms
from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.models.unet import build_unet, preset_name_for_size
from ctuq.recon.dip import DIPConfig, dip_tv_loss, resolve_device, save_weights

log = logging.getLogger("pretrain_dip")


def make_batch(op, size, batch, step, seed, noise_level):
    """Ellipse phantoms ``[B,1,H,W]``, their noisy sinograms and FBPs (seeded per step)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    xs = np.stack([phantoms.ellipses(size, seed=int(s))
                   for s in torch.randint(0, 2**31 - 1, (batch,), generator=gen)])
    x = torch.as_tensor(xs, dtype=torch.float32, device=op.device)[:, None]
    with torch.no_grad():
        clean = op.A(x)
        sigma = noise_level * clean.abs().mean(dim=(-2, -1), keepdim=True)
        y = clean + sigma * torch.randn(clean.shape, generator=gen).to(clean.device)
        fbp = op.fbp(y)
    return x, y, fbp


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=64, help="image side (default 64)")
    p.add_argument("--preset", default=None,
                   help="U-net preset (default: the one for --size)")
    p.add_argument("--angles", type=int, default=None,
                   help="projection angles (default 20 at 28², else 60)")
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--batch", type=int, default=4, help="phantoms per step (default 4)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--noise", type=float, default=0.05, help="relative noise level")
    p.add_argument("--loss", choices=("supervised", "dip"), default="supervised")
    p.add_argument("--tv-weight", type=float, default=None,
                   help="γ for --loss dip (default: the preset's DIP default rule "
                        "γ = factor · σ · r with the batch's mean noise std σ)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None,
                   help="weights file (default dip_pretrained_<preset>.pt)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(max(1, min(2, args.threads)))

    preset = args.preset or preset_name_for_size(args.size)
    n_angles = args.angles or (20 if args.size <= 32 else 60)
    out = args.out or f"dip_pretrained_{preset}.pt"
    device = resolve_device(args.device)
    op = RayTransform(Geometry.parallel(args.size, n_angles), device=device)
    net = build_unet(preset, seed=args.seed, device=device)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps,
                                                       eta_min=0.01 * args.lr)
    dip_cfg = DIPConfig.preset_defaults(preset, tv_weight=args.tv_weight)
    net.train()
    t0 = time.perf_counter()
    losses = []
    for step in range(args.steps):
        x, y, fbp = make_batch(op, args.size, args.batch, step, args.seed, args.noise)
        out_img = net(fbp)
        if args.loss == "supervised":
            loss = (out_img - x).square().mean()
        else:
            sigma = args.noise * float(op.A(x).abs().mean())
            gamma = dip_cfg.resolve_tv_weight(y[0], op, noise_std=sigma)
            loss = dip_tv_loss(out_img, y, op, gamma)[0] / args.batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % max(1, args.steps // 10) == 0 or step + 1 == args.steps:
            log.info("step %d/%d loss %.5g", step + 1, args.steps,
                     float(np.mean(losses[-max(1, args.steps // 10):])))
    save_weights(net, out)
    wall = time.perf_counter() - t0
    print(json.dumps({
        "weights": out, "preset": preset, "image_size": args.size, "n_angles": n_angles,
        "steps": args.steps, "batch": args.batch, "lr": args.lr, "loss_type": args.loss,
        "noise_level": args.noise, "seed": args.seed, "device": str(device),
        "first_loss": losses[0], "final_loss": float(np.mean(losses[-10:])),
        "wall_time": wall,
    }, indent=2))


if __name__ == "__main__":
    main()
