#!/usr/bin/env python
"""One DIP+TV iteration: the plain loop against the CUDA-graph replay (docs/scaling.md §5).

Prints one JSON document on stdout. For every size of ``--sizes`` (default
64 and 256), with the size's U-net preset, the scan of
``bench_speed`` (a validation-split ellipse phantom, 60 angles, 5 % noise) and ``--iterations`` steps
(default 300): the time per iteration of :func:`ctuq.recon.dip.fit_dip` with
``cuda_graph = False`` (the host launches every kernel) and ``True`` (one
graph replay per iteration), each as (time of ``n`` iterations − time of 10)
/ (``n`` − 10), so set-up and capture cancel; their ratio; the largest
difference of the two fits' loss histories (relative) and images (absolute)
beside the same differences between two plain fits (the control: GPU kernels
are not deterministic and a fit amplifies round-off), and the PSNR of each. On the CPU the graph does not
apply and only the plain loop is timed.

On every device, ``flat_vs_per_tensor``: one DIP step (U-net forward and
backward, the DIP+TV loss, the best-iterate copy, clipping, Adam) as the plain
loop runs it, over weights and gradients in two buffers
(:class:`ctuq.recon.flat_parameters.FlatParameters`), against the same step over
the 72 (64²) weight tensors one by one as torch's optimiser and clipping take
them: milliseconds per step of each (medians of ``--repeats`` alternating
timings of ``--iterations`` steps), their ratio, and whether the two give the
same weights bit for bit after the steps.

``speed_probe``: how fast the machine ran (:func:`ctuq.bench.machine.speed_probe`),
so that step times of two days can be told apart from a slow day of the machine.

Usage::

    python scripts/bench_dip_step.py --device cuda > benchmarks/results/bench_dip_step_gpu.json
    python scripts/bench_dip_step.py --sizes 64 --iterations 60      # CPU, seconds
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from ctuq.bench.cases import _case, simulate
from ctuq.bench.machine import machine, speed_probe, sync
from ctuq.bench.runner import dump_json
from ctuq.bench.speed import SCAN
from ctuq.models.unet import build_unet
from ctuq.recon import predictive
from ctuq.recon.dip import DIPConfig, dip_tv_loss, fit_dip, make_net_input
from ctuq.recon.flat_parameters import FlatParameters


def time_fit(y, op, config, n: int, device, **noise) -> tuple[float, dict, object]:
    """Seconds per iteration (n iterations minus 10), the two fits' seconds, and the n-iteration fit.

    The difference is a timing and can come out negative when ``n`` is close
    to 10 on a busy machine; the benchmark's default ``n`` (300) keeps it far
    above the noise.
    """
    seconds = {}
    for count in (10, n):
        sync(device)
        t = time.perf_counter()
        result = fit_dip(y, op, config.with_(iterations=count), **noise)
        sync(device)
        seconds[count] = time.perf_counter() - t
    return (seconds[n] - seconds[10]) / (n - 10), seconds, result


def differences(a, b) -> dict:
    """The largest relative difference of two fits' loss histories, and of their images."""
    la, lb = a.loss_history["loss"], b.loss_history["loss"]
    return {"max_relative_loss": float(np.max(np.abs(la - lb) / np.abs(la))),
            "max_image": float((a.reconstruction - b.reconstruction).abs().max())}


def psnr(fit, truth) -> float:
    return float(predictive.psnr(truth, fit.reconstruction.detach().cpu().numpy()))


#: Untimed steps before the timed ones.
_WARMUP = 10


