"""Reconstruction results: the :class:`Result` object and its NeXus
NXtomoproc file (:func:`write_result`, :func:`read_result`).

Layout (see ``docs/file_formats.md``)::

    /                                   @default = "entry"
    /entry                              NXentry, @default = "data"
      definition = "NXtomoproc", title, start_time (= created)
      instrument/                       NXinstrument
        source/                         NXsource: type, name, probe
      sample/                           NXsample: name, [ground_truth]
      reconstruction/                   NXprocess
        program = "ctuq", version, date
        parameters/                     NXparameters
          config_json                   full effective config, JSON text
          raw_file                      input path (NXtomoproc's field)
          <key fields of the config>    scalars/arrays, nested dicts as groups
        hyperparameters/                NXcollection: one dataset per name
        hyperparameters_json            JSON text (exact)
        em_trace/                       NXcollection: one array per numeric key
        em_trace_json                   JSON text (exact), one object per EM step
        geometry/                       NXcollection: json, angles_rad  [if known]
        input_file, input_sha256, seed, device   [each if known]
      data/                             NXdata @signal="data" @axes=["y","x"] or
                                        ["slice","y","x"], @<axis>_indices
        data         posterior mean  [H, W] or [S, H, W] float32
        data_errors  posterior std   (same shape)
        y, x         pixel centres, @units = "mm" ("pixel" without a geometry)
        [slice]      slice index
      uncertainty/                      NXcollection  [if any]
        variance, samples [k,H,W] / [S,k,H,W], fbp, dip
      metrics/                          NXcollection  [if any]: one float per metric
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctuq.data.geometry import Geometry
from ctuq.data.io import _hdf5 as H
from ctuq.data.io import _resolve
from ctuq.data.io._atomic import atomic_output
from ctuq.data.io._common import (attr_str, check_array, check_input_file, dumps,
                                  errors_name_the_file, loads, sniff, to_jsonable)
from ctuq.errors import InputError

log = logging.getLogger(__name__)

DEFINITION = "NXtomoproc"
_ARRAYS = ("reconstruction", "std", "variance", "samples", "fbp", "dip", "ground_truth")
_UNCERTAINTY = ("variance", "samples", "fbp", "dip")


def _default_version() -> str:
    import ctuq
    return str(getattr(ctuq, "__version__", "0"))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(eq=False)
class Result:
    """A reconstruction with its uncertainty and everything needed to redo it.

    Parameters
    ----------
    reconstruction : array_like, shape (H, W) or (S, H, W)
        Posterior mean image(s), float32.
    std : array_like, same shape
        Posterior standard deviation (>= 0).
    variance : array_like, optional
        Posterior variance, same shape (>= 0).
    samples : array_like, optional
        A subset of posterior samples, ``(k, H, W)`` or ``(S, k, H, W)``.
    fbp, dip, ground_truth : array_like, optional
        Same shape as ``reconstruction``.
    geometry : Geometry, optional
        Its ``image_shape`` must be ``(H, W)``; gives the axes in mm.
    config : dict
        The full effective configuration, JSON-able (tuples read back as lists).
    hyperparameters : dict
        Learned hyperparameters, name -> float or list of floats.
    em_trace : list of dict
        One JSON-able dict per EM step.
    metrics : dict
        Name -> float (PSNR, SSIM, calibration, ...), when a ground truth was known.
    input_path, input_sha256 : str, optional
        The input file and its SHA-256 (see :func:`ctuq.data.io.sha256_file`).
    seed : int, optional
    device : str, optional
    units : str, optional
        Units of ``reconstruction`` (e.g. ``"1/mm"``), written as ``@units``.
    version : str
        ctuq version; default ``ctuq.__version__`` (``"0"`` if unset).
    created : str
        ISO 8601 creation time; default now (UTC).

    Raises
    ------
    InputError
        Wrong shapes or dimensions, non-finite values, negative std/variance,
        a geometry that does not match, or fields of the wrong type.
    """

    reconstruction: np.ndarray
    std: np.ndarray
    variance: np.ndarray | None = None
    samples: np.ndarray | None = None
    fbp: np.ndarray | None = None
    dip: np.ndarray | None = None
    ground_truth: np.ndarray | None = None
    geometry: Geometry | None = None
    config: dict[str, Any] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    em_trace: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    input_path: str | None = None
    input_sha256: str | None = None
    seed: int | None = None
    device: str | None = None
    units: str | None = None
    version: str = field(default_factory=_default_version)
    created: str = field(default_factory=_now)

    def __post_init__(self):
        rec = check_array(self.reconstruction, file=None, field="reconstruction", ndims=(2, 3))
        self.reconstruction = rec
        for name in ("std", "variance", "fbp", "dip", "ground_truth"):
            v = getattr(self, name)
            if v is None:
                continue
            arr = check_array(v, file=None, field=name, ndims=(rec.ndim,))
            if arr.shape != rec.shape:
                raise InputError(f"has shape {arr.shape}; the reconstruction has {rec.shape}",
                                 field=name)
            if name in ("std", "variance") and np.any(arr < 0):
                raise InputError("has negative values", field=name)
            setattr(self, name, arr)
        if self.std is None:
            raise InputError("is required", field="std")
        if self.samples is not None:
            s = check_array(self.samples, file=None, field="samples", ndims=(rec.ndim + 1,))
            want = (rec.shape[:-2] + (s.shape[rec.ndim - 2],) + rec.shape[-2:])
            if s.shape != want:
                raise InputError(f"has shape {s.shape}; (k, H, W) or (S, k, H, W) matching the "
                                 f"reconstruction {rec.shape} expected", field="samples")
            self.samples = s
        if self.geometry is not None:
            if not isinstance(self.geometry, Geometry):
                raise InputError(f"must be a Geometry, got {type(self.geometry).__name__}",
                                 field="geometry")
            if tuple(self.geometry.image_shape) != rec.shape[-2:]:
                raise InputError(f"image shape {self.geometry.image_shape} does not match the "
                                 f"reconstruction {rec.shape}", field="geometry")
        for name, kind in (("config", dict), ("hyperparameters", dict), ("metrics", dict),
                           ("em_trace", list)):
            if not isinstance(getattr(self, name), kind):
                raise InputError(f"must be a {kind.__name__}", field=name)
        if not all(isinstance(step, dict) for step in self.em_trace):
            raise InputError("must be a list of dicts, one per EM step", field="em_trace")
        metrics = {}
        for k, v in self.metrics.items():
            if not isinstance(k, str) or not k or "/" in k or k in (".", ".."):
                raise InputError(f"metric name {k!r} must be a non-empty string without '/'",
                                 field="metrics")
            try:
                metrics[k] = float(v)
            except (TypeError, ValueError):
                raise InputError(f"must be a number, got {v!r}", field=f"metrics.{k}") from None
        self.metrics = metrics
        for name in ("input_path", "input_sha256", "device", "units", "version", "created"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, os.PathLike):
                    v = os.fspath(v)
                if not isinstance(v, str):
                    raise InputError(f"must be a string, got {type(v).__name__}", field=name)
                setattr(self, name, v)
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
                raise InputError(f"must be an integer, got {self.seed!r}", field="seed")
            self.seed = int(self.seed)

    @property
    def is_stack(self) -> bool:
        return self.reconstruction.ndim == 3

    def __eq__(self, other) -> bool:
        if not isinstance(other, Result):
            return NotImplemented
        for name in _ARRAYS:
            a, b = getattr(self, name), getattr(other, name)
            if (a is None) != (b is None):
                return False
            if a is not None and not np.array_equal(a, b, equal_nan=True):
                return False
        if (self.geometry is None) != (other.geometry is None):
            return False
        if self.geometry is not None and self.geometry != other.geometry:
            return False
        same_metrics = (self.metrics.keys() == other.metrics.keys() and all(
            self.metrics[k] == other.metrics[k]
            or (math.isnan(self.metrics[k]) and math.isnan(other.metrics[k]))
            for k in self.metrics))
        return same_metrics and all(getattr(self, n) == getattr(other, n) for n in (
            "config", "hyperparameters", "em_trace", "input_path", "input_sha256", "seed",
            "device", "units", "version", "created"))

    __hash__ = None


# -- writing -------------------------------------------------------------------
def _h5_name_ok(name) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and name not in (".", "..")


def _numeric_array(value):
    """float64 array of a number or (nested, rectangular) list of numbers, else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if arr.dtype == object:
        return None
    return arr


