"""Defensive h5py access: every failure becomes an :class:`InputError`
naming the file and the HDF5 path."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ctuq.data.io._common import attr_str, check_array
from ctuq.errors import InputError

try:  # h5py is a hard dependency of ctuq; import lazily-friendly for clear errors
    import h5py
except ImportError:  # pragma: no cover - reported when a reader is used
    h5py = None


def require_h5py():
    if h5py is None:  # pragma: no cover
        raise InputError("reading HDF5/NeXus files needs the h5py package (pip install h5py)")
    return h5py


@contextlib.contextmanager
def open_h5(path: Path) -> Iterator["h5py.File"]:
    """Open an HDF5 file read-only; a corrupt or truncated file is an InputError."""
    require_h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"not a readable HDF5 file: corrupt or truncated ({exc})",
                         file=path) from exc
    try:
        yield f
    finally:
        with contextlib.suppress(Exception):
            f.close()


def get(group, name: str, *, file, kind: str = "dataset", required: bool = False):
    """``group[name]`` or None; wrong kind, dangling links and corrupt
    objects are InputErrors (``kind`` is 'dataset', 'group' or 'any')."""
    field = _join(group, name)
    try:
        obj = group.get(name)
    except (KeyError, OSError, ValueError, RuntimeError) as exc:
        raise InputError(f"cannot be opened: corrupt file or broken link ({exc})", file=file,
                         field=field) from exc
    if obj is None:
        if required:
            raise InputError("is missing", file=file, field=field)
        return None
    if kind == "dataset" and not isinstance(obj, h5py.Dataset):
        raise InputError("is a group; a dataset is expected", file=file, field=field)
    if kind == "group" and not isinstance(obj, h5py.Group):
        raise InputError("is a dataset; a group is expected", file=file, field=field)
    return obj


def _join(group, name: str) -> str:
    base = getattr(group, "name", None) or ""
    if name.startswith("/"):
        return name
    return f"{base.rstrip('/')}/{name}"


def read(ds, *, file) -> Any:
    """All values of a dataset; an empty (null dataspace) or unreadable one is an InputError."""
    field = ds.name
    if ds.shape is None:
        raise InputError("is empty (no dataspace)", file=file, field=field)
    try:
        value = ds[()]
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        raise InputError(f"cannot be read: corrupt or truncated file ({exc})", file=file,
                         field=field) from exc
    return value


def read_array(group, name: str, *, file, required: bool = False, ndims=None,
               dtype=np.float64, finite: bool = True):
    """Read a numeric dataset and validate it (see :func:`check_array`); None if absent."""
    ds = get(group, name, file=file, required=required)
    if ds is None:
        return None
    return check_array(read(ds, file=file), file=file, field=ds.name, ndims=ndims, dtype=dtype,
                       finite=finite)


def read_str(group, name: str, *, file, required: bool = False) -> str | None:
    ds = get(group, name, file=file, required=required)
    if ds is None:
        return None
    value = read(ds, file=file)
    s = attr_str(value)
    if s is None:
        raise InputError("is not a text field", file=file, field=ds.name)
    return s


def attr(obj, name: str, *, file) -> Any:
    """An attribute's value, or None; unreadable attributes are InputErrors."""
    try:
        if name not in obj.attrs:
            return None
        return obj.attrs[name]
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise InputError(f"attribute cannot be read ({exc})", file=file,
                         field=f"{obj.name}@{name}") from exc


def nx_class(obj, *, file) -> str | None:
    return attr_str(attr(obj, "NX_class", file=file))


# -- writing helpers ----------------------------------------------------------
def new_group(parent, name: str, nx: str | None = None, **attrs):
    g = parent.create_group(name)
    if nx is not None:
        g.attrs["NX_class"] = nx
    for k, v in attrs.items():
        g.attrs[k] = v
    return g


def write_array(group, name: str, data, *, units: str | None = None, **attrs):
    """Write an array with a Fletcher-32 checksum (so bit rot in the file is an
    error on reading, not silently different numbers), gzip-compressed when
    it is large enough to matter. Both filters are built into every HDF5."""
    data = np.asarray(data)
    kwargs = {}
    if data.ndim >= 1 and data.size > 0:
        kwargs = dict(chunks=True, fletcher32=True)
        if data.size >= 4096:
            kwargs.update(compression="gzip", compression_opts=4, shuffle=True)
    ds = group.create_dataset(name, data=data, **kwargs)
    if units is not None:
        ds.attrs["units"] = units
    for k, v in attrs.items():
        ds.attrs[k] = v
    return ds


def write_str(group, name: str, text: str, **attrs):
    ds = group.create_dataset(name, data=text, dtype=h5py.string_dtype("utf-8"))
    for k, v in attrs.items():
        ds.attrs[k] = v
    return ds


def str_list(values) -> np.ndarray:
    """An array of strings in the variable-length UTF-8 form NeXus tools read."""
    return np.array(list(values), dtype=h5py.string_dtype("utf-8"))
