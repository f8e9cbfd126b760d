"""Small helpers shared by the readers and writers: path checks, array
validation, unit conversion, JSON and HDF5 string handling.

Every check here raises :class:`ctuq.errors.InputError` naming the file and
the field, so that nothing a user supplies can end in a bare ``KeyError`` or
``OSError``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctuq.errors import InputError

log = logging.getLogger(__name__)

#: Bytes of working memory per array element a reader may need (the stored
#: values, a float64 working copy for flat/dark correction, the float32 result).
BYTES_PER_ELEMENT = 24


def default_memory_budget() -> int:
    """Half of the physical memory (bytes); 4 GiB when it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return 4 * 1024**3


@dataclass(frozen=True)
class Limits:
    """What a reader may do: its memory budget and whether it follows other files.

    Attributes
    ----------
    max_bytes : int
        Budget of one read: an array is read only when ``elements x 24 bytes``
        fit (see :data:`BYTES_PER_ELEMENT`). Default: half the physical memory.
    allow_external : bool
        Follow HDF5 external links, external raw storage and virtual datasets
        (they read other files). Default False.
    """

    max_bytes: int = 0
    allow_external: bool = False

    @property
    def budget(self) -> int:
        return self.max_bytes if self.max_bytes > 0 else default_memory_budget()


_LIMITS: contextvars.ContextVar[Limits] = contextvars.ContextVar("ctuq_read_limits",
                                                                  default=Limits())


def current_limits() -> Limits:
    """The :class:`Limits` in force (see :func:`read_limits`)."""
    return _LIMITS.get()


@contextlib.contextmanager
def read_limits(max_bytes: int | None = None, allow_external: bool = False):
    """Run the reads inside under a memory budget and an external-file policy."""
    token = _LIMITS.set(Limits(int(max_bytes or 0), bool(allow_external)))
    try:
        yield
    finally:
        _LIMITS.reset(token)


def check_size(shape, dtype=None, *, file, field: str) -> None:
    """Refuse an array whose declared size does not fit the memory budget.

    Called *before* the values are read, so that a header claiming a huge
    array (or a small compressed dataset that inflates) is one clear error,
    never a ``MemoryError`` or a swapping machine.
    """
    try:
        n = math.prod(int(s) for s in shape)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"has an unreadable shape {shape!r}", file=file, field=field) from None
    need = n * BYTES_PER_ELEMENT
    budget = current_limits().budget
    if need > budget:
        raise InputError(f"declares shape {tuple(int(s) for s in shape)} ({n:,} values, about "
                         f"{need / 1024**3:.3g} GiB to read): over the memory budget of "
                         f"{budget / 1024**3:.3g} GiB (raise it with max_memory_gib / "
                         "--max-memory-gib if the file is genuine)", file=file, field=field)

@contextlib.contextmanager
def errors_name_the_file(path):
    """Let every failure inside end as an :class:`InputError` that names ``path``.

    An ``InputError`` without a file gets ``path``; a library exception on a
    malformed file (h5py, numpy, tifffile…) becomes "cannot read the file".
    ``MemoryError`` passes through untouched.
    """
    try:
        yield
    except InputError as exc:
        if exc.file is None:
            raise InputError(exc.message, file=path, field=exc.field) from exc
        raise
    except MemoryError:
        raise
    except Exception as exc:  # any library failure on a malformed file
        raise InputError(f"cannot read the file ({type(exc).__name__}: {exc})",
                         file=path) from exc


#: Magic numbers used to recognise a file by its content.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


# -- paths -----------------------------------------------------------------
def check_input_file(path) -> Path:
    """Return ``path`` as a :class:`~pathlib.Path` after checking that it is a
    readable, non-empty regular file.

    Raises
    ------
    InputError
        If the path does not exist, is a directory, is empty or unreadable.
    """
    try:
        p = Path(os.fspath(path))
    except TypeError:
        raise InputError(f"not a file path: {path!r}", field="path") from None
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError("no such file", file=p) from None
    except OSError as exc:
        raise InputError(f"cannot access the file ({exc.strerror or exc})", file=p) from exc
    if p.is_dir():
        raise InputError("is a directory, not a file", file=p)
    if not p.is_file():
        raise InputError("is not a regular file", file=p)
    if st.st_size == 0:
        raise InputError("the file is empty", file=p)
    if not os.access(p, os.R_OK):
        raise InputError("the file is not readable (permission denied)", file=p)
    return p