def _write_key_fields(group, config: dict) -> None:
    """Readable copies of the config's scalar and numeric-list leaves."""
    for k, v in config.items():
        if not _h5_name_ok(k) or k in group:
            continue
        if isinstance(v, dict):
            _write_key_fields(H.new_group(group, k, "NXcollection"), v)
        elif isinstance(v, str):
            H.write_str(group, k, v)
        elif isinstance(v, bool):
            group.create_dataset(k, data=np.bool_(v))
        else:
            arr = _numeric_array(v)
            if arr is not None:
                if isinstance(v, int):
                    arr = np.int64(v)
                group.create_dataset(k, data=arr)


def _trace_arrays(trace: list[dict]) -> dict[str, np.ndarray]:
    """Per-key float arrays over the EM steps (NaN where a step lacks the key);
    keys with non-numeric or ragged values are left to the JSON text."""
    keys: list[str] = []
    for step in trace:
        keys.extend(k for k in step if k not in keys)
    out = {}
    for k in keys:
        vals = [_numeric_array(step[k]) if k in step else None for step in trace]
        present = [v for v in vals if v is not None]
        if len(present) != sum(k in step for step in trace) or not present:
            continue
        shape = present[0].shape
        if any(v.shape != shape for v in present) or len(shape) > 1:
            continue
        rows = [v if v is not None else np.full(shape, np.nan) for v in vals]
        out[k] = np.stack(rows) if shape else np.array(rows, dtype=np.float64)
    return out


