"""Result files: the NeXus NXtomoproc format of a
:class:`~ctuq.data.io.results.Result` (:func:`write_fields`, :func:`read_fields`).

This module owns the file format and knows nothing of the ``Result`` type
(which owns :func:`~ctuq.data.io.results.write_result` and
:func:`~ctuq.data.io.results.read_result` and calls in here): the import goes
one way, type to format.

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
        geometry/                       NXcollection: json, angles_rad, lengths @units
        provenance/                     NXcollection: library versions, threads, device,
                                        run id, request (JSON) [if known]
        input_file, input_sha256, seed, device   [each if known]
      data/                             NXdata @signal="data" @axes=["y","x"] or
                                        ["slice","y","x"], @<axis>_indices
        data         posterior mean  [H, W] or [S, H, W] float32 @units
        data_errors  total std: posterior and model error (same shape) @units
        y, x         pixel centres, @units = "mm" ("pixel" without a geometry);
                     y grows upwards (row 0 has the largest y), x to the right
        [slice]      slice index
      uncertainty/                      NXcollection  [if any]
        variance (total), posterior_std, model_error_std,
        samples [k,H,W] / [S,k,H,W], fbp, dip              @units
      metrics/                          NXcollection  [if any]: one float per metric
      diagnostics/                      NXcollection  [if any] @verdict, @reason,
                                        @threshold, @chi2_dof
        json            the diagnostics dict, JSON text (exact)
        residual        whitened residual (y - A x)/sigma [n_angles, n_detector]
                        or [S, n_angles, n_detector] float32
        chi2_per_angle  [n_angles] or [S, n_angles]

A result may hold a single image (napari's export of one layer, e.g. the std
map alone): without a reconstruction, ``data/`` holds that image under its
own name (``std``, ``fbp``...) as the signal. Images carry ``@units``
(``1/mm`` for attenuation from line integrals, its square for the variance),
lengths ``mm``, angles ``rad``/``degree``, times ``s``, PSNR ``dB``; integer
counts are stored as integers and empty arrays are not stored.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ctuq.data.geometry import Geometry
from ctuq.data.io import _hdf5 as H
from ctuq.data.io import _resolve
from ctuq.data.io._atomic import atomic_output
from ctuq.data.io._common import (attr_str, check_input_file, dumps, errors_name_the_file,
                                  loads, sniff, to_jsonable)
from ctuq.errors import InputError

DEFINITION = "NXtomoproc"
#: Arrays stored under ``uncertainty/`` (each optional).
_UNCERTAINTY = ("variance", "posterior_std", "model_error_std", "samples", "fbp", "dip")
#: Images of a result, in the order a single-image file picks its signal.
_IMAGES = ("reconstruction", "std", "fbp", "dip", "ground_truth", "variance", "posterior_std",
           "model_error_std")
#: Units of metrics by name prefix (the others are dimensionless).
_METRIC_UNITS = {"psnr": "dB", "seconds": "s"}


def squared_units(units: str | None) -> str | None:
    """Units of a variance: ``1/mm`` -> ``1/mm^2``, ``u`` -> ``(u)^2``."""
    if not units:
        return None
    if units.startswith("1/") and "^" not in units and " " not in units:
        return f"{units}^2"
    return f"({units})^2"

log = logging.getLogger(__name__)


# -- writing -------------------------------------------------------------------
def _h5_name_ok(name) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and name not in (".", "..")


def _all_int(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_all_int(v) for v in value)
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _numeric_array(value):
    """An int64 (all integers) or float64 array of a number or a (nested,
    rectangular) list of numbers; None for anything else or an empty list."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        arr = np.asarray(value, dtype=np.int64 if _all_int(value) else np.float64)
    except (TypeError, ValueError, OverflowError):
        return None
    if arr.dtype == object or arr.size == 0:
        return None
    return arr


