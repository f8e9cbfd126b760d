"""Batch reconstruction: many inputs, one result file each, resumable, on Dask.

Resuming rests on the atomic writes of :mod:`ctuq.data.io`: a result file
appears under its final name only once it is complete. An existing output is
skipped only when it reads back *and* was made from the same input (SHA-256)
with the same settings (:meth:`ReconstructionConfig.result_affecting`);
otherwise that input fails with the differences named, unless ``overwrite``
recomputes it. Nothing is ever deleted except the provably stale temporaries
of earlier ctuq writes (:func:`ctuq.data.io.remove_stale_temporaries`: their
own name pattern and an unlocked lock file), and never an input.

Before any work the batch is planned (:func:`plan_outputs`): an input that
does not exist is a usage error, and so is a file the run would write (an
output, the lock, the summary JSON) that is one of the inputs, by path or
through a link; a ``scheduler`` address is checked the same way
(:func:`check_scheduler`).

One batch at a time per output folder: a run holds an exclusive lock on
``OUT/.ctuq-batch.lock``; a second run into the same folder is refused with a
message naming the first (its PID and host).

Each input is opened in a child process with a time limit
(:func:`ctuq.data.io.read_sinogram_isolated`), so a file that crashes or
hangs the HDF5 library fails alone and the batch goes on.

Serial runs call the pipeline in this process. ``workers=N`` starts a
``dask.distributed.LocalCluster`` of N single-threaded worker processes;
``scheduler=ADDRESS`` submits to a running cluster (for example one started
by dask-jobqueue on Slurm). One task per input; a task whose worker dies is
retried (``retries``); workers report stage progress through a Dask queue so
the CLI shows the same bars as a serial run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import secrets
import stat
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ctuq.errors import CtuqError, InputError

log = logging.getLogger(__name__)

RESULT_SUFFIX = ".ctuq.h5"
PROGRESS_QUEUE = "ctuq-progress"
LOCK_NAME = ".ctuq-batch.lock"


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
    note: str | None = None
    #: The data-consistency verdict (``ok``/``misfit``), its reason, the data
    #: warnings and the seconds per stage (``Result.diagnostics``, ``provenance['stages']``).
    fit: str | None = None
    fit_reason: str | None = None
    warnings: list = field(default_factory=list)
    stages: dict = field(default_factory=dict)
    #: What the image is when it is not the DIP output (:func:`shown_image_note`).
    image: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def new_run_id() -> str:
    return secrets.token_hex(6)


def output_path(input_path, out_dir) -> Path:
    """``OUT/<input name without its extension>.ctuq.h5``."""
    name = Path(input_path).name
    for ext in (".h5", ".hdf5", ".nxs", ".hdf", ".npy", ".npz", ".tif", ".tiff"):
        if name.lower().endswith(ext):
            name = name[: -len(ext)]
            break
    return Path(out_dir) / f"{name}{RESULT_SUFFIX}"


def _check_input_exists(inp: Path) -> None:
    """A path that names no file is a usage error, before any work (not a failed row)."""
    try:
        st = os.stat(inp)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise InputError("is a loop of symbolic links", file=inp, field="input") from None
        if err.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise InputError(f"cannot be accessed ({err.strerror or err})", file=inp,
                             field="input") from None
    else:
        if stat.S_ISDIR(st.st_mode):
            raise InputError("is a folder, not a sinogram file (give the files in it, e.g. "
                             f"{os.path.join(str(inp), '*.h5')})", file=inp, field="input")
        return
    if os.path.lexists(inp):
        raise InputError("is a broken symbolic link (it points at a file that does not exist)",
                         file=inp, field="input")
    if any(c in str(inp) for c in "*?["):
        raise InputError("no file matches this pattern (the shell passed it on as it was)",
                         file=inp, field="input")
    raise InputError("no such file", file=inp, field="input")


def _same_file(a: Path, b: Path) -> bool:
    """``a`` and ``b`` are one file: the same path, or links (symbolic or hard) to one file."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def plan_outputs(inputs: Iterable, out_dir, *, also_writes: Iterable = ()
                 ) -> list[tuple[Path, Path]]:
    """Pair each input with its output, refusing a plan that could lose data.

    Refused, before any work, with an :class:`InputError` (a usage error):
    an input that does not exist (a missing file, a shell pattern that
    matched nothing, a broken link, a folder); two inputs with one output
    name; and a file the batch would write (an output, the batch lock,
    ``also_writes`` such as the summary JSON) that is itself one of the
    inputs, by path or through a symbolic or hard link.

    Parameters
    ----------
    inputs : iterable of path-like
    out_dir : path-like
    also_writes : iterable of path-like
        Other files the run will write (``--summary-json``).

    Returns
    -------
    list of (input, output) pairs, in input order
    """
    pairs, seen = [], {}
    inputs = [Path(inp) for inp in inputs]
    for inp in inputs:
        _check_input_exists(inp)
        out = output_path(inp, out_dir)
        if out in seen:
            raise InputError(f"{inp} and {seen[out]} would both be written to {out.name}; "
                             "rename one or reconstruct them into different folders",
                             file=inp, field="input")
        seen[out] = inp
        pairs.append((inp, out))
    writes = [(out, f"the output of {inp}") for inp, out in pairs]
    writes.append((Path(out_dir) / LOCK_NAME, "the batch lock"))
    writes += [(Path(p), "the summary (--summary-json)") for p in also_writes
               if p is not None and str(p) != "-"]
    for target, what in writes:
        if not os.path.lexists(target):
            continue  # a file that does not exist yet cannot be an input
        for inp in inputs:
            if _same_file(target, inp):
                same = "" if os.path.abspath(target) == os.path.abspath(inp) else \
                    f" (the same file as {target})"
                raise InputError(f"is an input and would be overwritten as {what}{same}; "
                                 "choose another --out (or move the input)",
                                 file=inp, field="input")
    return pairs


