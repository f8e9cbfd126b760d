"""NeXus NXtomo sinogram files: reading (any NXtomo, with flat/dark
correction) and writing ctuq's own (simulated) sinograms.

Layout written by :func:`write_sinogram` (see ``docs/file_formats.md``)::

    /entry                              NXentry, definition = "NXtomo"
      title
      instrument/                       NXinstrument
        source/                         NXsource: type, probe, [distance < 0, fan beam]
        detector/                       NXdetector
          data      [n_angles, n_det] or [n_angles, n_slices, n_det] float32
                    @quantity = "line_integral"
                    (raw frames, ``frames=``: [n_darks + n_flats + n_angles, ...]
                    counts, @quantity = "intensity")
          image_key [n_frames] int8: 0 projection (all, for line integrals),
                    1 flat, 2 dark
          x_pixel_size  detector spacing @units="mm"
          [distance]    rotation axis to detector, fan beam @units="mm"
      sample/                           NXsample
        name
        rotation_angle [n_frames] float64 @units="degree" (0 for flats, darks)
        [ground_truth] [H, W] or [n_slices, H, W] float32
                       @noise_level @noise_std @seed @phantom [@simulation ...]
      data/                             NXdata, links to data, rotation_angle, image_key
      ctuq/                             NXcollection: what NXtomo has no field for
        geometry    JSON text, Geometry.to_dict()
        angles_rad  [n_angles] float64 (exact radians)
        meta        JSON text, Sinogram.meta without source/format
        version
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from ctuq.data.io import _hdf5 as H
from ctuq.data.io import _resolve
from ctuq.data.io._atomic import atomic_output
from ctuq.data.io._common import (angles_rad, attr_str, check_array, check_shape, dumps,
                                  length_mm, loads)
from ctuq.data.io._loaded import Loaded, quantity_is_raw, to_line_integrals
from ctuq.data.io.options import is_auto
from ctuq.data.io.sinogram import Sinogram
from ctuq.errors import InputError

log = logging.getLogger(__name__)

DETECTOR_DATA = "instrument/detector/data"
#: meta keys copied onto /entry/sample/ground_truth as attributes
GT_ATTRS = ("noise_level", "noise_std", "seed", "phantom")


def _version() -> str:
    import ctuq
    return str(getattr(ctuq, "__version__", "0"))


# -- reading -------------------------------------------------------------------
def is_nxtomo_entry(group, *, file) -> bool:
    """True for a group holding ``instrument/detector`` (normally with its
    ``data``) or declaring ``definition = "NXtomo"``."""
    # an NXdetector without data is still an NXtomo entry, with a missing field
    if H.exists(group, "instrument/detector", file=file):
        return True
    ds = H.get(group, "definition", file=file, kind="any")
    if isinstance(ds, H.h5py.Dataset):
        return (attr_str(H.read(ds, file=file)) or "").strip() == "NXtomo"
    return False


def nxtomo_entries(f, *, file) -> list[str]:
    """Names of the top-level groups of ``f`` that are NXtomo entries."""
    out = []
    try:
        names = list(f.keys())
    except (KeyError, OSError, ValueError, RuntimeError) as exc:
        raise InputError(f"cannot list the file's contents: corrupt file ({exc})",
                         file=file) from exc
    for name in names:
        obj = H.get(f, name, file=file, kind="any")
        if isinstance(obj, H.h5py.Group) and is_nxtomo_entry(obj, file=file):
            out.append(name)
    return out


def _first(entry, names, *, file):
    for n in names:
        ds = H.get(entry, n, file=file)
        if ds is not None:
            return ds
    return None


def load_nxtomo(f, entry_name: str, *, file, raw: bool | None = None,
                angle_unit: str | None = None) -> Loaded:
    """Read one NXtomo entry of an open HDF5 file.

    Frames are selected by ``image_key`` (0 projection, 1 flat, 2 dark,
    3 invalid: skipped); without ``image_key`` every frame is a projection.
    Projections ``[frames, rows, det]`` become sinograms ``[rows, angles, det]``.
    """
    entry = H.get(f, entry_name, file=file, kind="group", required=True)
    ds = _first(entry, [DETECTOR_DATA, "data/data"], file=file)
    if ds is None:
        raise InputError("is missing", file=file, field=f"{entry.name}/{DETECTOR_DATA}")
    field = ds.name
    values = check_shape(H.read(ds, file=file), file=file, field=field, ndims=(2, 3))
    n_frames = values.shape[0]

    key_ds = _first(entry, ["instrument/detector/image_key", "data/image_key",
                            "instrument/detector/image_key_control"], file=file)
    if key_ds is not None:
        keys = check_array(H.read(key_ds, file=file), file=file, field=key_ds.name,
                           ndims=(1,), dtype=np.float64)
        if keys.size != n_frames:
            raise InputError(f"has {keys.size} entries for {n_frames} frames", file=file,
                             field=key_ds.name)
        bad = ~np.isin(keys, (0, 1, 2, 3))
        if bad.any():
            raise InputError(f"holds value {keys[bad][0]:g}; only 0 (projection), 1 (flat), "
                             "2 (dark) and 3 (invalid) are defined", file=file, field=key_ds.name)
        keys = keys.astype(np.int8)
    else:
        keys = np.zeros(n_frames, dtype=np.int8)
    is_proj = keys == 0
    n_proj = int(is_proj.sum())
    if n_proj == 0:
        raise InputError("no projection frames (image_key == 0)", file=file, field=field)
    flats = values[keys == 1] if np.any(keys == 1) else None
    darks = values[keys == 2] if np.any(keys == 2) else None
    proj = values[is_proj]

    meta: dict = {}
    file_raw = quantity_is_raw(H.attr(ds, "quantity", file=file), file=file,
                               field=f"{field}@quantity")
    data, variance = to_line_integrals(
        proj, flats=flats, darks=darks, file_raw=file_raw, raw=raw, file=file, field=field,
        flat_field=f"{field}[image_key==1]", dark_field=f"{field}[image_key==2]", meta=meta,
        with_variance=True)
    if data.ndim == 3:  # [angles, rows, det] -> [rows, angles, det]
        data = np.ascontiguousarray(data.transpose(1, 0, 2))
        if variance is not None:
            variance = np.ascontiguousarray(variance.transpose(1, 0, 2))

    # -- geometry from the standard fields
    std: dict = {}
    ang_ds = _first(entry, ["sample/rotation_angle", "data/rotation_angle"], file=file)
    if ang_ds is not None:
        ang = angles_rad(H.read(ang_ds, file=file), H.attr(ang_ds, "units", file=file),
                         file=file, field=ang_ds.name, unit=angle_unit)
        if ang.size == n_frames:
            ang = ang[is_proj]
        elif ang.size != n_proj:
            raise InputError(f"has {ang.size} angles for {n_frames} frames ({n_proj} "
                             "projections)", file=file, field=ang_ds.name)
        std["angles"] = ang
    px = H.get(entry, "instrument/detector/x_pixel_size", file=file)
    if px is not None:
        std["detector_spacing"] = length_mm(H.read(px, file=file), H.attr(px, "units", file=file),
                                            file=file, field=px.name)
    src = H.get(entry, "instrument/source/distance", file=file)
    det = H.get(entry, "instrument/detector/distance", file=file)
    det_mm = None
    if det is not None:
        det_mm = abs(length_mm(H.read(det, file=file), H.attr(det, "units", file=file),
                               file=file, field=det.name))
    if src is not None:
        # NXsource/distance is negative (upstream); a source distance means a fan beam
        std["source_origin"] = abs(length_mm(H.read(src, file=file),
                                             H.attr(src, "units", file=file),
                                             file=file, field=src.name))
        std["beam"] = "fan"
        if det_mm is not None:
            std["origin_detector"] = det_mm

    # -- ctuq's own collection: complete geometry and metadata
    part = std
    coll = H.get(entry, "ctuq", file=file, kind="group")
    if coll is not None:
        gtext = H.read_str(coll, "geometry", file=file)
        if gtext is not None:
            gdict = loads(gtext, file=file, field=f"{coll.name}/geometry", kind=dict)
            rad = H.read_array(coll, "angles_rad", file=file, ndims=(1,))
            if rad is not None:
                gdict = {**gdict, "angles_rad": rad}
            own = _resolve.normalise(gdict, file=file, source=f"{coll.name}/geometry")
            part = _resolve.merge(own, std, file=file, base_name=f"{coll.name}/geometry",
                                  extra_name="the NXtomo fields")
        mtext = H.read_str(coll, "meta", file=file)
        if mtext is not None:
            meta = {**loads(mtext, file=file, field=f"{coll.name}/meta", kind=dict), **meta}

    gt = None
    gt_ds = H.get(entry, "sample/ground_truth", file=file)
    if gt_ds is not None:
        gt = check_array(H.read(gt_ds, file=file), file=file, field=gt_ds.name, ndims=(2, 3))
        for k in GT_ATTRS:
            v = H.attr(gt_ds, k, file=file)
            if v is not None and k not in meta:
                meta[k] = attr_str(v) if attr_str(v) is not None else _plain(v)
    return Loaded(data=data, format="nxtomo", geometry=part, meta=meta, ground_truth=gt,
                  detector_distance=det_mm, variance=variance)


def _plain(v):
    v = np.asarray(v)
    if v.size == 1:
        v = v.reshape(-1)[0]
        return int(v) if v.dtype.kind in "iu" else float(v)
    return v.tolist()


# -- writing -------------------------------------------------------------------
def write_sinogram(path, sinogram: Sinogram, *, overwrite: bool = False,
                   frames: dict | None = None, truth_attrs: dict | None = None) -> Path:
    """Write a :class:`Sinogram` as a NeXus NXtomo file (ctuq's sinogram format).

    The file reads back with :func:`ctuq.data.io.read_sinogram` to an equal
    sinogram (data, geometry, ground truth; ``meta`` except ``source`` and
    ``format``, which describe the file read). Other NXtomo readers see
    line-integral projections, their angles and detector spacing.

    Parameters
    ----------
    path : path-like
        Output file (conventionally ``.nxs`` or ``.h5``).
    sinogram : Sinogram
        ``meta`` must be JSON-able (tuples come back as lists).
    overwrite : bool, optional
        Replace an existing file. The sinogram's own source file
        (``meta['source']``) is never overwritten. Default False.
    frames : dict, optional
        Raw detector frames to write *instead of* the line integrals:
        ``{'projections': (n_angles, [n_slices,] n_det), 'flats': (n_flats, ...),
        'darks': (n_darks, ...)}`` (``darks`` optional), in counts. They are
        written as one ``data`` array (darks, flats, projections) with
        ``image_key`` 2/1/0 and ``quantity = "intensity"``; ``rotation_angle``
        has one entry per frame (0 for flats and darks). Reading the file
        back gives ``-log((I - D̄)/(F̄ - D̄))``, not ``sinogram.data``.
        Default: write the line integrals.
    truth_attrs : dict, optional
        Extra attributes of ``/entry/sample/ground_truth`` (numbers or text),
        e.g. facts a benchmark keeps from the reconstruction; ctuq's reader
        does not read them. Needs a ground truth.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    InputError
        Target exists (without ``overwrite``), is the input, or its folder is
        missing; ``meta`` is not JSON-able. Nothing is left behind on failure.
    """
    if not isinstance(sinogram, Sinogram):
        raise InputError(f"must be a Sinogram, got {type(sinogram).__name__}", field="sinogram")
    meta = {k: v for k, v in sinogram.meta.items() if k not in ("source", "format")}
    meta_json = dumps(meta, field="meta", file=path)
    raw = None if frames is None else _raw_frames(sinogram, frames)
    if truth_attrs and sinogram.ground_truth is None:
        raise InputError("truth_attrs given but the sinogram has no ground truth",
                         field="truth_attrs")
    H.require_h5py()
    with atomic_output(path, overwrite=overwrite, protect=[sinogram.meta.get("source")]) as tmp:
        with H.new_file(tmp) as f:
            _write(f, sinogram, meta, meta_json, raw, dict(truth_attrs or {}))
    return Path(os.fspath(path))


def _raw_frames(s: Sinogram, frames: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(data, image_key)`` of raw frames: darks, flats, projections, in that order."""
    unknown = sorted(set(frames) - {"projections", "flats", "darks"})
    if unknown:
        raise InputError("unknown frame kind; expected projections, flats, darks",
                         field=f"frames.{unknown[0]}")
    for k in ("projections", "flats"):
        if frames.get(k) is None:
            raise InputError("is missing", field=f"frames.{k}")
    want = (s.geometry.n_angles,) + (s.data.shape[:1] if s.is_stack else ()) \
        + (s.geometry.n_detector,)
    parts, keys = [], []
    for k, key in (("darks", 2), ("flats", 1), ("projections", 0)):
        if frames.get(k) is None:
            continue
        arr = np.asarray(frames[k])
        if arr.dtype.kind not in "iuf" or arr.ndim != len(want) or arr.shape[1:] != want[1:] \
                or (key == 0 and arr.shape != want) or arr.shape[0] == 0:
            raise InputError(f"has shape {arr.shape} ({arr.dtype}); frames of shape "
                             f"{want[1:]} expected" + (f", {want[0]} of them" if key == 0 else ""),
                             field=f"frames.{k}")
        if not np.all(np.isfinite(arr)) or arr.min() < 0:
            raise InputError("must be finite and >= 0 (counts)", field=f"frames.{k}")
        parts.append(arr)
        keys.append(np.full(arr.shape[0], key, dtype=np.int8))
    return np.concatenate(parts).astype(np.float32), np.concatenate(keys)


def _write(f, s: Sinogram, meta: dict, meta_json: str, raw=None,
           truth_attrs: dict | None = None) -> None:
    g = s.geometry
    f.attrs["default"] = "entry"
    f.attrs["creator"] = f"ctuq {_version()}"
    entry = H.new_group(f, "entry", "NXentry", default="data")
    H.write_str(entry, "definition", "NXtomo")
    H.write_str(entry, "title", str(meta.get("title", "ctuq sinogram")))

    inst = H.new_group(entry, "instrument", "NXinstrument")
    src = H.new_group(inst, "source", "NXsource")
    H.write_str(src, "type", "Fixed Tube X-ray" if g.beam == "fan" else "Synchrotron X-ray Source")
    H.write_str(src, "probe", "x-ray")
    if g.beam == "fan":
        H.write_array(src, "distance", np.float64(-g.source_origin), units="mm")

    det = H.new_group(inst, "detector", "NXdetector")
    if raw is None:
        data = s.data if not s.is_stack else s.data.transpose(1, 0, 2)  # [angles, rows, det]
        H.write_array(det, "data", data, quantity="line_integral",
                      long_name="line integral -log(I/I0)")
        image_key = np.zeros(g.n_angles, dtype=np.int8)
    else:
        data, image_key = raw
        H.write_array(det, "data", data, quantity="intensity", long_name="detector counts")
    H.write_array(det, "image_key", image_key)
    H.write_array(det, "x_pixel_size", np.float64(g.detector_spacing), units="mm")
    if g.beam == "fan":
        H.write_array(det, "distance", np.float64(g.origin_detector), units="mm")

    sample = H.new_group(entry, "sample", "NXsample")
    H.write_str(sample, "name", str(meta.get("phantom", "sample")))
    angles = np.zeros(image_key.size)
    angles[image_key == 0] = g.angles_deg
    H.write_array(sample, "rotation_angle", angles, units="degree")
    if s.ground_truth is not None:
        attrs = {k: meta[k] for k in GT_ATTRS
                 if k in meta and isinstance(meta[k], (int, float, str, np.number))
                 and not isinstance(meta[k], bool)}
        attrs.update(truth_attrs or {})
        H.write_array(sample, "ground_truth", s.ground_truth, **attrs)

    nxdata = H.new_group(entry, "data", "NXdata", signal="data")
    nxdata["data"] = H.h5py.SoftLink("/entry/instrument/detector/data")
    nxdata["rotation_angle"] = H.h5py.SoftLink("/entry/sample/rotation_angle")
    nxdata["image_key"] = H.h5py.SoftLink("/entry/instrument/detector/image_key")

    coll = H.new_group(entry, "ctuq", "NXcollection")
    gdict = g.to_dict()
    if is_auto(meta.get("center_offset")):  # the centre is not known: the file does not state it
        gdict.pop("center_offset")
    H.write_str(coll, "geometry", dumps(gdict, field="geometry"))
    H.write_array(coll, "angles_rad", np.asarray(g.angles, dtype=np.float64), units="rad")
    H.write_str(coll, "meta", meta_json)
    H.write_str(coll, "version", _version())
