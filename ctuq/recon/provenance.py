"""What a result records about how it was made: library versions, threads, device.

It also names the memory allocator's setting (:mod:`ctuq.recon.allocator`),
which changes the speed, never the numbers.

Bit-identical numbers need the same library versions, the same device and
the same torch thread count (floating-point sums are split differently over
threads: 1- and 2-thread std maps differed by up to 8.6e-5 in a measured run).
Every result therefore records all three; the ``threads`` setting pins the
count (serial runs and Dask workers alike).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import time

from ctuq.recon.allocator import allocator_setting

#: Distribution names whose versions are recorded.
PACKAGES = {"ctuq": "ctuq", "torch": "torch", "numpy": "numpy", "scipy": "scipy",
            "h5py": "h5py", "astra": "astra-toolbox", "odl": "odl"}


def library_versions() -> dict[str, str]:
    """``name -> version`` of ctuq and the libraries its numbers depend on."""
    out = {"python": platform.python_version()}
    for name, dist in PACKAGES.items():
        try:
            out[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    try:
        import h5py

        out["hdf5"] = h5py.version.hdf5_version
    except ImportError:  # pragma: no cover - h5py is a dependency
        pass
    return out


def provenance(*, device, threads: int, request: dict | None = None,
               run_id: str | None = None) -> dict:
    """The provenance record of a result (JSON-able).

    Parameters
    ----------
    device : str or torch.device
        The device the reconstruction ran on (after resolving ``auto``).
    threads : int
        torch's intra-op thread count during the run.
    request : dict, optional
        The requested settings (``ReconstructionConfig.to_dict()``).
    run_id : str, optional
        The batch run that wrote the result.
    """
    out = {"versions": library_versions(), "threads": int(threads), "device": str(device),
           "machine": platform.machine(), "system": platform.system(),
           "allocator": allocator_setting()}
    if request is not None:
        out["request"] = request
    if run_id is not None:
        out["run_id"] = str(run_id)
    return out


def free_cores(samples: int = 5, interval: float = 0.02) -> int:
    """CPU cores this process may use that no other process is busy on now.

    The cores of the process's affinity mask less the other runnable
    processes (``/proc/loadavg``'s running count, median of ``samples``
    reads, the reader itself not counted); at least 1. torch's OpenMP threads
    spin while they wait, so a run that takes every core of a busy machine
    slows itself and the others far beyond a fair share. All cores where the
    count cannot be read.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return cores
        if i + 1 < samples:
            time.sleep(interval)
    busy = sorted(counts)[len(counts) // 2]
    return max(1, min(cores, cores - busy))


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run with ``n`` torch threads (None: the cores free now, :func:`free_cores`),
    then restore the count."""
    import torch

    old = torch.get_num_threads()
    if n is None:
        n = min(old, free_cores())
    if n != old:
        torch.set_num_threads(int(n))
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)
