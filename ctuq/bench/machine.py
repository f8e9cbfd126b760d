"""What a benchmark ran on, and how long and how much memory its stages took.

:func:`machine` describes the CPU, threads, versions and GPU; :func:`speed_probe`
measures how fast the machine is right now (a virtual machine's speed drifts
from day to day, with no load of its own to show it); :func:`median_s`
times a callable (synchronising CUDA); :class:`PeakMemory` records the peak
memory of a block (the process's resident memory polled by a thread on the
CPU, CUDA's own peak counter on a GPU).
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time

import torch

__all__ = ["machine", "speed_probe", "sync", "median_s", "components", "PeakMemory"]


def machine(device="cpu") -> dict:
    """The machine of a benchmark run: CPU model, cores, torch threads, versions, device."""
    device = torch.device(device)
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    out = {"cpu": cpu, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "python": platform.python_version(),
           "platform": platform.platform(), "device": str(device)}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    try:
        out["load_average_start"] = os.getloadavg()
    except OSError:
        pass
    return out


def speed_probe(repeats: int = 5) -> dict:
    """How fast this CPU runs the kinds of work a reconstruction is made of, right now.

    Six small timings on the CPU with torch's current thread count (about
    a second in all), each the median of ``repeats``:

    - ``matmul_gflops``: a 1024 × 1024 float32 matrix product (the arithmetic units);
    - ``conv_ms``: forward and backward of one 16-channel 3×3 convolution of a
      64² image, the unit of a ``dip-64`` DIP step;
    - ``op_overhead_us``: one in-place addition on a one-element tensor (what
      torch spends on a kernel launch, which small networks pay per layer);
    - ``copy_gb_s``: copying 64 MiB (bytes read and written per second, the
      memory's bandwidth);
    - ``python_ns``: one iteration of a plain Python loop;
    - ``unet_step_ms``: one training step of the ``dip-64`` U-net on a 64²
      input (forward, backward of a squared loss, Adam), the work a ``dip-64``
      DIP fit repeats: on 2026-12-03 its fit ran at half its usual speed while
      the four figures above read faster than on a slow day before
      (docs/speed.md, "How fast the machine was").

    Benchmarks record it beside their timings, so that a slow day (the same
    machine at a fraction of its usual speed, with no other load) is seen in
    the document instead of passing for a slower program.

    Returns
    -------
    dict
        The six figures and ``threads``.
    """
    from ctuq.models.unet import build_unet

    with torch.random.fork_rng(devices=[]):  # leaves the global random state as it was
        a = torch.randn(1024, 1024)
        conv = torch.nn.Conv2d(16, 16, 3, padding=1)
        x = torch.randn(1, 16, 64, 64, requires_grad=True)
        net = build_unet("dip-64", seed=0)
        z = torch.randn(1, net.config.in_channels, 64, 64)
    adam = torch.optim.Adam(net.parameters(), lr=1e-4)
    one = torch.zeros(1)
    src = torch.ones(16 * 2**20)  # 64 MiB of float32
    dst = torch.empty_like(src)

    def conv_step():
        conv(x).sum().backward()

    def unet_step():
        adam.zero_grad(set_to_none=True)
        net(z).square().mean().backward()
        adam.step()

    def ops(n=1000):
        for _ in range(n):
            one.add_(1.0)

    def loop(n=100_000):
        total = 0
        for i in range(n):
            total += i
        return total

    return {"threads": torch.get_num_threads(),
            "matmul_gflops": 2 * 1024**3 / median_s(lambda: a @ a, repeats) / 1e9,
            "conv_ms": 1e3 * median_s(conv_step, repeats),
            "op_overhead_us": 1e6 * median_s(ops, repeats) / 1000,
            "copy_gb_s": 2 * src.nbytes / median_s(lambda: dst.copy_(src), repeats) / 1e9,
            "python_ns": 1e9 * median_s(loop, repeats) / 100_000,
            "unet_step_ms": 1e3 * median_s(unet_step, repeats)}


def sync(device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_s(fn, repeats: int, device="cpu") -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def components(lin, op, m: int, repeats: int, device, gen) -> dict:
    """Median seconds of one batched JVP, VJP, ``A`` and ``Aᵀ`` on ``m`` vectors, and their sum.

    ``lin``: a :class:`~ctuq.posterior.Linearization`; ``op``: the ray
    transform; ``gen``: the generator of the random vectors.
    """
    V = torch.randn(m, lin.num_params, generator=gen).to(device)
    U = torch.randn(m, *lin.image_shape, generator=gen).to(device)
    S = torch.randn(m, *op.range_shape, generator=gen).to(device)
    with torch.no_grad():
        comp = {"jvp": median_s(lambda: lin.jvp(V), repeats, device),
                "vjp": median_s(lambda: lin.vjp(U), repeats, device),
                "A": median_s(lambda: op.A(U), repeats, device),
                "A_adjoint": median_s(lambda: op.A_adjoint(S), repeats, device)}
    comp["sum"] = sum(comp.values())
    return comp


class PeakMemory:
    """Peak memory while a block runs: process RSS polled every ``interval`` s, or CUDA's peak.

    Use as a context manager (``peak_bytes`` and ``kind`` are set on exit), or
    keep one open across stages: :meth:`reset` before a stage, :meth:`read`
    after it, :meth:`close` at the end.

    Parameters
    ----------
    device : str or torch.device
        ``'cuda'``: ``torch.cuda.max_memory_allocated``; else the process's
        resident set size from ``/proc/self/statm``. Default ``'cpu'``.
    interval : float
        Polling period in seconds (CPU). Default 0.005.
    """

    def __init__(self, device="cpu", interval: float = 0.005):
        self.device = torch.device(device)
        self.interval = float(interval)
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = 0
        self._thread = None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def rss(self) -> int:
        """The process's resident memory now, in bytes."""
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def start(self) -> "PeakMemory":
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self.base = self.peak = self.rss()
        self._stop = threading.Event()

        def poll():
            while not self._stop.wait(self.interval):
                self.peak = max(self.peak, self.rss())
        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def reset(self) -> None:
        """Start a new peak from the memory in use now."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.peak = self.rss()

    def read(self) -> int:
        """The peak since the start or the last :meth:`reset`, in bytes."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        return max(self.peak, self.rss())

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.peak_bytes = self.read()
        self.kind = "cuda max_memory_allocated" if self.cuda else "process RSS"
        self.close()
        return False