#: Seconds to wait for a TCP connection to the Dask scheduler before giving up.
SCHEDULER_CONNECT_TIMEOUT = 5.0


def check_scheduler(address: str, timeout: float = SCHEDULER_CONNECT_TIMEOUT) -> None:
    """Refuse a Dask scheduler address that is malformed or that nothing answers at.

    A ``tcp://`` or ``tls://`` address (the scheme defaults to ``tcp``) is
    parsed and one TCP connection is opened, so that a typo or a scheduler
    that is not running is one error within ``timeout`` seconds instead of
    Dask's 20-second retry loop. Other schemes are left to Dask.

    Raises
    ------
    InputError
        Naming ``--scheduler`` and the address.
    """
    import socket

    from distributed.comm import parse_address, parse_host_port

    if not isinstance(address, str) or not address.strip():
        raise InputError(f"must be an address such as tcp://10.0.0.5:8786, got {address!r}",
                         field="--scheduler")
    try:
        scheme, location = parse_address(address.strip())
        if scheme not in ("tcp", "tls"):
            _check_comm_backend(scheme, address)
            return
        host, port = parse_host_port(location)
    except (ValueError, TypeError) as err:
        raise InputError(f"{address!r} is not a Dask scheduler address ({err}); expected "
                         "tcp://HOST:PORT", field="--scheduler") from None
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise InputError(f"cannot reach the Dask scheduler at {address} ({why}); is it "
                         "running, and is the address right?", field="--scheduler") from None


def _check_comm_backend(scheme: str, address: str) -> None:
    """Refuse a scheme whose Dask communication backend is missing or unusable here."""
    from distributed.comm.registry import get_backend

    try:
        get_backend(scheme).get_connector()
    except Exception as err:  # noqa: BLE001 - unknown scheme, missing or broken package
        raise InputError(f"cannot use {address!r}: Dask's {scheme!r} communication is not "
                         f"available here ({type(err).__name__}: {str(err)[:160]})",
                         field="--scheduler") from None


# -- the folder lock -------------------------------------------------------------------
@contextlib.contextmanager
def folder_lock(out_dir: Path, run_id: str):
    """Hold ``OUT/.ctuq-batch.lock`` exclusively for a run; refuse if another run holds it.

    The lock file is removed when the run ends. A run that finds the path
    pointing at another file than the one it locked (removed and recreated
    meanwhile) tries again, so two runs can never both hold the lock.
    """
    path = Path(out_dir) / LOCK_NAME
    for _attempt in range(10):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as err:
            raise InputError(f"cannot create the batch lock ({err.strerror})", file=path,
                             field="--out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            who = ""
            with contextlib.suppress(OSError):
                who = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise InputError(f"another ctuq reconstruct is writing into this folder "
                             f"({who or 'unknown process'}); wait for it to finish or choose "
                             "another --out", file=out_dir, field="--out") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # we locked a file that a finishing run had just removed
    else:  # pragma: no cover - ten races in a row
        raise InputError("cannot take the batch lock (it keeps changing)", file=path,
                         field="--out")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}, run {run_id}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # still holding the lock: nobody can be using this file
        os.close(fd)


# -- one input -------------------------------------------------------------------------
def _differences(stored: dict, wanted: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key, "unset"), wanted.get(key, "unset")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {a!r} -> {b!r}")
    return out


