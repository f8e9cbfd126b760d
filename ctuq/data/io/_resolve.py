"""Assemble a :class:`Geometry` from what a file says and what the user says.

Sources are merged field by field. A field given by two sources with
different values is a contradiction and an :class:`InputError`; it is never
settled silently in favour of one side. Fields nobody gives get documented
defaults (see :func:`resolve`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from ctuq.data.geometry import Geometry
from ctuq.data.io._common import isclose
from ctuq.errors import InputError, did_you_mean

log = logging.getLogger(__name__)

#: Geometry options accepted by the readers (``**geometry_options``);
#: ``image_shape`` is an alias of ``image_size``.
GEOMETRY_OPTIONS = ("image_size", "image_shape", "pixel_size", "detector_spacing", "beam",
                    "source_origin", "origin_detector", "n_detector", "n_angles", "angles",
                    "angle_first", "angle_last", "angle_unit", "center_offset")

_DICT_KEYS = ("beam", "image_shape", "pixel_size", "n_detector", "detector_spacing",
              "angles_deg", "angles_rad", "source_origin", "origin_detector", "center_offset",
              "image_offset")


def _number(value, *, file, field) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"must be a number, got {value!r}", file=file, field=field) from None
    if not math.isfinite(v):
        raise InputError(f"must be finite, got {value!r}", file=file, field=field)
    return v


def _integer(value, *, file, field) -> int:
    v = _number(value, file=file, field=field)
    if v != int(v) or v < 1:
        raise InputError(f"must be a positive integer, got {value!r}", file=file, field=field)
    return int(v)


def _shape(value, *, file, field) -> tuple[int, int]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        n = _integer(value, file=file, field=field)
        return (n, n)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return tuple(_integer(v, file=file, field=field) for v in value)
    raise InputError(f"must be an integer or two integers, got {value!r}", file=file, field=field)


def _angles_from(values, *, degrees: bool, file, field) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise InputError("must be a list of numbers", file=file, field=field) from None
    if arr.size == 0:
        raise InputError("no angles given", file=file, field=field)
    if not np.all(np.isfinite(arr)):
        raise InputError("contains NaN or infinite values", file=file, field=field)
    return np.deg2rad(arr) if degrees else arr


def normalise(d: dict[str, Any], *, file, source: str) -> dict[str, Any]:
    """Validate a (partial) geometry description in :meth:`Geometry.to_dict`
    form and convert it to the internal form (``angles`` in radians).

    ``angles_rad`` may be given instead of (or beside) ``angles_deg``: ctuq
    files store exact radians because degrees do not convert back bit-exactly.
    """
    if not isinstance(d, dict):
        raise InputError(f"geometry must be a mapping, got {type(d).__name__}", file=file,
                         field=source)
    unknown = sorted(set(d) - set(_DICT_KEYS))
    if unknown:
        raise InputError(f"unknown geometry field{did_you_mean(unknown[0], _DICT_KEYS)} "
                         f"(known: {', '.join(_DICT_KEYS)})", file=file,
                         field=f"{source}.{unknown[0]}")
    out: dict[str, Any] = {}
    for key, value in d.items():
        if value is None:
            continue
        fld = f"{source}.{key}"
        if key == "beam":
            if value not in ("parallel", "fan"):
                raise InputError(f"must be 'parallel' or 'fan', got {value!r}", file=file,
                                 field=fld)
            out["beam"] = value
        elif key == "image_shape":
            out["image_shape"] = _shape(value, file=file, field=fld)
        elif key == "n_detector":
            out["n_detector"] = _integer(value, file=file, field=fld)
        elif key in ("pixel_size", "detector_spacing", "source_origin", "origin_detector",
                     "center_offset"):
            out[key] = _number(value, file=file, field=fld)
        elif key == "image_offset":
            if not isinstance(value, (list, tuple, np.ndarray)) or len(value) != 2:
                raise InputError(f"must be two numbers, got {value!r}", file=file, field=fld)
            out[key] = tuple(_number(v, file=file, field=fld) for v in value)
        elif key == "angles_deg":
            out.setdefault("angles", _angles_from(value, degrees=True, file=file, field=fld))
        elif key == "angles_rad":
            rad = _angles_from(value, degrees=False, file=file, field=fld)
            if "angles" in out and not _same("angles", out["angles"], rad):
                raise InputError("angles_deg and angles_rad disagree", file=file, field=fld)
            out["angles"] = rad
    return out


def from_geometry(g: Geometry) -> dict[str, Any]:
    """Internal form of a full :class:`Geometry` (exact radians)."""
    d = {"beam": g.beam, "image_shape": tuple(g.image_shape), "pixel_size": g.pixel_size,
         "n_detector": g.n_detector, "detector_spacing": g.detector_spacing,
         "angles": np.array(g.angles, dtype=np.float64)}
    if g.beam == "fan":
        d["source_origin"] = g.source_origin
        d["origin_detector"] = g.origin_detector
    d["center_offset"] = g.center_offset
    if any(g.image_offset):
        d["image_offset"] = tuple(g.image_offset)
    return d


def _same(key, a, b) -> bool:
    if key == "angles":
        a, b = np.asarray(a), np.asarray(b)
        # 1e-8 rad is ~6e-7 degrees: below any real encoder's precision.
        return a.shape == b.shape and bool(np.allclose(a, b, rtol=0, atol=1e-8))
    if key in ("beam", "image_shape", "n_detector"):
        return tuple(np.atleast_1d(a)) == tuple(np.atleast_1d(b))
    if key in ("image_offset", "angle_ends"):
        return all(isclose(x, y) for x, y in zip(a, b))
    return isclose(a, b)


def _fmt(key, v) -> str:
    if key == "angles":
        deg = np.rad2deg(v)
        head = ", ".join(f"{x:g}" for x in deg[:3])
        return f"{len(deg)} angles [{head}{', ...' if len(deg) > 3 else ''}] deg"
    if key == "angle_ends":
        return f"angles from {math.degrees(v[0]):g} to {math.degrees(v[1]):g} deg"
    return repr(v)


def merge(base: dict[str, Any], extra: dict[str, Any], *, file, base_name: str,
          extra_name: str) -> dict[str, Any]:
    """Union of two partial geometries; a field given by both with different
    values raises :class:`InputError`. Equal fields keep ``base``'s value."""
    out = dict(base)
    for key, value in extra.items():
        if key in out and not _same(key, out[key], value):
            raise InputError(f"contradictory geometry: {_fmt(key, out[key])} according to "
                             f"{base_name}, {_fmt(key, value)} according to {extra_name}",
                             file=file, field=key)
        out.setdefault(key, value)
    return out


