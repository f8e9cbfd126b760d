#!/usr/bin/env python
"""Pretrain a preset's U-net for the educated warm start (tuning split only) and write its weights.

Supervised: the network maps the FBP of simulated noisy scans (the tuning
split's families and the size's calibration conditions, each image's own
noise seed) to their phantoms (``ctuq.bench.pretrain``). The weights go to
``--out`` in float16 (default ``ctuq/recon/weights/<preset>.pt``, what
``dip.warm_start = "shipped"`` loads). One JSON document on stdout: the
settings, the loss history, the PSNR on ``--holdout`` held-out tuning pairs.
Seeded and offline: a rerun with the same arguments on the same machine
writes the same weights.

Usage::

    python scripts/pretrain_warm_start.py --size 64 --pairs 1024 --steps 1200
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from ctuq.bench import pretrain as P
from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json, repo_relative
from ctuq.models.unet import preset_name_for_size

log = logging.getLogger("pretrain_warm_start")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=1024, help="training pairs")
    ap.add_argument("--holdout", type=int, default=32, help="held-out pairs (PSNR)")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="weights file (default ctuq/recon/weights/<preset>.pt)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    preset = preset_name_for_size(args.size)
    out = Path(args.out or Path(__file__).resolve().parents[1] / "ctuq" / "recon" / "weights"
               / f"{preset}.pt")
    t0 = time.perf_counter()
    fbp, truth, info = P.training_pairs(args.size, args.pairs + args.holdout, seed=args.seed)
    n = args.pairs
    log.info("%d pairs in %.1f s", len(info), time.perf_counter() - t0)
    model, record = P.pretrain(preset, fbp[:n], truth[:n], steps=args.steps, batch=args.batch,
                               lr=args.lr, seed=args.seed, val=(fbp[n:], truth[n:]),
                               log=log.info)
    P.save_half(model, out)
    families = sorted({i["family"] for i in info})
    dump_json({"script": "scripts/pretrain_warm_start.py",
               "argv": sys.argv[1:] if argv is None else argv, "split": "tuning",
               "families": {f: sum(i["family"] == f for i in info[:n]) for f in families},
               "out": repo_relative(out), "bytes": out.stat().st_size,
               "machine": machine("cpu"), "threads": args.threads,
               "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
               **record})
    return 0


if __name__ == "__main__":
    sys.exit(main())