def _write_key_fields(group, config: dict, units: str | None = None) -> None:
    """Readable copies of the config's scalar and numeric-list leaves; a table
    whose name ends in ``_s`` holds seconds."""
    for k, v in config.items():
        if not _h5_name_ok(k) or k in group:
            continue
        if isinstance(v, dict):
            _write_key_fields(H.new_group(group, k, "NXcollection"), v,
                              "s" if k.endswith("_s") else units)
        elif isinstance(v, str):
            H.write_str(group, k, v)
        elif isinstance(v, bool):
            group.create_dataset(k, data=np.bool_(v))
        else:
            arr = _numeric_array(v)
            if arr is not None:
                ds = group.create_dataset(k, data=arr)
                if units:
                    ds.attrs["units"] = units


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
        if len(present) == len(vals) and all(v.dtype.kind == "i" for v in present):
            out[k] = np.stack(present) if shape else np.array(present, dtype=np.int64)
            continue
        rows = [v.astype(np.float64) if v is not None else np.full(shape, np.nan)
                for v in vals]
        out[k] = np.stack(rows) if shape else np.array(rows, dtype=np.float64)
    return out


def _axes(result) -> tuple[list[str], dict[str, tuple[np.ndarray, str]]]:
    rec = result.image
    h, w = rec.shape[-2:]
    if result.geometry is not None:
        # pixel centres in mm, rotation axis at 0; y grows upwards (against the rows)
        p = result.geometry.pixel_size
        drow, dcol = result.geometry.image_offset
        y = -(np.arange(h) + 0.5 - h / 2 + drow) * p
        x = (np.arange(w) + 0.5 - w / 2 + dcol) * p
        units = "mm"
    else:
        y, x, units = np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), "pixel"
    axes = {"y": (y, units), "x": (x, units)}
    names = ["y", "x"]
    if rec.ndim == 3:
        axes["slice"] = (np.arange(rec.shape[0], dtype=np.int64), "")
        names = ["slice"] + names
    return names, axes


def write_fields(path, result, *, overwrite: bool = False) -> Path:
    """The file-format half of :func:`ctuq.data.io.results.write_result` (which checks
    the result's type and documents the parameters): write ``result`` to ``path``
    as a NeXus NXtomoproc HDF5 file, atomically."""
    # Everything that can fail on content is converted before the file exists.
    texts = {
        "config": dumps(result.config, field="config", file=path),
        "hyperparameters": dumps(result.hyperparameters, field="hyperparameters", file=path),
        "em_trace": dumps(result.em_trace, field="em_trace", file=path),
        "provenance": dumps(result.provenance, field="provenance", file=path),
        "diagnostics": dumps(result.diagnostics, field="diagnostics", file=path),
    }
    config = to_jsonable(result.config, field="config", file=path)
    hyper = to_jsonable(result.hyperparameters, field="hyperparameters", file=path)
    trace = to_jsonable(result.em_trace, field="em_trace", file=path)
    H.require_h5py()
    with atomic_output(path, overwrite=overwrite, protect=[result.input_path]) as tmp:
        with H.new_file(tmp) as f:
            _write(f, result, texts, config, hyper, trace)
    return Path(os.fspath(path))


#: ``@long_name`` of the spreads: ``std`` is the total, posterior and model error together.
LONG_NAMES = {"std": "total standard deviation (posterior and model error)",
              "variance": "total variance (posterior and model error)",
              "posterior_std": "posterior standard deviation",
              "model_error_std": "model error standard deviation"}


def _image(group, name: str, data, units, **attrs):
    """An image dataset with its units (when known)."""
    extra = {} if units is None else {"units": units}
    return H.write_array(group, name, data, **extra, **attrs)