def _axes(result: Result) -> tuple[list[str], dict[str, tuple[np.ndarray, str]]]:
    rec = result.reconstruction
    h, w = rec.shape[-2:]
    if result.geometry is not None:
        p = result.geometry.pixel_size
        y = (np.arange(h) + 0.5 - h / 2) * p
        x = (np.arange(w) + 0.5 - w / 2) * p
        units = "mm"
    else:
        y, x, units = np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), "pixel"
    axes = {"y": (y, units), "x": (x, units)}
    names = ["y", "x"]
    if rec.ndim == 3:
        axes["slice"] = (np.arange(rec.shape[0], dtype=np.int64), "")
        names = ["slice"] + names
    return names, axes


def write_result(path, result: Result, *, overwrite: bool = False) -> Path:
    """Write a :class:`Result` as a NeXus NXtomoproc HDF5 file, atomically.

    Parameters
    ----------
    path : path-like
        Output file (conventionally ``.h5`` or ``.nxs``).
    result : Result
    overwrite : bool, optional
        Replace an existing file; the input file (``result.input_path``) is
        never replaced. Default False.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    InputError
        The target exists (without ``overwrite``), is the input, or cannot be
        written; a dict is not JSON-able. Nothing is left behind on failure.
    """
    if not isinstance(result, Result):
        raise InputError(f"must be a Result, got {type(result).__name__}", field="result")
    # Everything that can fail on content is converted before the file exists.
    texts = {
        "config": dumps(result.config, field="config", file=path),
        "hyperparameters": dumps(result.hyperparameters, field="hyperparameters", file=path),
        "em_trace": dumps(result.em_trace, field="em_trace", file=path),
    }
    config = to_jsonable(result.config, field="config", file=path)
    hyper = to_jsonable(result.hyperparameters, field="hyperparameters", file=path)
    trace = to_jsonable(result.em_trace, field="em_trace", file=path)
    H.require_h5py()
    with atomic_output(path, overwrite=overwrite, protect=[result.input_path]) as tmp:
        with H.h5py.File(tmp, "w") as f:
            _write(f, result, texts, config, hyper, trace)
    return Path(os.fspath(path))


