"""What Jacobian products of TF32 accuracy do to the posterior, emulated on the CPU.

On a GPU, torch lets cuDNN compute float32 convolutions in TF32 (a 10-bit
mantissa). ``J v`` and ``Jᵀ u`` are then no longer exact transposes of each
other; ``ctuq.posterior.linearize.full_float32`` now turns TF32 off for them.
This script shows on the CPU what the inexact products did: the speed
benchmark's scan (``ctuq.bench.speed.one_run``, default settings) is
reconstructed with exact float32 products, then with the products rounded
to ``b`` mantissa bits (10: TF32's), the DIP fits made once and replayed to
every variant (the uncertainty stage is all that differs). ``--where
outputs`` rounds every output of ``Linearization.jvp`` and ``.vjp`` once;
``--where operands`` rounds, inside the products, the input of every
convolution of the linearised network and the tangent and cotangent that
pass through it (nearer TF32, which rounds the operands of every
convolution; the weights and their tangents stay exact here).

One JSON document on stdout: per variant the mean posterior std, the mean
std, ±1σ / ±2σ coverage, the CG iterations per EM step and the seconds.

Usage::

    python scripts/diag_tf32_products.py --size 64 --bits 10,8
    python scripts/diag_tf32_products.py --size 64 --bits 10 --where operands
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from ctuq.bench.speed import SCAN, one_run
from ctuq.posterior.linearize import Linearization


def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` (float32) rounded to ``bits`` mantissa bits (nearest, ties away from zero)."""
    drop = 23 - int(bits)
    if drop <= 0:
        return x
    i = x.detach().contiguous().view(torch.int32)
    i = (i + (1 << (drop - 1))) & ~((1 << drop) - 1)
    return i.view(torch.float32)


def rounding_function(bits: int):
    """``x ↦ round_mantissa(x, bits)`` as an autograd function whose tangents (forward
    mode) and cotangents (reverse mode) are rounded too; usable under ``torch.func``."""
    class Round(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return round_mantissa(x, bits)

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, grad):
            return round_mantissa(grad, bits)

        @staticmethod
        def jvp(ctx, tangent):
            return round_mantissa(tangent, bits)

    return Round


@contextlib.contextmanager
def rounded_operands(bits: int | None):
    """Every ``Linearization`` made while the block runs rounds the input of each
    convolution of its network (and the tangents and cotangents through it)."""
    if bits is None:
        yield
        return
    init, rnd, hooks = Linearization.__init__, rounding_function(bits), []

    def hooked_init(self, model, *args, **kwargs):
        convs = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
        hooks.extend(m.register_forward_pre_hook(
            lambda _mod, a: (rnd.apply(a[0]),) + tuple(a[1:])) for m in convs)
        init(self, model, *args, **kwargs)

    Linearization.__init__ = hooked_init
    try:
        yield
    finally:
        Linearization.__init__ = init
        for h in hooks:
            h.remove()


@contextlib.contextmanager
def rounded_products(bits: int | None):
    """``Linearization.jvp`` / ``.vjp`` with their outputs rounded while the block runs."""
    if bits is None:
        yield
        return
    jvp, vjp = Linearization.jvp, Linearization.vjp
    Linearization.jvp = lambda self, v: round_mantissa(jvp(self, v), bits)
    Linearization.vjp = lambda self, u: round_mantissa(vjp(self, u), bits)
    try:
        yield
    finally:
        Linearization.jvp, Linearization.vjp = jvp, vjp


KEEP = ("wall_s", "mean_std", "mean_posterior_std", "mean_model_error_std", "coverage_1sigma",
        "coverage_2sigma", "psnr", "em_steps", "solver_iterations", "stages")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--bits", default="10,8", help="mantissa bits of the rounded variants")
    ap.add_argument("--where", choices=("outputs", "operands"), default="outputs",
                    help="round each product's output, or every convolution's input in it")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    rounded = rounded_products if args.where == "outputs" else rounded_operands
    variants = [("exact float32", None)] + [(f"{args.where} rounded to {b} bits", int(b))
                                            for b in args.bits.split(",") if b]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        fits = Path(tmp) / "dip_fits.pt"
        for i, (name, bits) in enumerate(variants):
            print(f"tf32 diag: {args.size}² {name} ...", file=sys.stderr, flush=True)
            with rounded(bits):
                row = one_run(args.size, threads=args.threads,
                              dip_fits={"path": fits, "record": i == 0})
            rows[name] = {"mantissa_bits": bits, **{k: row[k] for k in KEEP}}
    print(json.dumps({"script": "scripts/diag_tf32_products.py", "argv": sys.argv[1:],
                      "scan": {**SCAN, "size": args.size},
                      "machine": {"cpu": platform.processor() or platform.machine(),
                                  "torch": torch.__version__},
                      "note": "validation scan; DIP fits shared by every variant",
                      "variants": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