def sniff(path: Path) -> str | None:
    """Recognise a file by its first bytes.

    Returns
    -------
    {'hdf5', 'npy', 'npz', 'tiff'} or None
        None when the content matches none of them.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if head.startswith(HDF5_SIGNATURE):
                return "hdf5"
            if head.startswith(NPY_MAGIC):
                return "npy"
            if head[:4] in ZIP_MAGICS:
                return "npz"
            if head[:4] in TIFF_MAGICS:
                return "tiff"
            # HDF5 allows a user block: the signature may sit at 512, 1024, ...
            offset = 512
            while offset + 8 <= size:
                fh.seek(offset)
                if fh.read(8) == HDF5_SIGNATURE:
                    return "hdf5"
                offset *= 2
    except OSError as exc:
        raise InputError(f"cannot read the file ({exc.strerror or exc})", file=path) from exc
    return None


def sha256_file(path, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file's bytes (to record an input in a result).

    Raises
    ------
    InputError
        If the file cannot be read.
    """
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(chunk), b""):
                h.update(block)
    except OSError as exc:
        raise InputError(f"cannot read the file ({exc.strerror or exc})", file=path) from exc
    return h.hexdigest()


# -- arrays ----------------------------------------------------------------
def check_numeric(arr, *, file, field: str) -> np.ndarray:
    """Return ``arr`` as an ndarray of a real numeric dtype (not yet cast).

    Booleans, complex numbers, strings and objects are refused: none of them
    is a measured sinogram and casting them would silently invent values.
    """
    try:
        arr = np.asarray(arr)
    except Exception as exc:  # e.g. ragged nested lists
        raise InputError(f"cannot be read as an array ({exc})", file=file, field=field) from exc
    kind = arr.dtype.kind
    if kind not in "iuf":
        what = {"b": "boolean", "c": "complex", "U": "text", "S": "bytes", "O": "object",
                "V": "compound/void", "M": "datetime", "m": "timedelta"}.get(kind, str(arr.dtype))
        raise InputError(f"has a non-numeric dtype ({what}, {arr.dtype}); a real number array "
                         "is needed", file=file, field=field)
    return arr


def check_shape(arr, *, file, field: str, ndims=(2, 3)) -> np.ndarray:
    """Check dtype (real numeric), number of dimensions and non-emptiness
    without casting; see :func:`check_array`."""
    arr = check_numeric(arr, file=file, field=field)
    if ndims is not None and arr.ndim not in ndims:
        allowed = " or ".join(str(n) for n in ndims)
        raise InputError(f"has {arr.ndim} dimension(s) {tuple(arr.shape)}; {allowed} expected",
                         file=file, field=field)
    if arr.size == 0:
        raise InputError(f"is empty (shape {tuple(arr.shape)})", file=file, field=field)
    return arr


def check_array(arr, *, file, field: str, ndims=(2, 3), finite: bool = True,
                dtype=np.float32) -> np.ndarray:
    """Validate a numeric array and cast it to ``dtype``.

    Parameters
    ----------
    arr : array_like
        The values.
    file, field
        Named in any error.
    ndims : tuple of int or None
        Allowed numbers of dimensions; None allows any.
    finite : bool
        Refuse NaN and +-Inf (checked after the cast, so float64 values that
        overflow float32 are caught too).
    dtype : numpy dtype
        Target dtype. Default float32.

    Raises
    ------
    InputError
        Non-numeric dtype, wrong number of dimensions, empty, NaN or Inf.
    """
    arr = check_shape(arr, file=file, field=field, ndims=ndims)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.asarray(arr, dtype=dtype, order="C")
    if finite:
        bad = ~np.isfinite(out)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            n_nan = int(np.isnan(out).sum())
            raise InputError(f"contains {int(bad.sum())} non-finite value(s) ({n_nan} NaN, "
                             f"{int(bad.sum()) - n_nan} infinite or too large for "
                             f"{np.dtype(dtype).name}), first at index {first}",
                             file=file, field=field)
    return out


