#!/usr/bin/env python
"""How ctuq's stages scale with the pixel count (issue 26 item 4; docs/scaling.md).

Prints one JSON document on stdout (progress on stderr). For every size of
``--sizes`` (default 64, 128, 256, 512), each in a fresh subprocess so that
memory peaks do not carry over, with the size's own U-net preset and a
parallel-beam scan of a fixed number of angles (``--angles``, default 60; an
ellipse phantom of the test split, 5 % noise):

- ``operator``: building the ray transform (backend chosen by memory, named);
- ``dip_iteration``: one DIP+TV step (forward, projection, loss, backward,
  Adam), the median over ``--dip-iters`` timed iterations after 2 warm-up
  ones, read from the trainer's per-iteration progress events;
- ``jacobian_pair``: one ``J v`` and one ``Jᵀ u`` through network and
  operator (the unit of every sampler), median of 3;
- ``posterior_sample`` and ``em_step``: one E-step of the real engine (CG
  sampler, g-prior) with a **fixed amount of work**, so that sizes compare:
  a Nyström sketch of rank ``--rank`` (default 50) and exactly
  ``--cg-iters`` CG iterations (tolerance 0) for ``--samples`` samples
  (default 2) and the mode, solved together; time per sample = solve time /
  samples; EM step = the whole E-step (sketch, solve, statistics; the
  MacKay M-step after it is closed-form and takes microseconds);
- ``fit_posterior``: the whole engine call of that E-step (prior set-up
  included);
- peak resident memory (RSS, sampled every 5 ms) per stage (``STAGES``), and
  on CUDA the peak allocated GPU memory.

Each size runs twice (``--allocator both``, the default): with ctuq's
allocator setting (``ctuq.recon.allocator.keep_freed_memory``, what
``ctuq.reconstruct`` does) and with glibc's default, each in its own
process, so that the speed-up is a ratio measured in the same run.

The network is the DIP after the few timed iterations (not converged: the
costs do not depend on the fit). Summary: the log-log slope of each time
against the pixel count (least squares over the sizes, and between the
smallest and the largest) per allocator, the speed-up of ctuq's setting per
size, and the check ``time_per_sample_slope_at_most_1.1`` (ctuq's setting).

Usage::

    python scripts/bench_scaling.py > benchmarks/results/bench_scaling.json          # CPU, 64²–512²
    python scripts/bench_scaling.py --device cuda > bench_scaling_gpu.json
    python scripts/bench_scaling.py --quick                             # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from ctuq.bench.machine import machine
from ctuq.bench.runner import dump_json
from ctuq.bench.scaling import one_size, summarise

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=None, help="default 64,128,256,512 (--quick: 32,64)")
    ap.add_argument("--angles", type=int, default=60)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dip-iters", type=int, default=10)
    ap.add_argument("--rank", type=int, default=50)
    ap.add_argument("--cg-iters", type=int, default=10)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--quick", action="store_true",
                    help="sizes 32, 64; 3 iterations, rank 10, 3 CG iterations")
    ap.add_argument("--allocator", default="both", choices=("both", "ctuq", "system"),
                    help="ctuq's allocator setting, glibc's default, or both (default)")
    ap.add_argument("--one-size", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-allocator", default="ctuq", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.dip_iters, args.rank, args.cg_iters = 3, 10, 3
    args.sizes = args.sizes or ("32,64" if args.quick else "64,128,256,512")
    if args.one_size is not None:       # the child: one size, one JSON line
        print(json.dumps(one_size(args.one_size, args)))
        return 0
    import torch

    allocators = ("ctuq", "system") if args.allocator == "both" else (args.allocator,)
    # glibc's default must really be the default in the "system" child
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    rows, t0 = [], time.perf_counter()
    for size in [int(s) for s in args.sizes.split(",")]:
        for allocator in allocators:
            cmd = [sys.executable, __file__, "--one-size", str(size),
                   "--one-allocator", allocator] + [
                a for a in (argv if argv is not None else sys.argv[1:])]
            cmd += ["--dip-iters", str(args.dip_iters), "--rank", str(args.rank),
                    "--cg-iters", str(args.cg_iters)]
            print(f"bench_scaling: {size}², allocator {allocator} ...", file=sys.stderr,
                  flush=True)
            res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, env=env)
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"bench_scaling: {size}² ({allocator}): DIP it "
                  f"{rows[-1]['dip_iteration_s']:.3f} s, sample "
                  f"{rows[-1]['posterior_sample_s']:.3f} s, "
                  f"peak {rows[-1]['peak_memory_mb']:.0f} MB", file=sys.stderr, flush=True)
    doc = {"script": "scripts/bench_scaling.py", "argv": sys.argv[1:] if argv is None else argv,
           "device": args.device, "threads": args.threads, "angles": args.angles,
           "work_per_sample": {"rank": args.rank, "cg_iterations": args.cg_iters,
                               "samples": args.samples},
           "network": "the DIP after its few timed iterations (costs do not depend on the fit)",
           "machine": machine(args.device), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
           "sizes": rows, "summary": summarise(rows)}
    dump_json(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
