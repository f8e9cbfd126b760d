"""Reading sinograms from any supported file: format detection by content,
DXchange, plain HDF5, ``.npy``, ``.npz`` and TIFF readers, sidecar
geometry, and the public entry point :func:`read_sinogram`.

Formats are recognised by their first bytes (HDF5 signature, NumPy magic,
ZIP for ``.npz``, TIFF byte-order mark), never by the extension alone; HDF5
files are then told apart by structure: a ctuq result (``NXtomoproc``), an
NXtomo entry, DXchange (``/exchange/data``), or plain HDF5.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ctuq.data.io import _hdf5 as H
from ctuq.data.io import _resolve
from ctuq.data.io._common import (angles_rad, attr_str, check_array, check_input_file,
                                  check_shape, check_size, errors_name_the_file, loads,
                                  read_limits, sniff)
from ctuq.data.io._loaded import Loaded, quantity_is_raw, to_line_integrals
from ctuq.data.io.nxtomo import is_nxtomo_entry, load_nxtomo, nxtomo_entries
from ctuq.data.io.options import AUTO, is_auto
from ctuq.data.io.result_file import is_result_file
from ctuq.data.io.sidecar import read_sidecar, sidecar_path
from ctuq.data.io.sinogram import Sinogram
from ctuq.errors import InputError

log = logging.getLogger(__name__)

#: Values of ``format=`` / results of :func:`detect_format` for sinograms.
SINOGRAM_FORMATS = ("nxtomo", "dxchange", "hdf5", "npy", "npz", "tiff")
#: Formats whose geometry may come from a sidecar JSON file.
SIDECAR_FORMATS = ("hdf5", "npy", "npz", "tiff")
_EXTENSIONS = {".h5": "HDF5", ".hdf5": "HDF5", ".hdf": "HDF5", ".nxs": "NeXus/HDF5",
               ".nx": "NeXus/HDF5", ".cxi": "HDF5", ".npy": "NumPy .npy", ".npz": "NumPy .npz",
               ".tif": "TIFF", ".tiff": "TIFF"}
#: npz keys with a meaning besides the sinogram itself.
_NPZ_EXTRAS = ("angles_deg", "geometry", "ground_truth", "meta")


# -- detection ---------------------------------------------------------------
def _unrecognised(p: Path):
    ext = p.suffix.lower()
    if ext in _EXTENSIONS:
        raise InputError(f"has the extension {ext} but its content is not {_EXTENSIONS[ext]}: "
                         "corrupt, truncated or misnamed", file=p)
    raise InputError("not a recognised sinogram file: ctuq reads NeXus/HDF5 (.nxs, .h5), .npy, "
                     ".npz and TIFF (.tif) files", file=p)


def _hdf5_kind(f, p: Path) -> str:
    if is_result_file(f, file=p):
        return "result"
    if nxtomo_entries(f, file=p):
        return "nxtomo"
    if H.exists(f, "exchange", file=p) and H.exists(f, "exchange/data", file=p):
        return "dxchange"
    return "hdf5"


def detect_format(path) -> str:
    """What a file holds, judged by its content.

    Returns
    -------
    {'nxtomo', 'dxchange', 'hdf5', 'npy', 'npz', 'tiff', 'result'}
        ``'result'`` is a ctuq result file (read it with :func:`read_result`).

    Raises
    ------
    InputError
        Missing, empty, a directory, unreadable, corrupt, or none of these.
    """
    p = check_input_file(path)
    kind = sniff(p)
    if kind is None:
        _unrecognised(p)
    if kind != "hdf5":
        return kind
    try:
        with H.open_h5(p) as f:
            return _hdf5_kind(f, p)
    except InputError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
        raise InputError(f"cannot read the file ({type(exc).__name__}: {exc})", file=p) from exc


# -- format readers ----------------------------------------------------------
def _sinogram_layout_3d(data: np.ndarray) -> np.ndarray:
    """Projections ``[angles, rows, det]`` -> sinograms ``[rows, angles, det]``."""
    return np.ascontiguousarray(data.transpose(1, 0, 2)) if data.ndim == 3 else data


def load_dxchange(f, *, file, raw: bool | None = None, angle_unit: str | None = None) -> Loaded:
    """``/exchange/data`` (projections), ``data_white``, ``data_dark``, ``theta`` (degrees
    unless its ``units`` attribute says radians)."""
    ds = H.get(f, "exchange/data", file=file, required=True)
    values = check_shape(H.read(ds, file=file), file=file, field=ds.name, ndims=(2, 3))
    white = H.get(f, "exchange/data_white", file=file)
    dark = H.get(f, "exchange/data_dark", file=file)
    flats = None if white is None else check_shape(H.read(white, file=file), file=file,
                                                   field=white.name, ndims=(values.ndim - 1,
                                                                            values.ndim))
    darks = None if dark is None else check_shape(H.read(dark, file=file), file=file,
                                                  field=dark.name, ndims=(values.ndim - 1,
                                                                          values.ndim))
    meta: dict = {}
    file_raw = quantity_is_raw(H.attr(ds, "quantity", file=file), file=file,
                               field=f"{ds.name}@quantity")
    data, variance = to_line_integrals(
        values, flats=flats, darks=darks, file_raw=file_raw, raw=raw, file=file, field=ds.name,
        flat_field="/exchange/data_white", dark_field="/exchange/data_dark", meta=meta,
        with_variance=True)
    part: dict = {}
    th = H.get(f, "exchange/theta", file=file)
    if th is not None:
        ang = angles_rad(H.read(th, file=file), H.attr(th, "units", file=file), file=file,
                         field=th.name, unit=angle_unit)
        if ang.size != values.shape[0]:
            raise InputError(f"has {ang.size} angles for {values.shape[0]} projections in "
                             "/exchange/data", file=file, field=th.name)
        part["angles"] = ang
    return Loaded(_sinogram_layout_3d(data), "dxchange", part, meta,
                  variance=None if variance is None else _sinogram_layout_3d(variance))


def _attrs_geometry(ds, *, file) -> dict:
    """Partial geometry from a dataset's attributes (Geometry.to_dict names,
    or a ``geometry`` attribute holding that dict as JSON)."""
    found: dict[str, Any] = {}
    for key in _resolve._DICT_KEYS:
        v = H.attr(ds, key, file=file)
        if v is None:
            continue
        s = attr_str(v)
        found[key] = s if s is not None else (v.tolist() if isinstance(v, np.ndarray) else v)
    part = _resolve.normalise(found, file=file, source=f"{ds.name}@")
    gj = H.attr(ds, "geometry", file=file)
    if gj is not None:
        whole = _resolve.normalise(loads(gj, file=file, field=f"{ds.name}@geometry", kind=dict),
                                   file=file, source=f"{ds.name}@geometry")
        part = _resolve.merge(whole, part, file=file, base_name=f"{ds.name}@geometry",
                              extra_name="the other attributes")
    return part


def load_plain_hdf5(f, name: str, *, file, raw: bool | None = None) -> Loaded:
    """One dataset in sinogram layout ``[angles, det]`` or ``[slices, angles, det]``,
    geometry from its attributes, ``@quantity`` as for NXtomo."""
    ds = H.get(f, name, file=file, required=True)
    values = check_shape(H.read(ds, file=file), file=file, field=ds.name, ndims=(2, 3))
    file_raw = quantity_is_raw(H.attr(ds, "quantity", file=file), file=file,
                               field=f"{ds.name}@quantity")
    meta: dict = {"dataset": ds.name}
    data = to_line_integrals(values, file_raw=file_raw, raw=raw, file=file, field=ds.name,
                             meta=meta)
    return Loaded(data, "hdf5", _attrs_geometry(ds, file=file), meta)


def _list_datasets(f) -> list[str]:
    out: list[str] = []

    def visit(name, obj):
        if isinstance(obj, H.h5py.Dataset):
            out.append("/" + name)
    f.visititems(visit)
    return out


def _load_hdf5(p: Path, *, dataset, raw, format, angle_unit=None) -> Loaded:
    with H.open_h5(p) as f:
        if dataset is not None:
            obj = H.get(f, dataset, file=p, kind="any", required=True)
            if isinstance(obj, H.h5py.Group):
                if is_nxtomo_entry(obj, file=p):
                    return load_nxtomo(f, dataset, file=p, raw=raw, angle_unit=angle_unit)
                raise InputError("is a group; name the dataset holding the sinogram", file=p,
                                 field=dataset)
            return load_plain_hdf5(f, dataset, file=p, raw=raw)
        kind = format or _hdf5_kind(f, p)
        if kind == "result":
            raise InputError("is a ctuq result file (NXtomoproc), not a sinogram; open it with "
                             "read_result", file=p)
        if kind == "nxtomo":
            entries = nxtomo_entries(f, file=p)
            if not entries:
                raise InputError("no NXtomo entry (no instrument/detector/data)", file=p,
                                 field="/entry/instrument/detector/data")
            if len(entries) > 1:
                raise InputError(f"holds {len(entries)} NXtomo entries ({', '.join(entries)}); "
                                 "choose one with the dataset option (--dataset)", file=p,
                                 field="entry")
            return load_nxtomo(f, entries[0], file=p, raw=raw, angle_unit=angle_unit)
        if kind == "dxchange":
            return load_dxchange(f, file=p, raw=raw, angle_unit=angle_unit)
        if kind != "hdf5":
            raise InputError(f"is an HDF5 file, not {kind}", file=p, field="format")
        names = _list_datasets(f)
        if len(names) != 1:
            listing = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
            raise InputError(
                "is neither NXtomo nor DXchange; name the sinogram dataset with the dataset "
                f"option (--dataset) ({'no datasets' if not names else 'datasets: ' + listing})",
                file=p, field="dataset")
        log.info("%s: reading its only dataset %s", p, names[0])
        return load_plain_hdf5(f, names[0], file=p, raw=raw)


def _npy_header(fh, *, file, field: str, ndims=(2, 3), numeric: bool = True):
    """Shape and dtype of a ``.npy`` stream from its header, checked before reading."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise InputError(f"unsupported .npy format version {version}", file=file, field=field)
    if dtype.hasobject:
        raise InputError("holds Python objects (pickled); a number array is needed",
                         file=file, field=field)
    if numeric and dtype.kind not in "iuf":
        raise InputError(f"has a non-numeric dtype ({dtype}); a real number array is needed",
                         file=file, field=field)
    if ndims is not None and len(shape) not in ndims:
        raise InputError(f"has {len(shape)} dimension(s) {tuple(shape)}; 2 or 3 expected",
                         file=file, field=field)
    check_size(shape, dtype, file=file, field=field)
    return shape, fortran, dtype