def check_existing(input_path: Path, out_path: Path, config, *, timeout: float) -> Outcome | None:
    """The outcome for an input whose output exists (None: it does not exist).

    Skipped when the output reads back and was made from this input with the
    same settings; failed, naming the differences, otherwise.
    """
    from ctuq.data.io import read_result_isolated, sha256_file

    if not os.path.lexists(out_path):
        return None
    inp, out = str(input_path), str(out_path)
    try:
        stored = read_result_isolated(out_path, timeout=timeout)
    except CtuqError as err:
        return Outcome(inp, out, "failed", error=f"the output exists but is not a readable "
                       f"result ({err}); --overwrite replaces it")
    request = (stored.provenance or {}).get("request")
    if request is None:
        return Outcome(inp, out, "failed", error="the output exists but records no settings "
                       "(written by an older ctuq); --overwrite recomputes it")
    from ctuq.recon.config import ReconstructionConfig

    try:
        # a file from before the data scale ran without it (the default then)
        request = {"normalize": False, **request} if isinstance(request, dict) else request
        stored_cfg = ReconstructionConfig.from_dict(request).result_affecting()
    except CtuqError:
        stored_cfg = {"unreadable": True}
    diff = _differences(stored_cfg, config.result_affecting())
    try:
        digest = sha256_file(input_path)
    except CtuqError as err:
        return Outcome(inp, out, "failed", error=str(err))
    if stored.input_sha256 and stored.input_sha256 != digest:
        diff.insert(0, "the input file changed (SHA-256 differs)")
    if diff:
        return Outcome(inp, out, "failed", error="the output exists but was computed "
                       f"differently: {'; '.join(diff[:6])}{' ...' if len(diff) > 6 else ''}; "
                       "--overwrite recomputes it, or choose another --out")
    return Outcome(inp, out, "skipped", note="complete, same input and settings",
                   **result_checks(stored))


def run_one(input_path, out_path, config: dict, overwrite: bool = False,
            progress: Callable | None = None, run_id: str | None = None) -> Outcome:
    """Reconstruct one input into one result file; never raises.

    Parameters
    ----------
    input_path, out_path : path-like
    config : dict
        A :class:`ctuq.recon.config.ReconstructionConfig` as a dict (plain
        data, so that it travels to Dask workers).
    overwrite : bool
        Replace an existing output.
    progress : callable, optional
        Receives the pipeline's progress events.
    run_id : str, optional
        This batch run: an output that it already wrote (a retried Dask task
        whose worker died after writing) is reported as done.
    """
    from ctuq.recon.pipeline import ReconstructionConfig, reconstruct_file

    input_path, out_path = Path(input_path), Path(out_path)
    inp, out = str(input_path), str(out_path)
    t0 = time.perf_counter()
    try:
        cfg = ReconstructionConfig.from_dict(config)
        if not overwrite:
            existing = check_existing(input_path, out_path, cfg,
                                      timeout=cfg.read_options.read_timeout)
            if existing is not None:
                return _mine(existing, run_id) or existing
        result = reconstruct_file(input_path, out_path, cfg, overwrite=overwrite,
                                  progress=progress, run_id=run_id)
        return Outcome(inp, out, "done", time.perf_counter() - t0,
                       metrics=dict(result.metrics), mean_std=float(result.std.mean()),
                       **result_checks(result))
    except CtuqError as err:
        return Outcome(inp, out, "failed", time.perf_counter() - t0, error=str(err))
    except Exception as err:  # a bug must not stop the batch; keep its trace in the log
        log.error("unexpected error on %s:\n%s", input_path, traceback.format_exc())
        return Outcome(inp, out, "failed", time.perf_counter() - t0,
                       error=f"internal error: {type(err).__name__}: {err}")


def _mine(existing: Outcome, run_id: str | None) -> Outcome | None:
    """A skipped output that this very run wrote (earlier attempt of a retried task) is done."""
    if run_id is None or existing.status != "skipped":
        return None
    from ctuq.data.io import read_result

    try:
        r = read_result(existing.output)
    except CtuqError:
        return None
    if (r.provenance or {}).get("run_id") != run_id:
        return None
    std = None if r.std is None else float(r.std.mean())
    return Outcome(existing.input, existing.output, "done", metrics=dict(r.metrics),
                   mean_std=std, note="written by an earlier attempt of this run",
                   **result_checks(r))


