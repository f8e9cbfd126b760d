"""Reading untrusted files in a child process with a time limit.

A corrupt HDF5 file can make the HDF5 C library crash (a segmentation fault
takes the whole Python process with it) or loop forever; no ``try`` can catch
either. The readers here therefore open the file in a fresh child process
(``python -m ctuq.data.io.isolated``, which imports only NumPy, h5py and
ctuq's I/O, no torch) under a time limit. The child hands its result back as
plain files in a private temporary folder: ``.npy`` arrays (read with
``allow_pickle=False``) and JSON, or, for a result file, a clean copy written
by :func:`ctuq.data.io.write_result`; nothing is unpickled. A crash, a hang or
an unexpected exit of the child is one :class:`~ctuq.errors.InputError`
naming the file, and the caller (a batch, the napari viewer) carries on.

Each read costs a process start (about 0.3–1 s). Use the plain readers of
:mod:`ctuq.data.io` for trusted files.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ctuq.errors import InputError

log = logging.getLogger(__name__)

#: Time limit of one isolated read when none is given: a base, plus time to read the
#: file at a slow disk's pace (a 30 kB file: 30 s; 10 GB: about 9 min).
BASE_TIMEOUT = 30.0
SLOW_READ_BYTES_PER_S = 20e6


def auto_timeout(path) -> float:
    """The default time limit for reading ``path`` (seconds)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    return BASE_TIMEOUT + size / SLOW_READ_BYTES_PER_S


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _run_child(request: dict, *, path, timeout: float | None) -> tuple[dict, Path]:
    """Run one request in a child; returns (its status, its output folder)."""
    timeout = auto_timeout(path) if timeout is None else float(timeout)
    out = Path(tempfile.mkdtemp(prefix="ctuq-read-"))
    request = {**request, "out": str(out)}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONFAULTHANDLER": ""}
    cmd = [sys.executable, "-m", "ctuq.data.io.isolated"]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
    except OSError as exc:
        shutil.rmtree(out, ignore_errors=True)
        raise InputError(f"cannot start the reader process ({exc})", file=path) from exc
    try:
        _, err = proc.communicate(json.dumps(request).encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        shutil.rmtree(out, ignore_errors=True)
        raise InputError(f"reading took longer than {timeout:g} s and was stopped: the file "
                         "makes the reader hang (corrupt?); raise read_timeout "
                         "(--read-timeout) if it is genuine and large", file=path) from None
    except BaseException:
        _kill(proc)
        shutil.rmtree(out, ignore_errors=True)
        raise
    status_file = out / "status.json"
    if proc.returncode != 0 or not status_file.is_file():
        shutil.rmtree(out, ignore_errors=True)
        if proc.returncode < 0:
            raise InputError(f"the file crashed the reader ({_signal_name(proc.returncode)} "
                             "inside the HDF5/NumPy/TIFF library): it is corrupt", file=path)
        tail = (err or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise InputError(f"the reader process failed (exit code {proc.returncode}"
                         f"{': ' + tail[0][:200] if tail[0] else ''})", file=path)
    try:
        status = json.loads(status_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        shutil.rmtree(out, ignore_errors=True)
        raise InputError(f"the reader process gave no readable answer ({exc})",
                         file=path) from exc
    if not status.get("ok"):
        shutil.rmtree(out, ignore_errors=True)
        e = status.get("error") or {}
        raise InputError(str(e.get("message", "cannot read the file")),
                         file=e.get("file") or path, field=e.get("field"))
    return status, out


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - the kernel owes us this
        pass


def detect_format_isolated(path, *, timeout: float | None = None) -> str:
    """:func:`ctuq.data.io.detect_format` in a child process."""
    from ctuq.data.io._common import check_input_file

    p = check_input_file(path)
    status, out = _run_child({"op": "detect", "path": str(p)}, path=p, timeout=timeout)
    shutil.rmtree(out, ignore_errors=True)
    return str(status["format"])


def read_sinogram_isolated(path, *, timeout: float | None = None, **options):
    """:func:`ctuq.data.io.read_sinogram` in a child process with a time limit.

    Parameters
    ----------
    path : path-like
    timeout : float, optional
        Seconds before the child is killed. Default: :func:`auto_timeout` (30 s
        plus 1 s per 20 MB of file).
    **options
        Keyword arguments of :func:`~ctuq.data.io.read_sinogram` (JSON-able:
        a ``geometry`` is passed as its dict).

    Returns
    -------
    Sinogram
        Equal to what ``read_sinogram(path, **options)`` returns.
    """
    kind, obj = _read(path, "sinogram", timeout, options)
    return obj


def read_any_isolated(path, *, timeout: float | None = None, **options):
    """Detect and read a file in one child process: ``("result", Result)`` for a ctuq
    result file, else ``(format, Sinogram)`` read with ``options``."""
    return _read(path, "any", timeout, options)


def _read(path, op: str, timeout: float, options: dict):
    from ctuq.data.geometry import Geometry
    from ctuq.data.io._common import check_input_file, to_jsonable

    p = check_input_file(path)
    if isinstance(options.get("geometry"), Geometry):
        options = {**options, "geometry": options["geometry"].to_dict()}
    opts = to_jsonable({k: v for k, v in options.items() if v is not None}, field="options")
    status, out = _run_child({"op": op, "path": str(p), "options": opts}, path=p,
                             timeout=timeout)
    if status.get("kind") == "result":
        from ctuq.data.io.results import read_result

        try:
            return "result", read_result(out / "result.h5")
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return status.get("format", "sinogram"), _sinogram_from(status, out)


def _sinogram_from(status: dict, out: Path):
    from ctuq.data.geometry import Geometry
    from ctuq.data.io.sinogram import Sinogram

    try:
        data = np.load(out / "data.npy", allow_pickle=False)
        gt = (np.load(out / "ground_truth.npy", allow_pickle=False)
              if (out / "ground_truth.npy").exists() else None)
        var = (np.load(out / "variance.npy", allow_pickle=False)
               if (out / "variance.npy").exists() else None)
        gdict = dict(status["geometry"])
        angles = np.load(out / "angles_rad.npy", allow_pickle=False)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    g = Geometry(image_shape=tuple(gdict["image_shape"]), angles=angles,
                 n_detector=gdict["n_detector"], pixel_size=gdict["pixel_size"],
                 detector_spacing=gdict["detector_spacing"], beam=gdict["beam"],
                 source_origin=gdict.get("source_origin"),
                 origin_detector=gdict.get("origin_detector"),
                 center_offset=gdict.get("center_offset", 0.0),
                 image_offset=tuple(gdict.get("image_offset", (0.0, 0.0))))
    return Sinogram(data, g, dict(status["meta"]), gt, variance=var)


def read_result_isolated(path, *, timeout: float | None = None):
    """:func:`ctuq.data.io.read_result` in a child process with a time limit.

    The child validates the file and writes a clean copy, which is read here.
    """
    from ctuq.data.io._common import check_input_file
    from ctuq.data.io.results import read_result

    p = check_input_file(path)
    status, out = _run_child({"op": "result", "path": str(p)}, path=p, timeout=timeout)
    try:
        r = read_result(out / "result.h5")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    r.input_path = status.get("input_path")
    return r


# -- the child ------------------------------------------------------------------------
def _child_main() -> int:
    out = None
    try:
        request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
        out = Path(request["out"])
        status = _serve(request, out)
    except Exception as exc:  # noqa: BLE001 - every failure goes back as one error
        from ctuq.errors import InputError as _IE

        if isinstance(exc, _IE):
            err = {"message": exc.message, "file": exc.file, "field": exc.field}
        elif isinstance(exc, MemoryError):
            err = {"message": "not enough memory to read the file (lower the memory budget "
                              "max_memory_gib, or free memory)"}
        else:
            err = {"message": f"cannot read the file ({type(exc).__name__}: {exc})"}
        status = {"ok": False, "error": err}
    if out is None:
        return 3
    (out / "status.json").write_text(json.dumps(status), encoding="utf-8")
    return 0


def _serve(request: dict, out: Path) -> dict:
    from ctuq.data.io._common import to_jsonable
    from ctuq.data.io.readers import detect_format, read_sinogram
    from ctuq.data.io.results import read_result, write_result

    op, path = request["op"], request["path"]
    if op == "detect":
        return {"ok": True, "format": detect_format(path)}
    if op == "any":
        fmt = detect_format(path)
        op = "result" if fmt == "result" else "sinogram"
    else:
        fmt = None
    if op == "result":
        r = read_result(path)
        input_path = r.input_path
        write_result(out / "result.h5", r)
        return {"ok": True, "input_path": input_path, "kind": "result"}
    if op == "sinogram":
        s = read_sinogram(path, **request.get("options", {}))
        fmt = fmt or s.meta.get("format")
        np.save(out / "data.npy", s.data, allow_pickle=False)
        np.save(out / "angles_rad.npy", np.asarray(s.geometry.angles), allow_pickle=False)
        if s.ground_truth is not None:
            np.save(out / "ground_truth.npy", s.ground_truth, allow_pickle=False)
        if s.variance is not None:
            np.save(out / "variance.npy", s.variance, allow_pickle=False)
        try:
            meta = to_jsonable(s.meta, field="meta", file=path)
        except InputError:
            meta = json.loads(json.dumps(s.meta, default=str))
        return {"ok": True, "geometry": s.geometry.to_dict(), "meta": meta, "kind": "sinogram",
                "format": fmt}
    raise ValueError(f"unknown request {op!r}")


if __name__ == "__main__":
    sys.exit(_child_main())
