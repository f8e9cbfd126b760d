"""The continued DIP fit at 30 angles / 1 % noise, validation split (docs/speed.md).

Fits, per scan: the reference (1,000 iterations from the seeded start), the
held-out fit (kept angles, the default held-out split), and four
continuations of it on all angles for half the iterations on the tail of the
schedule: with the FBP of all angles as input (what ctuq does), with the
held-out fit's own input, the same with 50 warm-up steps, and the same at a
tenth of the rate. Every fit runs on the data divided by their scale, as a
reconstruction does (``normalize``). Prints one JSON line of PSNRs (dB) per
scan and writes all of them to ``--out``.

Usage::

    python scripts/diag_continued_fit.py
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from ctuq.bench.cases import _case, simulate
from ctuq.bench.dip_vs_tv import fitted_data
from ctuq.recon.config import UncertaintyConfig
from ctuq.recon.dip import DIPConfig, fit_dip
from ctuq.recon.model_error.heldout import heldout_fit
from ctuq.recon.model_error.shared import continued_config
from ctuq.recon.predictive import psnr as image_psnr

SCANS = (("digits", 0), ("rectangles", 0), ("ellipses", 0))


def one_scan(family: str, index: int, size: int, n_angles: int, noise: float) -> dict:
    """The PSNR of every fit of one validation scan (see the module docstring)."""
    sc = simulate(_case("validation", family, index, size, n_angles, noise))
    scale, y, sigma = fitted_data(sc)  # the data as ctuq.reconstruct fits them
    cfg = DIPConfig.for_image_size((size, size), progress_every=10**6)
    unc = UncertaintyConfig()

    def psnr(fit) -> float:
        return image_psnr(sc.truth, fit.reconstruction.detach().reshape(size, size) * scale)

    row = {"case": f"{family}/{index}",
           "reference": psnr(fit_dip(y, sc.op, cfg, noise_std=sigma))}
    _, held = heldout_fit(y, sc.op, cfg, every=unc.heldout_every, min_out=unc.heldout_min_out,
                          noise_std=sigma)
    row["heldout_fit_on_kept"] = psnr(held)
    tail = continued_config(cfg, 0.5)
    same_input = {"net_input": held.net_input}
    for name, config, extra in (("tail_new_input", tail, {}),
                                ("tail_same_input", tail, same_input),
                                ("tail_same_input_warmup50", tail.with_(warmup=50), same_input),
                                ("tail_same_input_lr0.1x", tail.with_(lr=tail.lr * 0.1),
                                 same_input)):
        row[name] = psnr(fit_dip(y, sc.op, config, noise_std=sigma,
                                 init_state=held.state_dict, **extra))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--angles", type=int, default=30)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--out", default="benchmarks/results/continued_fit_low_noise_validation_64.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for family, index in SCANS:
        row = one_scan(family, index, args.size, args.angles, args.noise)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                          for k, v in row.items()}), flush=True)
        rows.append(row)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
