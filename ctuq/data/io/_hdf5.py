"""Defensive h5py access: every failure becomes an :class:`InputError`
naming the file and the HDF5 path.

Objects are reached by following a path link by link (:func:`get`): a link
that does not exist is "absent", while a link that exists but whose object
cannot be opened (a corrupt object header, a dangling soft link) is an error
naming the field; ``h5py``'s ``group.get()`` would turn both into None.
External links, external raw storage and virtual datasets point into other
files; they are refused unless the read limits allow them
(:func:`ctuq.data.io._common.read_limits`). Every dataset's size is checked
against the memory budget before it is read.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ctuq.data.io._common import attr_str, check_array, check_size, current_limits
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


_ERRORS = (KeyError, OSError, ValueError, RuntimeError, TypeError, AttributeError)
_MAX_LINK_DEPTH = 16


def _root(group, *, file):
    try:
        return group["/"]
    except _ERRORS as exc:
        raise InputError(f"cannot open the root group: corrupt file ({exc})",
                         file=file) from exc


def _follow(group, name: str, *, file, field: str, depth: int = 0):
    """The object at ``name`` below ``group``, link by link; None when a link is absent."""
    if depth > _MAX_LINK_DEPTH:
        raise InputError("soft links nest too deeply (a link loop?)", file=file, field=field)
    cur = _root(group, file=file) if name.startswith("/") else group
    parts = [p for p in name.split("/") if p and p != "."]
    for i, part in enumerate(parts):
        if not isinstance(cur, h5py.Group):
            raise InputError(f"{cur.name} is a dataset, not a group", file=file, field=field)
        try:
            exists = cur.id.links.exists(part.encode("utf-8"))
        except _ERRORS as exc:
            raise InputError(f"cannot be looked up: corrupt link table ({exc})", file=file,
                             field=field) from exc
        if not exists:
            return None
        try:
            link = cur.get(part, getlink=True)
        except _ERRORS as exc:
            raise InputError(f"cannot be opened: corrupt link ({exc})", file=file,
                             field=field) from exc
        if isinstance(link, h5py.ExternalLink):
            if not current_limits().allow_external:
                raise InputError(f"is an external link to {link.filename}:{link.path}; "
                                 "external links are refused unless allow_external is set "
                                 "(--allow-external)", file=file, field=field)
        if isinstance(link, h5py.SoftLink):
            target = _follow(cur, link.path, file=file, field=field, depth=depth + 1)
            if target is None:
                raise InputError(f"is a dangling soft link to {link.path}", file=file,
                                 field=field)
            cur = target
            continue
        try:
            cur = cur[part]
        except _ERRORS as exc:
            raise InputError(f"exists but cannot be opened: corrupt object header or broken "
                             f"link ({exc})", file=file, field=field) from exc
        if cur is None:
            raise InputError("exists but cannot be opened", file=file, field=field)
    return cur


def _check_storage(ds, *, file, field: str) -> None:
    if current_limits().allow_external:
        return
    try:
        external = ds.external
        virtual = ds.is_virtual
    except _ERRORS as exc:
        raise InputError(f"its storage layout cannot be read: corrupt header ({exc})",
                         file=file, field=field) from exc
    if external:
        names = ", ".join(str(e[0]) for e in external[:3])
        raise InputError(f"stores its values in external file(s) ({names}); refused unless "
                         "allow_external is set (--allow-external)", file=file, field=field)
    if virtual:
        raise InputError("is a virtual dataset mapped from other files; refused unless "
                         "allow_external is set (--allow-external)", file=file, field=field)


@contextlib.contextmanager
def new_file(path) -> Iterator[Any]:
    """A new HDF5 file built in memory and written to ``path`` in one go once complete.

    The HDF5 library never writes to the disk itself: a full disk (or quota,
    or I/O error) is then an ``OSError`` of one plain ``write`` that leaves
    the library untouched. Written directly, a failed write leaves HDF5 with
    a file it can neither flush nor close, which it retries (and crashes on)
    when the interpreter exits. The image costs memory once more the file's
    size (result files are megabytes), and is byte for byte the file HDF5
    writes to the disk itself (the same allocation by the in-memory ``core``
    driver).
    """
    require_h5py()
    with h5py.File(path, "w", driver="core", backing_store=False) as f:
        yield f
        f.flush()
        image = f.id.get_file_image()
    with open(path, "wb") as fh:
        fh.write(image)


def _check_chunks(ds, dtype, *, file, field: str) -> None:
    """Refuse a chunk shape whose one chunk does not fit the memory budget.

    HDF5 decompresses (and checksums) a whole chunk to read any value of it, so
    a 6 x 9 dataset declared with 16384 x 16384 chunks takes 1 GiB to read:
    the declared shape alone (:func:`check_size`) does not bound the memory.
    """
    try:
        chunks = ds.chunks
    except _ERRORS as exc:
        raise InputError(f"its chunk layout cannot be read: corrupt header ({exc})",
                         file=file, field=field) from exc
    if not chunks:
        return
    need = math.prod(int(c) for c in chunks) * max(int(dtype.itemsize), 1) * 2  # packed + unpacked
    budget = current_limits().budget
    if need > budget:
        raise InputError(f"is stored in chunks of shape {tuple(int(c) for c in chunks)}, about "
                         f"{need / 1024**3:.3g} GiB to unpack one: over the memory budget of "
                         f"{budget / 1024**3:.3g} GiB (raise it with max_memory_gib / "
                         "--max-memory-gib if the file is genuine)", file=file, field=field)


def exists(group, name: str, *, file) -> bool:
    """True when ``name`` exists below ``group``; a corrupt link or object is an InputError."""
    return _follow(group, name, file=file, field=_join(group, name)) is not None


def get(group, name: str, *, file, kind: str = "dataset", required: bool = False):
    """``group[name]`` or None when absent; wrong kind, dangling links, corrupt
    objects, external links and external storage are InputErrors (``kind`` is
    'dataset', 'group' or 'any')."""
    field = _join(group, name)
    obj = _follow(group, name, file=file, field=field)
    if obj is None:
        if required:
            raise InputError("is missing", file=file, field=field)
        return None
    if kind == "dataset" and not isinstance(obj, h5py.Dataset):
        raise InputError("is a group; a dataset is expected", file=file, field=field)
    if kind == "group" and not isinstance(obj, h5py.Group):
        raise InputError("is a dataset; a group is expected", file=file, field=field)
    if isinstance(obj, h5py.Dataset):
        _check_storage(obj, file=file, field=field)
    return obj


def _join(group, name: str) -> str:
    base = getattr(group, "name", None) or ""
    if name.startswith("/"):
        return name
    return f"{base.rstrip('/')}/{name}"


def read(ds, *, file) -> Any:
    """All values of a dataset; an empty (null dataspace) or unreadable one is an InputError."""
    field = ds.name
    try:
        shape, dtype = ds.shape, ds.dtype
    except _ERRORS as exc:
        raise InputError(f"its header cannot be read: corrupt file ({exc})", file=file,
                         field=field) from exc
    if shape is None:
        raise InputError("is empty (no dataspace)", file=file, field=field)
    if dtype.kind not in "biufSUO":
        raise InputError(f"has an unsupported type ({dtype}); numbers or text expected",
                         file=file, field=field)
    _check_storage(ds, file=file, field=field)
    check_size(shape, dtype, file=file, field=field)
    _check_chunks(ds, dtype, file=file, field=field)
    try:
        value = ds[()]
    except _ERRORS as exc:
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
    except _ERRORS as exc:
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