def result_checks(result) -> dict:
    """The :class:`Outcome` fields of a result's checks (``fit``, ``fit_reason``,
    ``warnings``, ``stages``); empty for a result without them."""
    d = result.diagnostics or {}
    stages = (result.provenance or {}).get("stages") or {}
    return {"fit": d.get("verdict"), "fit_reason": d.get("reason"),
            "warnings": [str(w) for w in d.get("warnings") or []],
            "stages": dict(stages.get("seconds") or {}),
            "image": shown_image_note(result.config)}


def shown_image_note(config: dict | None) -> str | None:
    """What a result's image is, from its recorded settings, when it is not the DIP output.

    ``'DIP output + the linear model's step (linear-heldout, length 0.73)'``
    for ``uncertainty.laplace.mean`` other than ``'dip'``, ``"the network's input, the
    TV image (…)"`` where ``uncertainty.heldout_input_fallback`` showed it; None for the DIP
    output itself (or a result without settings). Read from the recorded
    settings alone, without the method registry (which would load torch).
    """
    config = config or {}
    info = (config.get("model_error") or {}).get("info") or {}
    fallback = info.get("input_fallback") or {}
    if fallback.get("used"):  # uncertainty.heldout_input_fallback
        return (f"the network's input, the TV image (it predicted the left-out angles "
                f"better than the DIP fit, t {fallback['t']:.2f} > {fallback['t_min']:g})")
    unc = config.get("uncertainty") or {}
    # the method's settings are the one table of the recorded uncertainty settings
    table = next((v for v in unc.values() if isinstance(v, dict)), {})
    mean = table.get("mean")
    if not mean or mean == "dip":
        return None
    length = info.get("step_length")
    return (f"DIP output + the linear model's step ({mean}"
            + (f", length {length:.2f})" if length is not None else ")"))


def net_input_note(config: dict | None) -> str | None:
    """Which input ``dip.net_input = 'auto'`` gave the network, from a result's record.

    ``'TV image (auto: its held-out fit predicted the left-out angles better, t 4.12 >
    2)'``; None where the input was set, not chosen (it is in the settings).
    """
    choice = (((config or {}).get("model_error") or {}).get("info") or {}).get("net_input")
    if not isinstance(choice, dict) or "chosen" not in choice:
        return None
    t = max((choice.get("t") or {}).values(), default=None)
    t_min = choice.get("t_min")
    chosen = {"fbp": "FBP", "tv": "TV image"}.get(choice["chosen"], choice["chosen"])
    if t is None or t_min is None:
        return f"{chosen} (auto)"
    if choice["chosen"] == "fbp":
        return f"{chosen} (auto: the TV input's held-out fit not clearly better, t {t:.2f} ≤ " \
               f"{t_min:g})"
    return f"{chosen} (auto: its held-out fit predicted the left-out angles better, " \
           f"t {t:.2f} > {t_min:g})"


def _dask_task(input_path, out_path, config, overwrite, run_id=None):
    """Runs on a worker: forwards progress events to the client through a queue."""
    from distributed import Queue, get_worker

    try:
        queue = Queue(PROGRESS_QUEUE)
        this = get_worker()
        worker = this.name
        threads = config.get("threads")
        import torch

        # the thread count is part of the arithmetic: the config's, else this
        # worker's share (no oversubscription)
        torch.set_num_threads(int(threads) if threads else max(1, int(this.state.nthreads)))
    except (ValueError, RuntimeError, AttributeError):
        queue, worker = None, None

    last = {"t": 0.0, "stage": None}

    def progress(stage, step, total, message=""):
        # at most 4 messages a second per worker, but every stage change and end
        now = time.monotonic()
        if stage == last["stage"] and 0 < step < total and now - last["t"] < 0.25:
            return
        last.update(t=now, stage=stage)
        if queue is not None:
            try:
                queue.put({"input": str(input_path), "stage": stage, "step": step,
                           "total": total, "message": message, "worker": worker},
                          timeout=2)
            except Exception:  # progress is best effort; never fail the task for it
                pass

    return run_one(input_path, out_path, config, overwrite, progress, run_id).to_dict()


