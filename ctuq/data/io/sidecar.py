"""Sidecar geometry files: ``<stem>.json`` or ``<name>.json`` next to a data file
that has no geometry of its own (plain HDF5, ``.npy``, ``.npz``, TIFF)."""

from __future__ import annotations

import os
from pathlib import Path

from ctuq.data.io import _resolve
from ctuq.data.io._common import loads
from ctuq.errors import InputError


def sidecar_path(path) -> Path | None:
    """The sidecar JSON of a data file: ``<stem>.json`` or ``<name>.json``
    next to it, or None. Both present is ambiguous (InputError)."""
    p = Path(os.fspath(path))
    cands = [c for c in dict.fromkeys([p.with_suffix(".json"), p.with_name(p.name + ".json")])
             if c != p and c.is_file()]
    if len(cands) > 1:
        raise InputError(f"two sidecar files ({cands[0].name}, {cands[1].name}); keep one",
                         file=p, field="sidecar")
    return cands[0] if cands else None


#: Largest sidecar JSON read (bytes): a geometry description is small.
MAX_SIDECAR_BYTES = 64 * 1024**2


def read_sidecar(path) -> tuple[dict, dict]:
    """Parse a sidecar JSON: a geometry, or ``{"geometry": {...}, "meta": {...}}``.

    The geometry may use the names of :meth:`Geometry.to_dict` (``image_shape``,
    ``angles_deg``, ...) and those of the geometry options
    (:class:`~ctuq.data.io.options.GeometryOptions`: ``image_size``,
    ``angles`` with ``angle_unit``, ``angle_first``/``angle_last``/``n_angles``,
    ``center_offset``...), the same names as the CLI flags and TOML keys.

    Returns
    -------
    geometry : dict
        Internal partial geometry; ``n_angles`` is set when only a count of
        equispaced angles is given, ``angle_unit`` when the sidecar names one.
    meta : dict
    """
    from ctuq.data.io.options import GEOMETRY_OPTION_NAMES

    sp = Path(os.fspath(path))
    try:
        if sp.stat().st_size > MAX_SIDECAR_BYTES:
            raise InputError(f"is larger than {MAX_SIDECAR_BYTES // 1024**2} MiB; not a "
                             "geometry description", file=sp, field="sidecar")
        text = sp.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the sidecar ({exc})", file=sp) from exc
    d = loads(text, file=sp, field="sidecar", kind=dict)
    meta: dict = {}
    if "geometry" in d:
        extra = sorted(set(d) - {"geometry", "meta"})
        if extra:
            raise InputError("unknown sidecar key (known: geometry, meta)", file=sp,
                             field=extra[0])
        meta = d.get("meta") or {}
        if not isinstance(meta, dict):
            raise InputError("must be a JSON object", file=sp, field="meta")
        d = d["geometry"]
        if not isinstance(d, dict):
            raise InputError("must be a JSON object", file=sp, field="geometry")
    dict_keys = set(_resolve._DICT_KEYS)
    option_keys = set(GEOMETRY_OPTION_NAMES) - dict_keys
    unknown = sorted(set(d) - dict_keys - option_keys)
    if unknown:
        raise InputError(f"unknown geometry field (known: "
                         f"{', '.join(sorted(dict_keys | option_keys))})", file=sp,
                         field=f"geometry.{unknown[0]}")
    part = _resolve.normalise({k: v for k, v in d.items() if k in dict_keys}, file=sp,
                              source="geometry")
    opts = {k: v for k, v in d.items() if k in option_keys}
    if opts:
        opt_part, n_angles, unit = _resolve.from_options(options=opts, file=sp)
        part = _resolve.merge(part, opt_part, file=sp, base_name="geometry",
                              extra_name="the other fields")
        if n_angles is not None:
            part["n_angles"] = n_angles
        if unit is not None:
            part["angle_unit"] = unit
    return part, dict(meta)