def steps(model, net_input, y, op, gamma, n: int, flat: bool) -> float:
    """Seconds per step of ``n`` DIP steps (the plain loop's work, after
    :data:`_WARMUP` untimed ones), the weights over two buffers (``flat``) or tensor
    by tensor as torch takes them."""
    if flat:
        params = FlatParameters(model)
        opt = torch.optim.Adam(params.parameters(), lr=1e-3)
        best_flat = params.weights.clone()
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
        live = model.state_dict()
        best = {k: v.clone() for k, v in live.items()}
    for i in range(n + _WARMUP):
        if i == _WARMUP:  # the first steps allocate: not timed
            sync(net_input.device)
            t = time.perf_counter()
        if flat:
            params.zero_grad()
        else:
            opt.zero_grad(set_to_none=True)
        loss = dip_tv_loss(model(net_input), y, op, gamma)[0]
        loss.backward()
        if flat:
            best_flat.copy_(params.weights)
            params.clip_grad_norm_(1.0)
        else:
            for dst, src in zip(best.values(), live.values()):
                dst.copy_(src)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
    sync(net_input.device)
    seconds = (time.perf_counter() - t) / n
    if flat:
        params.release()
    return seconds


def flat_vs_per_tensor(y, op, config, noise_std, n: int, repeats: int, device) -> dict:
    """The step over two buffers against the step tensor by tensor (module docstring)."""
    net_input = make_net_input(y, op, config, device)
    gamma = config.resolve_tv_weight(y, op, noise_std)
    fresh = lambda: build_unet(config.unet_config(), seed=0, device=device)  # noqa: E731
    times = {"flat": [], "per_tensor": []}
    for _ in range(repeats):  # alternating, so that a busy spell hits both
        for name in times:
            times[name].append(steps(fresh(), net_input, y, op, gamma, n, name == "flat"))
    a, b = fresh(), fresh()
    steps(a, net_input, y, op, gamma, n, True)
    steps(b, net_input, y, op, gamma, n, False)
    same = all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    return {"weights": sum(p.numel() for p in a.parameters()),
            "tensors": len(list(a.parameters())), "steps": n, "repeats": repeats,
            "flat_ms_per_step": ms["flat"], "per_tensor_ms_per_step": ms["per_tensor"],
            "speedup": ms["per_tensor"] / ms["flat"], "bit_identical": same}


def one_size(size: int, n: int, device, repeats: int = 5) -> dict:
    scan = simulate(_case(SCAN["split"], SCAN["family"], SCAN["index"], size, SCAN["n_angles"],
                          SCAN["noise"]))  # bench_speed's scan
    y, op = scan.y, scan.op.to(device)
    config = DIPConfig.for_image_size(size).with_(device=str(device), progress_every=10**6)
    noise = {"noise_std": scan.sigma}
    fit_dip(y, op, config.with_(iterations=5), **noise)  # kernels, cuSPARSE and cuDNN warmed up
    plain_s, fits_s, plain = time_fit(y, op, config.with_(cuda_graph=False), n, device, **noise)
    row = {"size": size, "iterations": n, "plain_ms_per_iteration": 1e3 * plain_s,
           "plain_fit_seconds": {str(k): v for k, v in fits_s.items()},
           "flat_vs_per_tensor": flat_vs_per_tensor(y.to(device), op, config, scan.sigma,
                                                    n, repeats, device)}
    if device.type == "cuda":
        graph_s, _, graph = time_fit(y, op, config.with_(cuda_graph=True), n, device, **noise)
        # the control: the plain loop against itself (cuDNN and sparse kernels are not
        # deterministic on a GPU, and the fit amplifies round-off)
        again = fit_dip(y, op, config.with_(cuda_graph=False, iterations=n), **noise)
        row.update(graph_ms_per_iteration=1e3 * graph_s, speedup=plain_s / graph_s,
                   graph_vs_plain=differences(plain, graph),
                   plain_vs_plain=differences(plain, again),
                   psnr={"plain": psnr(plain, scan.truth), "graph": psnr(graph, scan.truth),
                         "plain_again": psnr(again, scan.truth)},
                   peak_gpu_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30)
    print(f"{size}: {row}", file=sys.stderr, flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=5,
                    help="alternating timings of the flat and per-tensor steps (median)")
    args = ap.parse_args(argv)
    if args.iterations <= 10:
        ap.error("--iterations must be above 10")
    device = torch.device(args.device)
    rows = [one_size(s, args.iterations, device, args.repeats) for s in args.sizes]
    dump_json({"benchmark": "bench_dip_step", "machine": machine(device),
               "speed_probe": speed_probe(), "sizes": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