def _load_npy(p: Path, *, raw) -> Loaded:
    with open(p, "rb") as fh:
        shape, _, dtype = _npy_header(fh, file=p, field="array")
        header_end = fh.tell()
    need = int(np.prod(shape)) * dtype.itemsize
    if p.stat().st_size - header_end < need:
        raise InputError(f"is truncated: the header declares {tuple(shape)} {dtype} "
                         f"({need} bytes) but the file holds {p.stat().st_size - header_end}",
                         file=p, field="array")
    arr = np.load(p, allow_pickle=False)
    meta: dict = {}
    data = to_line_integrals(check_shape(arr, file=p, field="array", ndims=(2, 3)),
                             file_raw=None, raw=raw, file=p, field="array", meta=meta)
    return Loaded(data, "npy", {}, meta)


def _npz_text(z, key, *, file) -> str:
    v = z[key]
    s = attr_str(v)
    if s is None:
        raise InputError("must be a text (JSON) array", file=file, field=key)
    return s


def _npz_check(p: Path, keys) -> None:
    """Check each npz member's header (dtype, size) before it is inflated."""
    import zipfile

    with zipfile.ZipFile(p) as zf:
        names = set(zf.namelist())
        for key in keys:
            name = f"{key}.npy" if f"{key}.npy" in names else key
            if name not in names:
                continue
            with zf.open(name) as fh:
                _npy_header(fh, file=p, field=key, ndims=None,
                            numeric=key not in ("geometry", "meta"))