def check_signal(arr, *, file, field: str = "sinogram") -> None:
    """Refuse data that measured nothing: non-finite, or constant (all zero included).

    A reconstruction estimates the noise from the data's variation and fits
    the data; a sinogram without variation (a detector that read nothing, a
    blank or saturated frame, a placeholder array) has neither, and would end
    deep inside the solver with a variance of 0.

    Parameters
    ----------
    arr : ndarray, shape (n_angles, n_detector) or (n_slices, n_angles, n_detector)
        Line integrals.
    file, field
        Named in the error. Each slice of a 3-D stack is checked on its own.

    Raises
    ------
    InputError
        Naming ``field`` (``sinogram[i]`` for slice ``i`` of a stack) and ``file``.
    """
    arr = np.asarray(arr)
    stack = arr.ndim == 3
    for i, sl in enumerate(arr if stack else [arr]):
        where = f"{field}[{i}]" if stack else field
        bad = ~np.isfinite(sl)
        if bad.any():
            raise InputError(f"contains {int(bad.sum())} non-finite value(s)", file=file,
                             field=where)
        lo, hi = sl.min(), sl.max()
        if lo == hi:
            raise InputError(f"is constant (every value is {float(lo):g}): it measured "
                             "nothing, so there is nothing to reconstruct and no noise to "
                             "estimate", file=file, field=where)


def flat_dark_correct(proj, flat=None, dark=None, *, file, field: str = "data",
                      flat_field: str = "flat", dark_field: str = "dark",
                      with_variance: bool = False):
    """Beer-Lambert correction ``p = -log((I - D) / (F - D))``.

    The arithmetic is :func:`ctuq.data.counts.counts_to_line_integrals`
    (the one implementation); here the frames are checked and every
    non-positive ``I - D`` or ``F - D`` is an error naming the file.

    Parameters
    ----------
    proj : ndarray, shape (n_angles, ...)
        Raw intensities ``I``, one frame per angle.
    flat, dark : ndarray or None
        Flat (open beam) and dark frames, either a stack ``(n_frames, ...)``
        averaged over axis 0 or one frame shaped like ``proj[0]``. A missing
        flat means the data are already normalised transmissions (F = 1); a
        missing dark means D = 0.
    file, field, flat_field, dark_field
        Named in any error.
    with_variance : bool, optional
        Also return the delta-method variance of every line integral
        (counts taken as photons), or None without flat frames (normalised
        transmissions are not counts). Default False.

    Returns
    -------
    ndarray, float32, shape of ``proj``
        Line integrals; with ``with_variance`` a pair ``(line integrals,
        variance or None)``, the variance float32 of the same shape.

    Raises
    ------
    InputError
        Darks without flats, shape mismatch, or any non-positive ``I - D`` or
        ``F - D`` (the logarithm would be undefined).
    """
    from ctuq.data.counts import counts_to_line_integrals

    proj = np.asarray(proj, dtype=np.float64)
    frame_shape = proj.shape[1:]

    def _stack(frames, name):
        frames = np.asarray(frames, dtype=np.float64)
        stack = frames if frames.ndim == proj.ndim else frames[None]
        if stack.shape[1:] != frame_shape:
            shown = stack.shape[1:] if frames.ndim == proj.ndim else frames.shape
            raise InputError(f"frames of shape {shown} do not match the projections "
                             f"{frame_shape}", file=file, field=name)
        return stack

    if flat is None and dark is not None:
        raise InputError("dark frames are present but no flat frames: cannot normalise",
                         file=file, field=dark_field)
    darks = None if dark is None else _stack(dark, dark_field)
    flats = np.ones((1, *frame_shape)) if flat is None else _stack(flat, flat_field)
    d = 0.0 if darks is None else darks.mean(axis=0)
    den = flats.mean(axis=0) - d
    if np.any(den <= 0):
        n = int((den <= 0).sum())
        where = "flat - dark" if dark is not None else "flat"
        raise InputError(f"{where} is not positive at {n} detector pixel(s); cannot take the "
                         "logarithm", file=file, field=flat_field)
    num = proj - d
    if np.any(num <= 0):
        n = int((num <= 0).sum())
        first = tuple(int(i) for i in np.argwhere(num <= 0)[0])
        where = "intensity - dark" if dark is not None else "intensity"
        raise InputError(f"{where} is not positive at {n} value(s) (first at index {first}); "
                         "cannot take the logarithm", file=file, field=field)
    # counts_to_line_integrals wants (..., angles, detector): move the angle axis
    # next to the detector; every value is positive here, so nothing is clipped
    move = (lambda a: np.moveaxis(a, 0, -2)) if proj.ndim > 2 else (lambda a: a)
    back = (lambda a: np.moveaxis(a, -2, 0)) if proj.ndim > 2 else (lambda a: a)
    # (the frames keep their layout: one frame per projection row)
    li = counts_to_line_integrals(move(proj), flats, darks,
                                  min_counts=float(np.finfo(np.float64).tiny))
    y = back(li.y).astype(np.float32)
    if not with_variance:
        return y
    return y, (None if flat is None else back(li.variance).astype(np.float32))