def run_batch(inputs, out_dir, config: dict, *, overwrite: bool = False,
              workers: int | None = None, scheduler: str | None = None,
              retries: int = 2, on_progress: Callable | None = None,
              on_outcome: Callable | None = None, run_id: str | None = None,
              quiet_dask: bool = True, also_writes: Iterable = ()) -> list[Outcome]:
    """Reconstruct every input; see the module docstring.

    Parameters
    ----------
    inputs : iterable of path-like
    out_dir : path-like
        Created if missing.
    config : dict
        The effective :class:`~ctuq.recon.pipeline.ReconstructionConfig` as a dict.
    overwrite : bool
        Recompute inputs whose output exists.
    workers : int, optional
        Start a local Dask cluster of this many worker processes.
    scheduler : str, optional
        Address of a running Dask scheduler (exclusive with ``workers``).
    retries : int
        Dask retries of a task whose worker died. Default 2.
    on_progress : callable, optional
        ``on_progress(input, stage, step, total, message)`` for stage events.
    on_outcome : callable, optional
        ``on_outcome(outcome)`` as each input finishes; an exception in it is
        logged and does not stop the batch.
    run_id : str, optional
        Default: a new random id (recorded in every result written).
    quiet_dask : bool
        Keep Dask's own logging at ERROR level. Default True.
    also_writes : iterable of path-like
        Other files the caller will write after the run (the summary JSON):
        refused, like the outputs, when one of them is an input.

    Returns
    -------
    list of Outcome, in input order

    Raises
    ------
    InputError
        Bad arguments, an input that does not exist, a file to be written
        that is an input (:func:`plan_outputs`), an output folder that cannot
        be created, or another batch writing into the same folder. Raised
        before any input is read or any file written.
    """
    if workers is not None and scheduler is not None:
        raise InputError("give --workers or --scheduler, not both", field="--workers")
    if workers is not None and workers < 1:
        raise InputError(f"must be >= 1, got {workers}", field="--workers")
    from ctuq.data.io import remove_stale_temporaries
    from ctuq.recon.config import ReconstructionConfig

    ReconstructionConfig.from_dict(config)  # refuse bad settings before any work
    if scheduler is not None:
        check_scheduler(scheduler)
    run_id = run_id or new_run_id()
    out_dir = Path(out_dir)
    pairs = plan_outputs(inputs, out_dir, also_writes=also_writes)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create the output folder: {err.strerror}", file=out_dir,
                         field="--out") from None
    with folder_lock(out_dir, run_id):
        for p in remove_stale_temporaries(out_dir, protect=[inp for inp, _ in pairs]):
            log.info("removed stale temporary %s", p)
        outcomes: dict[str, Outcome] = {}

        def finished(o: Outcome):
            outcomes[o.input] = o
            if on_outcome is not None:
                try:
                    on_outcome(o)
                except Exception as err:  # noqa: BLE001 - a preview must not stop a batch
                    log.warning("after %s: %s: %s", o.input, type(err).__name__, err)

        if workers is None and scheduler is None:
            for inp, out in pairs:
                cb = None if on_progress is None else functools.partial(
                    _file_progress, on_progress, str(inp))
                finished(run_one(inp, out, config, overwrite, cb, run_id))
        else:
            _run_dask(pairs, config, overwrite, workers, scheduler, retries, on_progress,
                      finished, run_id, quiet_dask)
    return [outcomes[str(inp)] for inp, _ in pairs]


def _file_progress(on_progress, inp: str, stage, step, total, message=""):
    """A reconstruction's progress callback, tagged with its input file."""
    on_progress(inp, stage, step, total, message)


def _run_dask(pairs, config, overwrite, workers, scheduler, retries, on_progress, finished,
              run_id, quiet):
    from distributed import Client, LocalCluster, Queue, as_completed

    level = logging.ERROR if quiet else logging.INFO
    if quiet:
        for name in ("distributed", "dask", "tornado", "bokeh"):
            logging.getLogger(name).setLevel(logging.ERROR)
    cluster = None
    if scheduler is None:
        # one thread per worker unless the config says otherwise (torch parallelises a task)
        cluster = LocalCluster(n_workers=workers, threads_per_worker=config.get("threads") or 1,
                               processes=True, host="127.0.0.1", dashboard_address=None,
                               silence_logs=level)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout=20)
        except Exception as err:  # noqa: BLE001 - whatever answered was no Dask scheduler
            raise InputError(f"cannot connect to the Dask scheduler at {scheduler} "
                             f"({type(err).__name__}: {str(err)[:200]})",
                             field="--scheduler") from None
    try:
        queue = Queue(PROGRESS_QUEUE, client=client)
        futures = {client.submit(_dask_task, str(inp), str(out), config, overwrite, run_id,
                                 key=f"ctuq-{run_id}-{i}", pure=False, retries=retries): (inp, out)
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
                inp, out = futures[fut]
                try:
                    finished(Outcome(**fut.result()))
                except Exception as err:  # the worker died more than `retries` times
                    finished(Outcome(str(inp), str(out), "failed",
                                     error=f"worker lost {retries + 1} times while "
                                           f"reconstructing it: {err}"))
        _drain(queue, on_progress)
    finally:
        client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=30)


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