def from_options(*, angles=None, geometry=None, options: dict[str, Any], file
                 ) -> tuple[dict[str, Any], int | None, str | None]:
    """Internal partial geometry from reader options.

    Parameters
    ----------
    angles : array_like, optional
        Angles in ``options['angle_unit']`` (default degrees).
    geometry : Geometry or dict, optional
        A full geometry, or a partial one in :meth:`Geometry.to_dict` form.
    options : dict
        :class:`~ctuq.data.io.options.GeometryOptions` fields (``image_shape``
        is accepted as an alias of ``image_size``).

    Returns
    -------
    partial : dict
    n_angles : int or None
        The ``n_angles`` option (when it alone gives the angles: equispaced
        over the default range when no source gives angles). The partial
        geometry holds ``angle_ends`` (radians) for ``angle_first`` and
        ``angle_last`` given without ``n_angles``: :func:`resolve` spaces as
        many angles between them as the data have rows.
    angle_unit : str or None
        ``'deg'``/``'rad'`` when the user set it (it also says how to read
        file angles without a units attribute).
    """
    from ctuq.data.io.options import GeometryOptions

    opts = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(opts) - set(GEOMETRY_OPTIONS))
    if unknown:
        raise InputError(f"unknown option{did_you_mean(unknown[0], GEOMETRY_OPTIONS)} (known: "
                         f"geometry, {', '.join(GEOMETRY_OPTIONS)})", file=file, field=unknown[0])
    if "image_shape" in opts:
        shape = opts.pop("image_shape")
        if "image_size" in opts and _shape(opts["image_size"], file=file, field="image_size") \
                != _shape(shape, file=file, field="image_shape"):
            raise InputError("image_size and image_shape disagree", file=file, field="image_size")
        opts["image_size"] = tuple(shape) if isinstance(shape, (list, tuple)) else shape
    if angles is not None:
        opts["angles"] = angles
    try:
        go = GeometryOptions.from_dict(opts, prefix="")
    except InputError as exc:
        raise InputError(exc.message, file=file, field=exc.field) from None
    return options_partial(go, geometry=geometry, file=file)