def _write(f, r: Result, texts, config, hyper, trace) -> None:
    f.attrs["default"] = "entry"
    f.attrs["creator"] = f"ctuq {r.version}"
    entry = H.new_group(f, "entry", "NXentry", default="data")
    H.write_str(entry, "definition", DEFINITION)
    name = Path(r.input_path).name if r.input_path else "reconstruction"
    H.write_str(entry, "title", f"ctuq reconstruction of {name}")
    H.write_str(entry, "start_time", r.created)

    inst = H.new_group(entry, "instrument", "NXinstrument")
    src = H.new_group(inst, "source", "NXsource")
    H.write_str(src, "type", "X-ray")
    H.write_str(src, "name", "unknown")
    H.write_str(src, "probe", "x-ray")

    sample = H.new_group(entry, "sample", "NXsample")
    H.write_str(sample, "name", name)
    if r.ground_truth is not None:
        H.write_array(sample, "ground_truth", r.ground_truth, units=r.units)

    proc = H.new_group(entry, "reconstruction", "NXprocess")
    H.write_str(proc, "program", "ctuq")
    H.write_str(proc, "version", r.version)
    H.write_str(proc, "date", r.created)
    params = H.new_group(proc, "parameters", "NXparameters")
    H.write_str(params, "config_json", texts["config"])
    if r.input_path is not None:
        H.write_str(params, "raw_file", r.input_path)
    _write_key_fields(params, config)

    hp = H.new_group(proc, "hyperparameters", "NXcollection")
    for k, v in hyper.items():
        arr = _numeric_array(v)
        if _h5_name_ok(k) and arr is not None:
            hp.create_dataset(k, data=arr)
    H.write_str(proc, "hyperparameters_json", texts["hyperparameters"])
    em = H.new_group(proc, "em_trace", "NXcollection", n_steps=len(trace))
    for k, arr in _trace_arrays(trace).items():
        if _h5_name_ok(k):
            em.create_dataset(k, data=arr)
    H.write_str(proc, "em_trace_json", texts["em_trace"])
    if r.geometry is not None:
        gg = H.new_group(proc, "geometry", "NXcollection")
        H.write_str(gg, "json", dumps(r.geometry.to_dict(), field="geometry"))
        H.write_array(gg, "angles_rad", np.asarray(r.geometry.angles, dtype=np.float64),
                      units="rad")
    if r.input_path is not None:
        H.write_str(proc, "input_file", r.input_path)
    if r.input_sha256 is not None:
        H.write_str(proc, "input_sha256", r.input_sha256)
    if r.seed is not None:
        proc.create_dataset("seed", data=np.int64(r.seed))
    if r.device is not None:
        H.write_str(proc, "device", r.device)

    names, axes = _axes(r)
    nxdata = H.new_group(entry, "data", "NXdata", signal="data", axes=H.str_list(names))
    for i, n in enumerate(names):
        nxdata.attrs[f"{n}_indices"] = np.int64(i)
    extra = {} if r.units is None else {"units": r.units}
    H.write_array(nxdata, "data", r.reconstruction, long_name="posterior mean", **extra)
    H.write_array(nxdata, "data_errors", r.std, long_name="posterior standard deviation",
                  **extra)
    for n in names:
        values, units = axes[n]
        ds = H.write_array(nxdata, n, values)
        if units:
            ds.attrs["units"] = units

    if any(getattr(r, n) is not None for n in _UNCERTAINTY):
        unc = H.new_group(entry, "uncertainty", "NXcollection")
        for n in _UNCERTAINTY:
            v = getattr(r, n)
            if v is not None:
                ds = H.write_array(unc, n, v)
                if n == "samples":
                    ds.attrs["axes"] = H.str_list((["slice"] if r.is_stack else [])
                                                  + ["sample", "y", "x"])
    if r.metrics:
        met = H.new_group(entry, "metrics", "NXcollection")
        for k, v in r.metrics.items():
            met.create_dataset(k, data=np.float64(v))


# -- reading -------------------------------------------------------------------
def _result_entry(f, *, file):
    """The name of the NXtomoproc entry of an open file, or None."""
    try:
        names = list(f.keys())
    except (KeyError, OSError, ValueError, RuntimeError) as exc:
        raise InputError(f"cannot list the file's contents: corrupt file ({exc})",
                         file=file) from exc
    for n in (["entry"] if "entry" in names else []) + [n for n in names if n != "entry"]:
        g = H.get(f, n, file=file, kind="any")
        if not isinstance(g, H.h5py.Group):
            continue
        d = H.get(g, "definition", file=file, kind="any")
        if isinstance(d, H.h5py.Dataset):
            if (attr_str(H.read(d, file=file)) or "").strip() == DEFINITION:
                return n
    return None


def is_result_file(f, *, file) -> bool:
    """True when an open HDF5 file has an entry with ``definition = "NXtomoproc"``."""
    return _result_entry(f, file=file) is not None


