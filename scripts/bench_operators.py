#!/usr/bin/env python
"""Benchmark the ray-transform backends; prints one JSON document on stdout.

For each problem (28² / 20 angles, 128² / 180 angles, 256² / 360 angles by
default) and each backend (``matrix``: our torch CSR system matrix;
``astra``: ODL's RayTransform with ASTRA), the median over repeats of:

- ``forward_ms``: one image, ``A x``;
- ``adjoint_ms``: one sinogram, ``A^T y``;
- ``batch16_fwd_bwd_ms``: a batch of 16 images, ``A x`` then autograd
  backward (``A^T``) of a squared loss;

and the ratios ``astra / matrix`` measured in the same run, plus the cost of
building the matrix (cold, and from the disk cache).

Usage::

    python scripts/bench_operators.py [--sizes 28:20,128:180,256:360] [--repeats 7]
                                      [--device cpu|cuda] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

from ctuq.bench.machine import machine


def _median_ms(fn, repeats: int, sync) -> float:
    fn()  # warm-up
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="28:20,128:180,256:360",
                        help="comma-separated SIZE:ANGLES problems")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    os.environ.setdefault("CTUQ_CACHE_DIR", tempfile.mkdtemp(prefix="ctuq-bench-"))
    from ctuq.data import operators
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform

    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize()) if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    results = []
    for item in args.sizes.split(","):
        size, n_angles = (int(v) for v in item.split(":"))
        geometry = Geometry.parallel(size, n_angles)
        entry = {"image": size, "angles": n_angles, "detector": geometry.n_detector}
        t0 = time.perf_counter()
        mat = operators.system_matrix(geometry, use_cache=True)
        entry["matrix_build_cold_s"] = time.perf_counter() - t0
        entry["matrix_nnz"] = int(mat.nnz)
        del mat
        t0 = time.perf_counter()
        ops = {"matrix": RayTransform(geometry, backend="matrix", device=device)}
        entry["matrix_load_cached_s"] = time.perf_counter() - t0
        ops["astra"] = RayTransform(geometry, backend="astra", device=device)
        x = torch.rand(geometry.image_shape, generator=gen).to(device)
        y = torch.rand(geometry.range_shape, generator=gen).to(device)
        xb = torch.rand(16, 1, *geometry.image_shape, generator=gen).to(device)
        for name, op in ops.items():
            def fwd_bwd(op=op):
                v = xb.clone().requires_grad_(True)
                op.A(v).square().sum().backward()
            reps = args.repeats if (name == "matrix" or size <= 128) else max(3, args.repeats // 2)
            entry[name] = {
                "forward_ms": _median_ms(lambda op=op: op.A(x), reps, sync),
                "adjoint_ms": _median_ms(lambda op=op: op.A_adjoint(y), reps, sync),
                "batch16_fwd_bwd_ms": _median_ms(fwd_bwd, reps, sync),
            }
            print(f"{size}²/{n_angles}: {name} {entry[name]}", file=sys.stderr)
        entry["speedup_astra_over_matrix"] = {
            k: entry["astra"][k] / entry["matrix"][k] for k in entry["matrix"]}
        results.append(entry)
        del ops

    by_size = {r["image"]: r for r in results}
    targets = {}
    if 128 in by_size:
        s = by_size[128]["speedup_astra_over_matrix"]
        targets = {"forward_128_at_least_4x": s["forward_ms"] >= 4,
                   "batch16_fwd_bwd_128_at_least_10x": s["batch16_fwd_bwd_ms"] >= 10}
    json.dump({
        "benchmark": "ray transform backends",
        "machine": {**machine("cpu"), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "device": str(device),
                    "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None},
        "repeats": args.repeats,
        "results": results,
        "targets": targets,
    }, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