def _load_npz(p: Path, *, dataset, raw) -> Loaded:
    with np.load(p, allow_pickle=False) as z:
        keys = list(z.files)
        _npz_check(p, keys)
        if dataset is not None:
            if dataset not in keys:
                raise InputError(f"no array named {dataset!r} (arrays: {', '.join(keys)})",
                                 file=p, field="dataset")
            key = dataset
        elif "sinogram" in keys:
            key = "sinogram"
        else:
            rest = [k for k in keys if k not in _NPZ_EXTRAS]
            if len(rest) != 1:
                raise InputError("cannot tell which array is the sinogram: name it 'sinogram' "
                                 f"or set the dataset option, --dataset (arrays: {', '.join(keys) or 'none'})",
                                 file=p, field="sinogram")
            key = rest[0]
        ignored = [k for k in keys if k != key and k not in _NPZ_EXTRAS]
        if ignored:
            log.warning("%s: ignoring arrays %s", p, ", ".join(ignored))
        values = check_shape(z[key], file=p, field=key, ndims=(2, 3))
        meta: dict = {}
        if "meta" in keys:
            meta.update(loads(_npz_text(z, "meta", file=p), file=p, field="meta", kind=dict))
        data = to_line_integrals(values, file_raw=None, raw=raw, file=p, field=key, meta=meta)
        part: dict = {}
        if "geometry" in keys:
            part = _resolve.normalise(loads(_npz_text(z, "geometry", file=p), file=p,
                                            field="geometry", kind=dict),
                                      file=p, source="geometry")
        if "angles_deg" in keys:
            ang = check_array(z["angles_deg"], file=p, field="angles_deg", ndims=(1,),
                              dtype=np.float64)
            part = _resolve.merge(part, {"angles": np.deg2rad(ang)}, file=p,
                                  base_name="geometry", extra_name="angles_deg")
        gt = None
        if "ground_truth" in keys:
            gt = check_array(z["ground_truth"], file=p, field="ground_truth", ndims=(2, 3))
    return Loaded(data, "npz", part, meta, ground_truth=gt)