def read_result(path) -> Result:
    """Read a result file written by :func:`write_result`.

    Parameters
    ----------
    path : path-like

    Returns
    -------
    Result
        Equal to the one written (dict values as JSON gives them back).

    Raises
    ------
    InputError
        Missing, not HDF5, corrupt or truncated, not an NXtomoproc file,
        missing or malformed fields.
    """
    p = check_input_file(path)
    if sniff(p) != "hdf5":
        raise InputError("not a ctuq result file (not HDF5)", file=p)
    with errors_name_the_file(p), H.open_h5(p) as f:
        name = _result_entry(f, file=p)
        if name is None:
            raise InputError(f"not a ctuq result file (no entry with definition = "
                             f"{DEFINITION!r})", file=p, field="/entry/definition")
        return _read(f[name], file=p)


def _read(entry, *, file) -> Result:
    def arr(path, required=False, ndims=(2, 3)):
        return H.read_array(entry, path, file=file, required=required, ndims=ndims,
                            dtype=np.float32)

    kw: dict[str, Any] = {
        "reconstruction": arr("data/data", required=True),
        "std": arr("data/data_errors", required=True),
        "ground_truth": arr("sample/ground_truth"),
    }
    for n in _UNCERTAINTY:
        kw[n] = arr(f"uncertainty/{n}", ndims=(3, 4) if n == "samples" else (2, 3))
    ds = H.get(entry, "data/data", file=file)
    u = attr_str(H.attr(ds, "units", file=file))
    kw["units"] = u

    proc = H.get(entry, "reconstruction", file=file, kind="group", required=True)

    def text(path, required=False):
        return H.read_str(proc, path, file=file, required=required)

    def json_of(path, kind, default):
        t = text(path)
        return default if t is None else loads(t, file=file, field=f"{proc.name}/{path}",
                                               kind=kind)

    kw["config"] = json_of("parameters/config_json", dict, {})
    kw["hyperparameters"] = json_of("hyperparameters_json", dict, {})
    kw["em_trace"] = json_of("em_trace_json", list, [])
    kw["version"] = text("version") or "0"
    kw["created"] = text("date") or ""
    kw["input_path"] = text("input_file")
    kw["input_sha256"] = text("input_sha256")
    kw["device"] = text("device")
    seed_ds = H.get(proc, "seed", file=file)
    if seed_ds is not None:
        seed = np.asarray(H.read(seed_ds, file=file))
        if seed.ndim != 0 or seed.dtype.kind not in "iu":
            raise InputError("must be an integer scalar", file=file, field=seed_ds.name)
        kw["seed"] = int(seed)
    gg = H.get(proc, "geometry", file=file, kind="group")
    if gg is not None:
        gdict = loads(H.read_str(gg, "json", file=file, required=True), file=file,
                      field=f"{gg.name}/json", kind=dict)
        rad = H.read_array(gg, "angles_rad", file=file, ndims=(1,))
        if rad is not None:
            gdict = {**gdict, "angles_rad": rad}
        part = _resolve.normalise(gdict, file=file, source=f"{gg.name}/json")
        missing = [k for k in ("image_shape", "n_detector", "angles") if k not in part]
        if missing:
            raise InputError("is missing from the stored geometry", file=file,
                             field=f"{gg.name}/json.{missing[0]}")
        try:
            kw["geometry"] = Geometry(image_shape=part["image_shape"], angles=part["angles"],
                                      n_detector=part["n_detector"],
                                      pixel_size=part.get("pixel_size", 1.0),
                                      detector_spacing=part.get("detector_spacing"),
                                      beam=part.get("beam", "parallel"),
                                      source_origin=part.get("source_origin"),
                                      origin_detector=part.get("origin_detector"))
        except InputError as exc:
            raise InputError(exc.message, file=file, field=f"{gg.name}/{exc.field}") from exc
    met = H.get(entry, "metrics", file=file, kind="group")
    metrics = {}
    if met is not None:
        for k in met.keys():
            v = H.read_array(met, k, file=file, ndims=(0,), finite=False)
            metrics[k] = float(v)
    kw["metrics"] = metrics
    try:
        return Result(**kw)
    except InputError as exc:
        raise InputError(exc.message, file=file, field=exc.field) from exc