# -- units -----------------------------------------------------------------
_LENGTH_TO_MM = {
    "m": 1e3, "meter": 1e3, "metre": 1e3, "meters": 1e3, "metres": 1e3,
    "cm": 10.0, "mm": 1.0, "millimeter": 1.0, "millimetre": 1.0, "millimeters": 1.0,
    "millimetres": 1.0, "um": 1e-3, "µm": 1e-3, "μm": 1e-3, "micron": 1e-3, "microns": 1e-3,
    "micrometer": 1e-3, "micrometre": 1e-3, "micrometers": 1e-3, "micrometres": 1e-3,
    "nm": 1e-6,
}
_ANGLE_UNITS = {"deg": "deg", "degree": "deg", "degrees": "deg", "°": "deg",
                "rad": "rad", "radian": "rad", "radians": "rad"}


def attr_str(value) -> str | None:
    """Decode an HDF5 string value or attribute (bytes, str, 0-d/1-element array)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        if value.size != 1:
            return None
        value = value.reshape(-1)[0]
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    return None


def length_mm(value, units, *, file, field: str) -> float:
    """A scalar length converted to millimetres from its ``units`` attribute.

    A missing ``units`` attribute is read as millimetres (ctuq's unit) and
    logged as a warning, since metres are common in NeXus files.
    """
    value = scalar(value, file=file, field=field)
    u = attr_str(units)
    if u is None or not u.strip():
        log.warning("%s:%s has no units attribute; assuming millimetres", file, field)
        factor = 1.0
    else:
        factor = _LENGTH_TO_MM.get(u.strip().lower())
        if factor is None:
            raise InputError(f"unknown length unit {u!r}", file=file, field=f"{field}@units")
    return value * factor


def angle_unit_name(value, *, file=None, field: str = "angle_unit") -> str:
    """``'deg'`` or ``'rad'`` for any common spelling; anything else is an InputError."""
    u = attr_str(value) if not isinstance(value, str) else value
    kind = None if u is None else _ANGLE_UNITS.get(u.strip().lower())
    if kind is None:
        raise InputError(f"unknown angle unit {value!r} (deg or rad expected)", file=file,
                         field=field)
    return kind


def angles_rad(values, units, *, file, field: str, unit: str | None = None) -> np.ndarray:
    """Angles from a file as float64 radians, with a plausibility check of the unit.

    Parameters
    ----------
    values : array_like, shape (n,)
    units : str or None
        The dataset's ``units`` attribute.
    unit : {'deg', 'rad'}, optional
        The user's ``angle_unit``: overrides the attribute (with a warning when
        they differ) and says how to read angles without one.

    Raises
    ------
    InputError
        Non-finite values; an unknown unit; angles without a unit whose values
        span at most one turn in radians (0.08 to 3.06, say), which could be
        either unit; angles declared in radians that span more than one turn.
    """
    arr = check_array(values, file=file, field=field, ndims=(1,), dtype=np.float64)
    u = attr_str(units)
    declared = None if u is None or not u.strip() else angle_unit_name(
        u, file=file, field=f"{field}@units")
    span = float(arr.max() - arr.min()) if arr.size > 1 else 0.0
    turn = 2 * math.pi * (1 + 1e-6)
    if unit is not None:
        kind = angle_unit_name(unit, file=file)
        if declared is not None and declared != kind:
            log.warning("%s:%s declares %s; read as %s as angle_unit says", file, field,
                        declared, kind)
    elif declared is not None:
        kind = declared
        if kind == "rad" and span > turn:
            raise InputError(f"declared in radians but spans {span:.4g} rad (more than one "
                             "turn): degrees? Set angle_unit (--angle-unit deg) to override",
                             file=file, field=field)
        if kind == "deg" and arr.size > 2 and 0 < span <= turn:
            log.warning("%s:%s is declared in degrees but spans only %.4g deg: radians? "
                        "Set angle_unit (--angle-unit rad) if so", file, field, span)
    else:
        if arr.size > 2 and 0 < span <= turn:
            raise InputError(
                f"has no units attribute and spans only {span:.4g} ({arr.min():.4g} to "
                f"{arr.max():.4g}): radians or degrees? Set angle_unit (--angle-unit rad "
                "or deg)", file=file, field=field)
        kind = "deg"
    return np.deg2rad(arr) if kind == "deg" else arr


def scalar(value, *, file, field: str) -> float:
    """A finite float from a scalar or a constant 1-element/all-equal array."""
    arr = check_array(value, file=file, field=field, ndims=None, dtype=np.float64)
    if arr.size > 1:
        if not np.all(arr == arr.reshape(-1)[0]):
            raise InputError(f"holds {arr.size} different values; one value expected",
                             file=file, field=field)
    return float(arr.reshape(-1)[0])


# -- JSON ------------------------------------------------------------------
def to_jsonable(obj, *, field: str, file=None) -> Any:
    """Convert ``obj`` to plain JSON types (dict/list/str/int/float/bool/None).

    NumPy scalars and arrays become Python numbers and lists, tuples become
    lists, paths become strings. Dict keys must be strings.

    Raises
    ------
    InputError
        If something cannot be represented (an object, a non-string key).
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, np.bool_):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise InputError(f"dictionary key {k!r} is not a string", file=file, field=field)
            out[k] = to_jsonable(v, field=f"{field}.{k}", file=file)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, field=f"{field}[{i}]", file=file) for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise InputError(f"array of dtype {obj.dtype} cannot be stored as JSON",
                             file=file, field=field)
        return obj.tolist()
    raise InputError(f"value of type {type(obj).__name__} cannot be stored as JSON",
                     file=file, field=field)


def dumps(obj, *, field: str, file=None) -> str:
    """JSON text of ``obj`` (NaN and Inf allowed, as Python's json writes them)."""
    return json.dumps(to_jsonable(obj, field=field, file=file), allow_nan=True)


def loads(text, *, file, field: str, kind=None) -> Any:
    """Parse JSON text read from a file; errors name the file and field."""
    s = attr_str(text) if not isinstance(text, str) else text
    if s is None:
        raise InputError("is not a JSON text", file=file, field=field)
    try:
        value = json.loads(s)
    except ValueError as exc:
        raise InputError(f"is not valid JSON ({exc})", file=file, field=field) from exc
    if kind is not None and not isinstance(value, kind):
        raise InputError(f"JSON holds a {type(value).__name__}, a {kind.__name__} was expected",
                         file=file, field=field)
    return value


def isclose(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
