"""Batch reconstruction: many inputs, one result file each, resumable, on Dask.

Resuming rests on the atomic writes of :mod:`ctuq.data.io`: a result file
appears under its final name only once it is complete, so an existing output
that reads back is complete and skipped, and a run killed mid-write leaves
at most a hidden ``.<name>.<hex>.tmp`` file, which the next run removes.

Serial runs call the pipeline in this process. ``workers=N`` starts a
``dask.distributed.LocalCluster`` of N single-threaded worker processes;
``scheduler=ADDRESS`` submits to a running cluster (for example one started
by dask-jobqueue on Slurm). One task per input; a task whose worker dies is
retried (``retries``); workers report stage progress through a Dask queue so
the CLI shows the same bars as a serial run.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ctuq.errors import CtuqError, InputError

log = logging.getLogger(__name__)

RESULT_SUFFIX = ".ctuq.h5"
PROGRESS_QUEUE = "ctuq-progress"


@dataclass
class Outcome:
    """What happened to one input of a batch."""

    input: str
    output: str
    status: str  # "done" | "skipped" | "failed"
    seconds: float = 0.0
    error: str | None = None
    metrics: dict = field(default_factory=dict)
    mean_std: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def output_path(input_path, out_dir) -> Path:
    """``OUT/<input name without its extension>.ctuq.h5``."""
    name = Path(input_path).name
    for ext in (".h5", ".hdf5", ".nxs", ".hdf", ".npy", ".npz", ".tif", ".tiff"):
        if name.lower().endswith(ext):
            name = name[: -len(ext)]
            break
    return Path(out_dir) / f"{name}{RESULT_SUFFIX}"


def plan_outputs(inputs: Iterable, out_dir) -> list[tuple[Path, Path]]:
    """Pair each input with its output; two inputs with one output name are an error."""
    pairs, seen = [], {}
    for inp in inputs:
        inp = Path(inp)
        out = output_path(inp, out_dir)
        if out in seen:
            raise InputError(f"{inp} and {seen[out]} would both be written to {out.name}; "
                             "rename one or reconstruct them into different folders",
                             file=inp, field="input")
        seen[out] = inp
        pairs.append((inp, out))
    return pairs


def is_complete(path: Path) -> bool:
    """True when ``path`` is a result file that reads back."""
    from ctuq.data.io import read_result

    if not path.is_file():
        return False
    try:
        read_result(path)
        return True
    except CtuqError:
        return False


def remove_stale_temporaries(out_dir: Path) -> list[Path]:
    """Delete the hidden temporary files that a killed run left in ``out_dir``."""
    removed = []
    for p in Path(out_dir).glob(".*.tmp"):
        try:
            p.unlink()
            removed.append(p)
        except OSError as err:  # another live run may own it: leave it
            log.warning("could not remove %s: %s", p, err)
    return removed


def run_one(input_path, out_path, config: dict, overwrite: bool = False,
            progress: Callable | None = None) -> Outcome:
    """Reconstruct one input into one result file; never raises.

    Parameters
    ----------
    input_path, out_path : path-like
    config : dict
        A :class:`ctuq.recon.pipeline.ReconstructionConfig` as a dict (plain
        data, so that it travels to Dask workers).
    overwrite : bool
        Replace an existing complete output.
    progress : callable, optional
        Receives the pipeline's progress events.
    """
    from ctuq.recon.pipeline import ReconstructionConfig, reconstruct_file

    input_path, out_path = Path(input_path), Path(out_path)
    t0 = time.perf_counter()
    if not overwrite and is_complete(out_path):
        return Outcome(str(input_path), str(out_path), "skipped")
    try:
        cfg = ReconstructionConfig.from_dict(config)
        result = reconstruct_file(input_path, out_path, cfg, overwrite=overwrite,
                                  progress=progress)
        return Outcome(str(input_path), str(out_path), "done", time.perf_counter() - t0,
                       metrics=dict(result.metrics), mean_std=float(result.std.mean()))
    except CtuqError as err:
        return Outcome(str(input_path), str(out_path), "failed", time.perf_counter() - t0,
                       error=str(err))
    except Exception as err:  # a bug must not stop the batch; keep its trace in the log
        log.error("unexpected error on %s:\n%s", input_path, traceback.format_exc())
        return Outcome(str(input_path), str(out_path), "failed", time.perf_counter() - t0,
                       error=f"internal error: {type(err).__name__}: {err}")


def _dask_task(input_path, out_path, config, overwrite):
    """Runs on a worker: forwards progress events to the client through a queue."""
    from distributed import Queue, get_worker

    try:
        queue = Queue(PROGRESS_QUEUE)
        this = get_worker()
        worker = this.name
        # torch would start one thread per core in every worker process;
        # give it the threads Dask gave this worker instead (no oversubscription)
        import torch

        torch.set_num_threads(max(1, int(this.state.nthreads)))
    except (ValueError, RuntimeError, AttributeError):
        queue, worker = None, None

    def progress(stage, step, total, message=""):
        if queue is not None:
            try:
                queue.put({"input": str(input_path), "stage": stage, "step": step,
                           "total": total, "message": message, "worker": worker},
                          timeout=2)
            except Exception:  # progress is best effort; never fail the task for it
                pass

    return run_one(input_path, out_path, config, overwrite, progress).to_dict()


def run_batch(inputs, out_dir, config: dict, *, overwrite: bool = False,
              workers: int | None = None, scheduler: str | None = None,
              retries: int = 2, on_progress: Callable | None = None,
              on_outcome: Callable | None = None) -> list[Outcome]:
    """Reconstruct every input; see the module docstring.

    Parameters
    ----------
    inputs : iterable of path-like
    out_dir : path-like
        Created if missing.
    config : dict
        The effective :class:`~ctuq.recon.pipeline.ReconstructionConfig` as a dict.
    overwrite : bool
        Recompute inputs whose output is complete.
    workers : int, optional
        Start a local Dask cluster of this many worker processes.
    scheduler : str, optional
        Address of a running Dask scheduler (exclusive with ``workers``).
    retries : int
        Dask retries of a task whose worker died. Default 2.
    on_progress : callable, optional
        ``on_progress(input, stage, step, total, message)`` for stage events.
    on_outcome : callable, optional
        ``on_outcome(outcome)`` as each input finishes.

    Returns
    -------
    list of Outcome, in input order
    """
    if workers is not None and scheduler is not None:
        raise InputError("give --workers or --scheduler, not both", field="--workers")
    if workers is not None and workers < 1:
        raise InputError(f"must be >= 1, got {workers}", field="--workers")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create the output folder: {err.strerror}", file=out_dir,
                         field="--out") from None
    pairs = plan_outputs(inputs, out_dir)
    for p in remove_stale_temporaries(out_dir):
        log.info("removed stale temporary %s", p)
    outcomes: dict[str, Outcome] = {}

    def finished(o: Outcome):
        outcomes[o.input] = o
        if on_outcome is not None:
            on_outcome(o)

    if workers is None and scheduler is None:
        for inp, out in pairs:
            cb = None if on_progress is None else functools.partial(_file_progress, on_progress,
                                                                    str(inp))
            finished(run_one(inp, out, config, overwrite, cb))
    else:
        _run_dask(pairs, config, overwrite, workers, scheduler, retries, on_progress, finished)
    return [outcomes[str(inp)] for inp, _ in pairs]


def _file_progress(on_progress, inp: str, stage, step, total, message=""):
    """A reconstruction's progress callback, tagged with its input file."""
    on_progress(inp, stage, step, total, message)