def _write(f, r, texts, config, hyper, trace) -> None:
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

    # the NXdata signal: the reconstruction (with its std as errors), else the one image
    signal = "reconstruction" if r.reconstruction is not None else next(
        n for n in _IMAGES if getattr(r, n) is not None)
    in_data = {"reconstruction", "std"} if signal == "reconstruction" else {signal}

    sample = H.new_group(entry, "sample", "NXsample")
    H.write_str(sample, "name", name)
    if r.ground_truth is not None and "ground_truth" not in in_data:
        _image(sample, "ground_truth", r.ground_truth, r.units)

    proc = H.new_group(entry, "reconstruction", "NXprocess")
    H.write_str(proc, "program", "ctuq")
    H.write_str(proc, "version", r.version)
    H.write_str(proc, "date", r.created)
    # which images the file holds, so that a missing one is an error, not "absent"
    proc.create_dataset("images", data=H.str_list(
        [n for n in _IMAGES + ("samples",) if getattr(r, n) is not None]))
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
    em = H.new_group(proc, "em_trace", "NXcollection", n_steps=np.int64(len(trace)))
    for k, arr in _trace_arrays(trace).items():
        if _h5_name_ok(k):
            em.create_dataset(k, data=arr)
    H.write_str(proc, "em_trace_json", texts["em_trace"])
    if r.geometry is not None:
        g = r.geometry
        gg = H.new_group(proc, "geometry", "NXcollection")
        H.write_str(gg, "json", dumps(g.to_dict(), field="geometry"))
        H.write_array(gg, "angles_rad", np.asarray(g.angles, dtype=np.float64), units="rad")
        H.write_str(gg, "beam", g.beam)
        gg.create_dataset("image_shape", data=np.asarray(g.image_shape, dtype=np.int64))
        gg["image_shape"].attrs["units"] = "pixel"
        gg.create_dataset("n_detector", data=np.int64(g.n_detector))
        for key in ("pixel_size", "detector_spacing", "source_origin", "origin_detector"):
            if getattr(g, key) is not None:
                H.write_array(gg, key, np.float64(getattr(g, key)), units="mm")
        H.write_array(gg, "center_offset", np.float64(g.center_offset), units="pixel")
    if r.provenance:
        pv = H.new_group(proc, "provenance", "NXcollection")
        H.write_str(pv, "json", texts["provenance"])
        for k, v in to_jsonable(r.provenance, field="provenance").items():
            if not _h5_name_ok(k):
                continue
            if isinstance(v, str):
                H.write_str(pv, k, v)
            elif isinstance(v, dict) and all(isinstance(x, str) for x in v.values()):
                sub = H.new_group(pv, k, "NXcollection")
                for kk, vv in v.items():
                    if _h5_name_ok(kk):
                        H.write_str(sub, kk, vv)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                pv.create_dataset(k, data=_numeric_array(v))
    if r.input_path is not None:
        H.write_str(proc, "input_file", r.input_path)
    if r.input_sha256 is not None:
        H.write_str(proc, "input_sha256", r.input_sha256)
    if r.seed is not None:
        proc.create_dataset("seed", data=np.int64(r.seed))
    if r.device is not None:
        H.write_str(proc, "device", r.device)

    names, axes = _axes(r)
    signal_name = "data" if signal == "reconstruction" else signal
    nxdata = H.new_group(entry, "data", "NXdata", signal=signal_name, axes=H.str_list(names))
    for i, n in enumerate(names):
        nxdata.attrs[f"{n}_indices"] = np.int64(i)
    if signal == "reconstruction":
        _image(nxdata, "data", r.reconstruction, r.units, long_name="posterior mean")
        if r.std is not None:
            # the total: data_errors is what NeXus tools show as the error bars
            _image(nxdata, "data_errors", r.std, r.units, long_name=LONG_NAMES["std"])
    else:
        units = squared_units(r.units) if signal == "variance" else r.units
        _image(nxdata, signal, getattr(r, signal), units, long_name=signal.replace("_", " "))
    for n in names:
        values, units = axes[n]
        ds = H.write_array(nxdata, n, values)
        if units:
            ds.attrs["units"] = units
    if r.std is not None and "std" not in in_data:
        unc_std = r.std
    else:
        unc_std = None

    rest = [n for n in _UNCERTAINTY if getattr(r, n) is not None and n not in in_data]
    if rest or unc_std is not None:
        unc = H.new_group(entry, "uncertainty", "NXcollection")
        if unc_std is not None:
            _image(unc, "std", unc_std, r.units, long_name=LONG_NAMES["std"])
        for n in rest:
            v = getattr(r, n)
            ds = _image(unc, n, v, squared_units(r.units) if n == "variance" else r.units,
                        **({"long_name": LONG_NAMES[n]} if n in LONG_NAMES else {}))
            if n == "samples":
                ds.attrs["axes"] = H.str_list((["slice"] if r.is_stack else [])
                                              + ["sample", "y", "x"])
    if r.diagnostics or r.residual is not None:
        _write_diagnostics(entry, r, texts["diagnostics"])
    if r.metrics:
        met = H.new_group(entry, "metrics", "NXcollection")
        for k, v in r.metrics.items():
            ds = met.create_dataset(k, data=np.float64(v))
            unit = next((u for pre, u in _METRIC_UNITS.items() if k.startswith(pre)), None)
            if unit:
                ds.attrs["units"] = unit