def options_partial(go, *, geometry=None, file) -> tuple[dict[str, Any], int | None,
                                                         str | None]:
    """:func:`from_options` for a :class:`~ctuq.data.io.options.GeometryOptions`."""
    part: dict[str, Any] = {}
    if geometry is not None:
        if isinstance(geometry, Geometry):
            part = from_geometry(geometry)
        else:
            part = normalise(geometry, file=file, source="geometry")
    opt: dict[str, Any] = {}
    if go.image_size is not None:
        opt["image_shape"] = _shape(go.image_size, file=file, field="image_size")
    for key in ("pixel_size", "detector_spacing", "source_origin", "origin_detector",
                "center_offset", "beam", "n_detector"):
        # center_offset "auto" is estimated from the data by the pipeline, not resolved here
        if getattr(go, key) is not None and not (key == "center_offset"
                                                 and isinstance(go.center_offset, str)):
            opt[key] = getattr(go, key)
    rad = go.angles_rad()
    if rad is not None:
        opt["angles"] = _angles_from(rad, degrees=False, file=file, field="angles")
    ends = go.angle_ends_rad()
    if ends is not None:
        opt["angle_ends"] = ends
    # kept beside the angles it made, so a count that differs from the data's
    # rows is reported as n_angles against the rows
    n_angles = go.n_angles
    part = merge(part, opt, file=file, base_name="the geometry option",
                 extra_name="the other options")
    if n_angles is not None and "angles" in part and len(part["angles"]) != n_angles:
        raise InputError(f"n_angles={n_angles} but {len(part['angles'])} angles were given",
                         file=file, field="n_angles")
    return part, n_angles, go.angle_unit


def default_image_side(beam: str, n_detector: int, spacing: float, pixel: float,
                       source_origin: float | None = None,
                       origin_detector: float | None = None,
                       center_offset: float = 0.0) -> int:
    """Largest square image side whose inscribed disc the detector sees.

    For parallel beam with ``pixel == spacing`` this is ``n_detector``
    (less twice the centre-of-rotation offset).
    """
    width = max(n_detector - 2 * abs(center_offset), 1) * spacing
    if beam == "parallel":
        radius = width / 2
    else:
        # flat detector: the ray through the detector edge passes the axis at
        # distance R * sin(atan(W / (2 (R + d)))).
        radius = source_origin * math.sin(math.atan(width / (2 * (source_origin
                                                                    + origin_detector))))
    return max(2, int(math.floor(2 * radius / pixel + 1e-9)))


def _transposed(count: int, n_rows: int, n_det: int) -> str:
    """A hint when ``count`` angles fit the data's columns but not its rows."""
    if count == n_det and count != n_rows:
        return (f"; its {n_det} columns would fit: is it transposed, [detector, angle] as "
                "scikit-image's radon writes? Transpose it to [angle, detector], or pass "
                "--convention skimage ([read] convention = \"skimage\")")
    return ""