def _run_dask(pairs, config, overwrite, workers, scheduler, retries, on_progress, finished):
    from distributed import Client, LocalCluster, Queue, as_completed

    cluster = None
    if scheduler is None:
        # one thread per worker: torch parallelises inside a task already
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=None)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout=20)
        except (OSError, TimeoutError) as err:
            raise InputError(f"cannot reach the Dask scheduler: {err}",
                             field="--scheduler") from None
    try:
        queue = Queue(PROGRESS_QUEUE, client=client)
        futures = {client.submit(_dask_task, str(inp), str(out), config, overwrite,
                                 key=f"ctuq-{os.getpid()}-{i}", pure=False, retries=retries): inp
                   for i, (inp, out) in enumerate(pairs)}
        pending = as_completed(list(futures), with_results=False)
        remaining = len(futures)
        while remaining:
            _drain(queue, on_progress)
            done = pending.next_batch(block=False)
            if not done:
                time.sleep(0.2)
                continue
            for fut in done:
                remaining -= 1
                inp = futures[fut]
                try:
                    finished(Outcome(**fut.result()))
                except Exception as err:  # the worker died more than `retries` times
                    finished(Outcome(str(inp), str(output_path(inp, pairs[0][1].parent)),
                                     "failed", error=f"worker lost: {err}"))
        _drain(queue, on_progress)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _drain(queue, on_progress):
    while True:
        try:
            events = queue.get(batch=True, timeout=0.01)
        except Exception:
            return
        if not events:
            return
        if on_progress is not None:
            for e in events:
                on_progress(e["input"], e["stage"], e["step"], e["total"], e["message"])