def _write_diagnostics(entry, r, text: str) -> None:
    """``/entry/diagnostics``: the verdict as attributes, the dict as JSON, the residual."""
    d = r.diagnostics or {}
    attrs = {k: d[k] for k in ("verdict", "reason") if isinstance(d.get(k), str)}
    attrs.update({k: np.float64(d[k]) for k in ("threshold", "chi2_dof")
                  if isinstance(d.get(k), (int, float)) and not isinstance(d.get(k), bool)})
    g = H.new_group(entry, "diagnostics", "NXcollection", **attrs)
    H.write_str(g, "json", text)
    if r.residual is not None:
        H.write_array(g, "residual", r.residual,
                      long_name="whitened residual (y - A x) / sigma",
                      axes=H.str_list((["slice"] if r.residual.ndim == 3 else [])
                                      + ["angle", "detector"]))
    per_angle = _numeric_array(d.get("chi2_per_angle"))
    if per_angle is not None:
        g.create_dataset("chi2_per_angle", data=per_angle.astype(np.float64))


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


def read_fields(path) -> dict[str, Any]:
    """Read a result file written by :func:`write_fields`: the keyword arguments
    of a :class:`~ctuq.data.io.results.Result` (built by
    :func:`ctuq.data.io.results.read_result`).

    Parameters
    ----------
    path : path-like

    Returns
    -------
    dict
        The fields of the result written (dict values as JSON gives them back).

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


def _read(entry, *, file) -> dict[str, Any]:
    def arr(paths, ndims=(2, 3)):
        for path in paths:
            v = H.read_array(entry, path, file=file, ndims=ndims, dtype=np.float32)
            if v is not None:
                return v
        return None

    kw: dict[str, Any] = {
        "reconstruction": arr(["data/data"]),
        "std": arr(["data/data_errors", "uncertainty/std", "data/std"]),
        "ground_truth": arr(["sample/ground_truth", "data/ground_truth"]),
    }
    for n in _UNCERTAINTY:
        kw[n] = arr([f"uncertainty/{n}", f"data/{n}"], ndims=(3, 4) if n == "samples"
                    else (2, 3))
    if all(kw[n] is None for n in _IMAGES):
        raise InputError("holds no image (data/data missing)", file=file,
                         field=f"{entry.name}/data/data")
    nxdata = H.get(entry, "data", file=file, kind="group", required=True)
    signal = attr_str(H.attr(nxdata, "signal", file=file)) or "data"
    if not _h5_name_ok(signal):
        raise InputError(f"names an impossible signal {signal!r}", file=file,
                         field=f"{nxdata.name}@signal")
    ds = H.get(nxdata, signal, file=file, required=True)
    kw["units"] = attr_str(H.attr(ds, "units", file=file))
    listed = H.get(entry, "reconstruction/images", file=file)
    if listed is not None:
        names = H.read(listed, file=file)
        names = [attr_str(n) for n in np.atleast_1d(names)]
        for n in names:
            if n not in _IMAGES + ("samples",):
                raise InputError(f"lists an unknown image {n!r}", file=file, field=listed.name)
            if kw.get(n) is None:
                raise InputError(f"lists the image {n!r} but the file does not hold it",
                                 file=file, field=listed.name)
    if signal == "variance" and kw["units"]:
        kw["units"] = None  # squared units: the images' own unit is not stored

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
    kw["provenance"] = json_of("provenance/json", dict, {})
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
                                      origin_detector=part.get("origin_detector"),
                                      center_offset=part.get("center_offset", 0.0),
                                      image_offset=part.get("image_offset", (0.0, 0.0)))
        except InputError as exc:
            raise InputError(exc.message, file=file, field=f"{gg.name}/{exc.field}") from exc
    dg = H.get(entry, "diagnostics", file=file, kind="group")  # absent in older files
    if dg is not None:
        t = H.read_str(dg, "json", file=file)
        kw["diagnostics"] = {} if t is None else loads(t, file=file, field=f"{dg.name}/json",
                                                       kind=dict)
        kw["residual"] = H.read_array(dg, "residual", file=file, ndims=(2, 3),
                                      dtype=np.float32)
    met = H.get(entry, "metrics", file=file, kind="group")
    metrics = {}
    if met is not None:
        for k in met.keys():
            v = H.read_array(met, k, file=file, ndims=(0,), finite=False)
            metrics[k] = float(v)
    kw["metrics"] = metrics
    return kw