def resolve(part: dict[str, Any], *, n_angles_data: int, n_detector_data: int,
            n_angles_opt: int | None = None, detector_distance: float | None = None,
            file) -> Geometry:
    """Build the :class:`Geometry` of data shaped ``(..., n_angles_data, n_detector_data)``.

    Defaults, applied only to fields no source gives:

    * ``n_detector``: the data's last dimension (a different given value is
      an error);
    * angles between ``angle_ends`` (both included): as many as the data
      have rows (``n_angles_opt``, when given, must equal that count);
    * angles from ``n_angles_opt`` alone: ``i * 180 / n`` deg (parallel) or
      ``i * 360 / n`` deg (fan), ``i = 0 .. n-1``, the angles of
      scikit-image's ``radon`` (``np.linspace(0, 180, n, endpoint=False)``)
      and of tomopy's ``angles(n)``; with no angles and no ``n_angles``, an
      :class:`InputError`;
    * ``beam``: ``'fan'`` if a source distance is known, else ``'parallel'``;
    * fan beam ``origin_detector``: the file's detector distance if any;
    * ``detector_spacing`` / ``pixel_size``: each other times / divided by the
      magnification; 1 mm when neither is given;
    * ``image_shape``: square, the largest side whose inscribed disc the
      detector sees (``n_detector`` for parallel beam with pixel size equal
      to the detector spacing).
    """
    g = dict(part)
    if "n_detector" in g and g["n_detector"] != n_detector_data:
        raise InputError(f"the geometry has {g['n_detector']} detector pixels but the data have "
                         f"{n_detector_data}", file=file, field="n_detector")
    if n_angles_opt is not None and n_angles_opt != n_angles_data:
        hint = _transposed(n_angles_opt, n_angles_data, n_detector_data) or \
            "; drop n_angles to take the count from the data"
        raise InputError(f"n_angles={n_angles_opt} but the data have {n_angles_data} projection "
                         f"rows (one per angle){hint}", file=file, field="n_angles")
    ends = g.pop("angle_ends", None)
    if ends is not None:
        if n_angles_data > 1 and ends[0] == ends[1]:
            raise InputError("angle_first equals angle_last: every angle the same", file=file,
                             field="angle_last")
        spaced = np.linspace(ends[0], ends[1], n_angles_data)
        if "angles" in g and not _same("angles", g["angles"], spaced):
            raise InputError(f"contradictory geometry: {_fmt('angles', g['angles'])} from the "
                             f"file or sidecar, {_fmt('angle_ends', ends)} in the options",
                             file=file, field="angle_first")
        g["angles"] = spaced
    if "angles" not in g:
        if n_angles_opt is None:
            raise InputError(
                f"no projection angles for the {n_angles_data} data rows: the file has none; "
                "give angles, or angle_first and angle_last, or n_angles alone for "
                "equispaced angles over [0, 180) deg (--angles, --angle-first ... on the "
                "command line, [geometry] in TOML), or put them in a sidecar JSON",
                file=file, field="angles")
    angles = g.get("angles")
    if angles is not None and n_angles_opt is not None and len(angles) != n_angles_opt:
        raise InputError(f"n_angles={n_angles_opt} contradicts the {len(angles)} angles given",
                         file=file, field="n_angles")
    if angles is not None and len(angles) != n_angles_data:
        raise InputError(f"{len(angles)} angles for {n_angles_data} projection rows in the "
                         f"data{_transposed(len(angles), n_angles_data, n_detector_data)}",
                         file=file, field="angles")

    beam = g.get("beam") or ("fan" if "source_origin" in g else "parallel")
    src = g.get("source_origin")
    det = g.get("origin_detector")
    if beam == "fan":
        if det is None and detector_distance is not None:
            det = detector_distance
        if src is None or det is None:
            missing = "source_origin" if src is None else "origin_detector"
            raise InputError("fan beam needs source_origin and origin_detector (mm); "
                             f"{missing} is missing", file=file, field=missing)
        mag = (src + det) / src
    else:
        if src is not None or det is not None:
            raise InputError("source/detector distances given for a parallel beam; pass "
                             "beam='fan' or drop them", file=file,
                             field="source_origin" if src is not None else "origin_detector")
        mag = 1.0
    if angles is None:
        span = math.pi if beam == "parallel" else 2 * math.pi
        # from 0, as scikit-image's radon and tomopy.angles (not Geometry.parallel's
        # cell midpoints): their sinograms then come back unrotated
        angles = np.arange(n_angles_data) * (span / n_angles_data)
        log.info("%s: no angles in the file; using %d equispaced angles over [0, %g) deg",
                 file, n_angles_data, math.degrees(span))

    pixel = g.get("pixel_size")
    spacing = g.get("detector_spacing")
    if pixel is None and spacing is None:
        spacing = 1.0
    if pixel is None:
        pixel = spacing / mag
    if spacing is None:
        spacing = pixel * mag
    shape = g.get("image_shape")
    if shape is None:
        if pixel <= 0 or spacing <= 0 or (beam == "fan" and (src <= 0 or det < 0)):
            side = 2  # let Geometry report the bad value below
        else:
            side = default_image_side(beam, n_detector_data, spacing, pixel, src, det,
                                      g.get("center_offset", 0.0))
        shape = (side, side)
    try:
        return Geometry(image_shape=shape, angles=angles, n_detector=n_detector_data,
                        pixel_size=pixel, detector_spacing=spacing, beam=beam,
                        source_origin=src if beam == "fan" else None,
                        origin_detector=det if beam == "fan" else None,
                        center_offset=g.get("center_offset", 0.0),
                        image_offset=g.get("image_offset", (0.0, 0.0)))
    except InputError as exc:
        raise InputError(exc.message, file=file, field=exc.field) from exc