class _Collect(logging.Handler):
    """Collects tifffile's complaints: it logs (and then skips) broken pages
    instead of raising, which would silently drop slices of a stack."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _tifffile_complaints():
    logger = logging.getLogger("tifffile")
    handler = _Collect()
    old = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # ours to report, as one InputError
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = old


def _load_tiff(p: Path, *, raw) -> Loaded:
    try:
        import tifffile
    except ImportError as exc:  # pragma: no cover - scikit-image brings it
        raise InputError("reading TIFF needs the tifffile package", file=p) from exc
    with _tifffile_complaints() as complaints:
        arr = _read_tiff_array(tifffile, p)
        if complaints:
            raise InputError(f"corrupt or truncated TIFF ({complaints[0]})", file=p)
    meta: dict = {}
    data = to_line_integrals(check_shape(arr, file=p, field="image", ndims=(2, 3)),
                             file_raw=None, raw=raw, file=p, field="image", meta=meta)
    return Loaded(data, "tiff", {}, meta)


def _read_tiff_array(tifffile, p: Path) -> np.ndarray:
    size = p.stat().st_size
    with tifffile.TiffFile(p) as tif:
        if len(tif.series) != 1:
            raise InputError(f"holds {len(tif.series)} image series; ctuq reads a single 2-D "
                             "image or a stack of equal pages", file=p, field="series")
        series = tif.series[0]
        check_size(series.shape, series.dtype, file=p, field="image")
        for i, page in enumerate(tif.pages):
            if getattr(page, "samplesperpixel", 1) > 1:
                raise InputError("is a colour/multi-sample image; a grey-scale sinogram is "
                                 "needed", file=p, field=f"page {i}")
            # tifffile may pad a truncated strip with zeros: refuse instead
            for off, n in zip(page.dataoffsets, page.databytecounts):
                if off + n > size:
                    raise InputError("is truncated: image data run past the end of the file",
                                     file=p, field=f"page {i}")
        return tif.asarray()


def _load(p: Path, *, dataset, raw, format, angle_unit=None) -> Loaded:
    kind = sniff(p)
    if kind is None:
        _unrecognised(p)
    if format is not None:
        want = "hdf5" if format in ("nxtomo", "dxchange", "hdf5") else format
        if want != kind:
            raise InputError(f"format={format!r} but the content is {kind}", file=p,
                             field="format")
    if dataset is not None and kind not in ("hdf5", "npz"):
        raise InputError("the dataset option applies to HDF5 and .npz files only", file=p,
                         field="dataset")
    if kind == "hdf5":
        return _load_hdf5(p, dataset=dataset, raw=raw, format=format, angle_unit=angle_unit)
    try:
        if kind == "npy":
            return _load_npy(p, raw=raw)
        if kind == "npz":
            return _load_npz(p, dataset=dataset, raw=raw)
        return _load_tiff(p, raw=raw)
    except (InputError, MemoryError):
        raise
    except Exception as exc:  # the library's view of a broken file
        what = {"npy": ".npy", "npz": ".npz", "tiff": "TIFF"}[kind]
        raise InputError(f"corrupt or truncated {what} file ({type(exc).__name__}: {exc})",
                         file=p) from exc


# -- public entry point --------------------------------------------------------
def read_sinogram(path, *, dataset: str | None = None, angles=None, geometry=None,
                  raw: bool | None = None, format: str | None = None,
                  convention: str = "astra", max_memory_gib: float | None = None,
                  allow_external: bool = False, assume_angles: bool = False,
                  **geometry_options) -> Sinogram:
    """Read a sinogram file of any supported format, with its geometry.

    Parameters
    ----------
    path : path-like
        NeXus NXtomo, DXchange, plain HDF5, ``.npy``, ``.npz`` or TIFF. The
        format is recognised from the content.
    dataset : str, optional
        HDF5: the dataset holding the sinogram (plain layout), or an NXtomo
        entry group when the file holds several. ``.npz``: the array's key.
    angles : array_like, optional
        Projection angles, shape ``(n_angles,)``, in ``angle_unit`` (default
        degrees).
    geometry : Geometry or dict, optional
        A full or partial geometry (dict in :meth:`Geometry.to_dict` form).
    raw : bool, optional
        True: the data are raw intensities (flat-normalised transmissions if
        the file has no flat frames) and get ``-log``; False: they are line
        integrals. Default: decided by the file (flat/dark frames present, or
        a ``quantity = "intensity" | "line_integral"`` attribute), else line
        integrals. Never guessed from the values.
    format : str, optional
        Insist on one of ``nxtomo, dxchange, hdf5, npy, npz, tiff``.
    convention : {'astra', 'skimage'}
        ``'astra'`` (default): ctuq's convention, also tomopy's, NXtomo's and
        DXchange's (``[angle, detector]`` rows). ``'skimage'``: the data are
        scikit-image ``radon`` output: its centre of rotation (see
        :meth:`Sinogram.from_skimage`) and, in ``.npy``, ``.npz``, TIFF and
        plain HDF5 files, its ``[detector, angle]`` layout (NXtomo and
        DXchange fix ``[angle, detector]``).
    max_memory_gib : float, optional
        Memory budget: arrays whose declared size needs more are refused
        before they are read. Default: half the physical memory.
    allow_external : bool
        Follow HDF5 external links, external raw storage and virtual
        datasets (they read other files). Default False.
    assume_angles : bool
        When no source gives angles, assume equispaced angles over 180 deg
        (360 deg for fan beam) instead of refusing, and set
        ``meta['angles_assumed']`` (for a viewer that shows them for
        checking). Default False.
    **geometry_options
        :class:`~ctuq.data.io.options.GeometryOptions` fields:
        ``image_size`` (int or pair; alias ``image_shape``), ``pixel_size``,
        ``detector_spacing``, ``beam``, ``source_origin``, ``origin_detector``
        (mm), ``n_detector``, ``angle_first``/``angle_last``/``n_angles``
        (equispaced, both ends included), ``n_angles`` alone (equispaced over
        180 deg, 360 deg for fan beam, when no source gives angles),
        ``angle_unit`` ('deg'/'rad'), ``center_offset`` (detector pixels, or
        ``'auto'``). Raw frames (flats/darks) whose centre no source states
        get ``meta['center_offset'] = 'auto'``: the reconstruction estimates
        the centre from the data (:func:`ctuq.data.center.estimate_center_offset`).

    Returns
    -------
    Sinogram
        float32 line integrals ``[n_angles, n_det]`` or ``[n_slices, n_angles, n_det]``;
        ``meta['source']`` is the file's absolute path, ``meta['format']``
        the format read.

    Raises
    ------
    InputError
        For every problem with the file or the options: missing, directory,
        empty, unrecognised, corrupt or truncated; missing or corrupt fields;
        sizes over the memory budget; external links; wrong dimensions or
        dtype; NaN/Inf; non-positive intensities; implausible angle units;
        angle count different from the data rows; missing or contradictory
        geometry (file vs sidecar vs options). The message names the file
        and field.

    Notes
    -----
    Geometry sources are merged field by field: the file, then (``hdf5``,
    ``npy``, ``npz``, ``tiff`` only) a sidecar ``<stem>.json`` or
    ``<name>.json``, then the options; a field given twice with different
    values is an error. See :func:`ctuq.data.io._resolve.resolve` for the
    defaults of fields nobody gives (image side: ``n_detector`` for parallel
    beam, pixel size = detector spacing / magnification).
    """
    from ctuq.data.conventions import check_convention, from_skimage_layout, skimage_offsets

    p = check_input_file(path)
    if raw not in (None, True, False):
        raise InputError(f"must be true, false or unset, got {raw!r}", file=p, field="raw")
    if format is not None and format not in SINOGRAM_FORMATS:
        raise InputError(f"unknown format {format!r} (known: {', '.join(SINOGRAM_FORMATS)})",
                         file=p, field="format")
    try:
        convention = check_convention(convention)
    except InputError as exc:
        raise InputError(exc.message, file=p, field=exc.field) from None
    with errors_name_the_file(p), read_limits(
            None if max_memory_gib is None else int(float(max_memory_gib) * 1024**3),
            allow_external):
        opt_part, n_angles, unit = _resolve.from_options(angles=angles, geometry=geometry,
                                                         options=geometry_options, file=p)
        side = None
        sp = sidecar_path(p) if sniff(p) in SIDECAR_FORMATS else None
        if sp is not None:
            side = read_sidecar(sp)
            side[0].pop("angle_unit", None)  # it applied to the sidecar's own angles
        loaded = _load(p, dataset=dataset, raw=raw, format=format, angle_unit=unit)
        data = loaded.data
        if convention == "skimage" and loaded.format in SIDECAR_FORMATS:
            # formats without a fixed layout hold radon's [detector, angle] as it is;
            # NXtomo and DXchange fix [angle, detector]: only the centre differs
            data = from_skimage_layout(data)
        part, meta = loaded.geometry, dict(loaded.meta)
        if side is not None and loaded.format in SIDECAR_FORMATS:
            side_geom, side_meta = side
            side_n = side_geom.pop("n_angles", None)
            if side_n is not None:
                if n_angles is not None and n_angles != side_n:
                    raise InputError(f"n_angles={n_angles} in the options but {side_n} in the "
                                     f"sidecar {sp.name}", file=p, field="n_angles")
                n_angles = side_n
            part = _resolve.merge(part, side_geom, file=p, base_name="the file",
                                  extra_name=f"the sidecar {sp.name}")
            meta = {**side_meta, **meta}
            meta["sidecar"] = str(sp)
        part = _resolve.merge(part, opt_part, file=p, base_name="the file",
                              extra_name="the options")
        n_rows, n_det = data.shape[-2:]
        if assume_angles and not {"angles", "angle_ends"} & set(part) and n_angles is None:
            n_angles = n_rows
            meta["angles_assumed"] = True
        if convention == "skimage":
            shape = part.get("image_shape", (n_det, n_det))
            if shape[0] != shape[1]:
                raise InputError("scikit-image's radon takes square images; image_size must "
                                 "be one number", file=p, field="image_size")
            sk = skimage_offsets(n_det, shape[0])
            part = _resolve.merge(part, {"image_shape": tuple(shape), **sk}, file=p,
                                  base_name="the options", extra_name="the skimage convention")
            meta["convention"] = "skimage"
        geom = _resolve.resolve(part, n_angles_data=n_rows, n_detector_data=n_det,
                                n_angles_opt=n_angles, detector_distance=loaded.detector_distance,
                                file=p)
        if "center_offset" in part:  # stated (file or options): it answers an 'auto'
            if is_auto(meta.get("center_offset")):
                meta.pop("center_offset")
        elif meta.get("flat_dark_corrected"):
            # a scanner's raw frames without a stated centre: estimated from the data by
            # the reconstruction (the detector centre is rarely the axis to 0.1 px)
            meta["center_offset"] = AUTO
        meta.update(source=os.path.abspath(p), format=loaded.format)
        sino = Sinogram(data, geom, meta, loaded.ground_truth, variance=loaded.variance)
    log.info("read %s: %s, %s", p, loaded.format, sino.geometry)
    return sino
