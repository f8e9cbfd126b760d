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
               run_id: str | None = None, **extra) -> dict:
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
    **extra
        Further JSON-able fields (:meth:`ThreadGovernor.record`).
    """
    out = {"versions": library_versions(), "threads": int(threads), "device": str(device),
           "machine": platform.machine(), "system": platform.system(),
           "allocator": allocator_setting()}
    if request is not None:
        out["request"] = request
    if run_id is not None:
        out["run_id"] = str(run_id)
    out.update(extra)
    return out


def own_running_threads() -> int:
    """This process's threads that are running or runnable now (``/proc/self/task``)."""
    n = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # pragma: no cover - not Linux
        return 1
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                n += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
    return max(n, 1)


def free_cores(samples: int = 5, interval: float = 0.02, *, mid_run: bool = False) -> int:
    """CPU cores this process may use that no other process is busy on now.

    The cores of the process's affinity mask less the other runnable
    processes (``/proc/loadavg``'s running count, median of ``samples``
    reads, the reader itself not counted; ``mid_run``: none of this
    process's running threads counted, :func:`own_running_threads`); at least
    1. torch's OpenMP threads spin while they wait, so a run that takes every
    core of a busy machine slows itself and the others far beyond a fair
    share. All cores where the count cannot be read.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
            counts.append(running - (own_running_threads() if mid_run else 1))
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


def side_by_side(tasks, threads: int) -> list:
    """Run the callables ``tasks`` at once, each on a thread of its own with
    ``max(1, threads // len(tasks))`` torch threads; their results, in order.

    For independent fits of a small image on a CPU: a 64² DIP step takes 10.6 ms
    on one thread and 9.8 ms on two (docs/speed.md), so two fits side by side,
    one thread each, take about the time of one. Torch releases the GIL in its
    kernels; OpenMP's thread count is per thread, so each task sets its own.
    A task's exception is raised here once every task has ended.
    """
    import torch
    from concurrent.futures import ThreadPoolExecutor

    each = max(1, int(threads) // max(1, len(tasks)))
    old = torch.get_num_threads()

    def run(task):
        torch.set_num_threads(each)
        return task()

    try:
        with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
            futures = [pool.submit(run, task) for task in tasks]
            return [f.result() for f in futures]
    finally:
        torch.set_num_threads(old)


def keeping_threads(progress):
    """``progress`` for a task of :func:`side_by_side`: a thread governor behind it
    may set the thread count when it reports, which the task then sets back to its
    own share. None stays None."""
    if progress is None:
        return None
    import torch

    from ctuq.progress import emit_progress

    def report(stage, step, total, message=""):  # keywords: emit_progress's style
        own = torch.get_num_threads()
        emit_progress(progress, stage, step, total, message)
        torch.set_num_threads(own)

    return report


class ThreadGovernor:
    """Keeps a run's torch thread count at the cores no other process is busy on.

    Two runs started together both see every core free and take them all:
    their OpenMP threads then spin against each other and each run slows
    by 14× or more on 2 cores (docs/speed.md). The governor re-reads the
    free cores (:func:`free_cores`, this process's own threads not counted)
    at most every ``every_s`` seconds, when a stage reports progress, and
    sets torch's thread count to them, between 1 and ``ceiling``; the count
    goes back up when the other run ends (also above a start that found the
    machine busy). Only for runs whose thread count was not pinned: a
    changing count changes the last bits of the numbers.

    Parameters
    ----------
    ceiling : int
        The most threads (torch's count before the run chose its own).
    every_s : float, optional
        Seconds between two reads. Default :attr:`EVERY_S` (5).
    """

    EVERY_S = 5.0

    def __init__(self, ceiling: int, every_s: float | None = None):
        import torch

        self.ceiling = int(ceiling)
        self.every_s = float(self.EVERY_S if every_s is None else every_s)
        self.low = self.high = torch.get_num_threads()
        self.changes = 0
        self._last = time.monotonic()

    def rebalance(self) -> int:
        """Re-read the free cores if ``every_s`` passed; returns the thread count."""
        import torch

        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            n = max(1, min(self.ceiling, free_cores(3, 0.01, mid_run=True)))
            if n != torch.get_num_threads():
                torch.set_num_threads(n)
                self.changes += 1
                self.low, self.high = min(self.low, n), max(self.high, n)
        return torch.get_num_threads()

    def wrap(self, progress):
        """A progress callable that rebalances, then passes the event on to ``progress``."""
        from ctuq.progress import emit_progress

        def governed(event):
            self.rebalance()
            emit_progress(progress, event.stage, event.step, event.total, event.message)
        return governed

    def record(self) -> dict:
        """What the provenance keeps: the range of thread counts and the changes."""
        return {"threads_range": [self.low, self.high], "thread_changes": self.changes}
