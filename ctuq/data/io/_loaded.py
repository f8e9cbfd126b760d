"""What a format reader hands to :func:`ctuq.data.io.read_sinogram`, and the
one rule that decides whether data are raw intensities."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctuq.data.io._common import attr_str, check_array, flat_dark_correct
from ctuq.errors import InputError

log = logging.getLogger(__name__)

#: Values of the ``quantity`` attribute on a data array.
QUANTITIES = {"line_integral": False, "intensity": True}


@dataclass
class Loaded:
    """Data read from a file, before the geometry is resolved.

    ``data`` is float32 line integrals in sinogram layout ``(n_angles, n_det)``
    or ``(n_slices, n_angles, n_det)``; ``geometry`` is a partial geometry in
    the internal form of :mod:`ctuq.data.io._resolve`.
    """

    data: np.ndarray
    format: str
    geometry: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    ground_truth: np.ndarray | None = None
    detector_distance: float | None = None
    variance: np.ndarray | None = None


def quantity_is_raw(value, *, file, field: str) -> bool | None:
    """Map a ``quantity`` attribute to True (raw intensities), False (line
    integrals) or None (absent)."""
    if value is None:
        return None
    s = attr_str(value)
    if s is None or s.strip().lower() not in QUANTITIES:
        raise InputError(f"unknown quantity {value!r}; expected one of "
                         f"{', '.join(QUANTITIES)}", file=file, field=field)
    return QUANTITIES[s.strip().lower()]


def to_line_integrals(data, *, flats=None, darks=None, file_raw: bool | None,
                      raw: bool | None, file, field: str, flat_field: str = "flat",
                      dark_field: str = "dark", meta: dict | None = None,
                      with_variance: bool = False):
    """Return float32 line integrals, applying ``-log`` flat/dark correction
    when the data are raw intensities.

    With ``with_variance`` the result is a pair ``(line integrals, variance)``:
    the delta-method variance of each line integral
    (:func:`ctuq.data.counts.counts_to_line_integrals`) when flat frames
    were given, else None.

    The data are raw intensities when flat or dark frames are present, when
    the file marks them ``quantity="intensity"`` (``file_raw``), or when the
    caller passes ``raw=True``. ctuq never guesses from the values. A file
    marking and the ``raw`` option that disagree, or flats/darks next to data
    declared as line integrals, are contradictions (InputError).
    """
    has_frames = flats is not None or darks is not None
    if raw is not None and file_raw is not None and bool(raw) != file_raw:
        raise InputError(f"raw = {str(raw).lower()} (--{'' if raw else 'no-'}raw) contradicts "
                         "the file, which declares "
                         f"quantity={'intensity' if file_raw else 'line_integral'}",
                         file=file, field="raw")
    if has_frames and (raw is False or file_raw is False):
        raise InputError("flat/dark frames are present but the data are declared as line "
                         "integrals (raw = false, --no-raw, or quantity='line_integral')",
                         file=file,
                         field="raw")
    is_raw = has_frames or bool(raw) or bool(file_raw)
    if not is_raw:
        arr = check_array(data, file=file, field=field, ndims=(2, 3))
        if np.asarray(data).dtype.kind in "iu" and meta is not None:
            # warned about (once) and recorded in the result by the pipeline's data checks
            meta["source_dtype"] = str(np.asarray(data).dtype)
        elif np.asarray(data).dtype.kind in "iu":
            log.warning("%s:%s holds integers and no flat/dark frames: read as line integrals; "
                        "set raw (--raw) if they are intensities", file, field)
        return (arr, None) if with_variance else arr
    values = check_array(data, file=file, field=field, ndims=(2, 3), dtype=np.float64)
    if flats is not None:
        flats = check_array(flats, file=file, field=flat_field, ndims=None, dtype=np.float64)
    if darks is not None:
        darks = check_array(darks, file=file, field=dark_field, ndims=None, dtype=np.float64)
    out, variance = flat_dark_correct(values, flats, darks, file=file, field=field,
                                      flat_field=flat_field, dark_field=dark_field,
                                      with_variance=True)
    out = check_array(out, file=file, field=field, ndims=(2, 3))
    if meta is not None:
        meta["flat_dark_corrected"] = True
        meta["n_flats"] = 0 if flats is None else (
            int(flats.shape[0]) if flats.ndim == values.ndim else 1)
        meta["n_darks"] = 0 if darks is None else (
            int(darks.shape[0]) if darks.ndim == values.ndim else 1)
    return (out, variance) if with_variance else out
