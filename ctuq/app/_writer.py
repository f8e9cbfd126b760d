"""napari writer: selected layers as a ctuq result file.

The writer takes the selected image layers (napari's multi-layer writer
contract: a path and a list of ``(data, attributes, layer_type)`` tuples),
recognises the reconstruction, std, FBP, ground truth, DIP and variance
among them by their ``ctuq_role`` metadata (else by the name suffixes
`` reconstruction``, `` std``...), and writes a NeXus NXtomoproc file with
:func:`ctuq.data.io.write_result`. **Any single layer can be saved alone**
(the std map, say): the file then holds that one image. Geometry, config,
hyperparameters, EM trace, metrics, provenance and the other stored arrays
(variance, samples) come from the layer that carries the result's metadata,
so a result file opened in napari and saved again reads back equal.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from ctuq.app._reader import GEOMETRY, RESULT_INFO, ROLE, SUFFIX
from ctuq.errors import InputError

log = logging.getLogger(__name__)

_INFO_FIELDS = ("config", "hyperparameters", "em_trace", "metrics", "input_path",
                "input_sha256", "seed", "device", "units", "version", "created",
                "provenance", "variance", "samples", "dip", "diagnostics", "residual")
#: Layer roles that are images of a result.
_IMAGE_ROLES = ("reconstruction", "std", "posterior_std", "model_error_std", "fbp",
                "ground_truth", "dip", "variance")


def _role(attributes: dict) -> str | None:
    role = (attributes.get("metadata") or {}).get(ROLE)
    if role:
        return role
    name = str(attributes.get("name", ""))
    # the longest suffix first: "x posterior std" is not "x std"
    for key, suffix in sorted(SUFFIX.items(), key=lambda kv: -len(kv[1])):
        if name.endswith(" " + suffix) or name == suffix:
            return key
    return None


def result_from_layers(layer_data: list[tuple[Any, dict, str]]):
    """Build a :class:`~ctuq.data.io.Result` from napari layer data tuples.

    Raises
    ------
    InputError
        No result image among them, a layer that is not a result image
        (a sinogram, the derived |error|), two layers of one role, or arrays
        that do not fit together.
    """
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Result

    by_role: dict[str, list] = {}
    for item in layer_data:
        data, attributes = item[0], (item[1] if len(item) > 1 else {})
        layer_type = item[2] if len(item) > 2 else "image"
        if layer_type != "image":
            continue
        role = _role(attributes)
        if role is None and len(layer_data) == 1:
            raise InputError(f"layer {attributes.get('name', '')!r} is not a ctuq result "
                             "layer (reconstruction, std, FBP, truth)", field="layers")
        if role is not None:
            by_role.setdefault(role, []).append((data, attributes))
    for role in ("error", "sinogram"):
        if role in by_role and not any(r in by_role for r in _IMAGE_ROLES):
            what = "the |error| map is derived from the reconstruction and the truth; " \
                   "select those" if role == "error" else "a sinogram is not a result"
            raise InputError(f"cannot save as a ctuq result: {what}", field="layers")
    images = {r: v for r, v in by_role.items() if r in _IMAGE_ROLES}
    if not images:
        raise InputError("select at least one ctuq result layer (reconstruction, std, FBP, "
                         "truth) to save a result", field="layers")
    for role, found in images.items():
        if len(found) != 1:
            raise InputError(f"{len(found)} {role} layers are selected; select one",
                             field="layers")
    # the metadata of the whole result rides on one layer (the reconstruction's normally)
    carrier = next((v[0][1] for r, v in images.items()
                    if (v[0][1].get("metadata") or {}).get(RESULT_INFO)), None)
    carrier = carrier if carrier is not None else next(iter(images.values()))[0][1]
    meta = carrier.get("metadata") or {}
    info = {k: v for k, v in (meta.get(RESULT_INFO) or {}).items() if k in _INFO_FIELDS}
    if "units" not in info and meta.get("units"):
        info["units"] = meta["units"]
    geom = meta.get(GEOMETRY)
    arrays = {role: np.asarray(v[0][0]) for role, v in images.items()}
    # stored arrays that no longer fit the (edited) layers are dropped, not guessed
    shape = next(iter(arrays.values())).shape
    for key in ("variance", "dip"):
        if key in arrays:
            info.pop(key, None)
        elif info.get(key) is not None and np.shape(info[key]) != shape:
            info.pop(key)
    if info.get("samples") is not None and (
            np.shape(info["samples"])[:-3] + np.shape(info["samples"])[-2:] != shape
            or "reconstruction" not in arrays):
        info.pop("samples")
    geometry = None if geom is None else Geometry.from_dict(geom)
    res = info.get("residual")
    if res is not None and (np.ndim(res) != len(shape) or (geometry is not None and np.shape(
            res)[-2:] != (geometry.n_angles, geometry.n_detector))):
        info.pop("residual")
    return Result(**arrays, geometry=geometry,
                  **{k: v for k, v in info.items() if v is not None})


def write_result_layers(path: str, layer_data: list[tuple[Any, dict, str]]) -> list[str]:
    """npe2 writer contribution: save the selected layers as a ctuq result file.

    Parameters
    ----------
    path : str
        The output file; replaced if it exists (napari's save dialog asks first).
    layer_data : list of (data, attributes, layer_type)
        One or more result layers (reconstruction, std, FBP, truth...), at
        most one of each.

    Returns
    -------
    list of str
        ``[path]``, or ``[]`` after an error notification when the layers or
        the path are not suitable.
    """
    from napari.utils.notifications import show_error

    from ctuq.data.io import write_result

    try:
        result = result_from_layers(layer_data)
        out = write_result(path, result, overwrite=True)
    except InputError as err:
        log.warning("cannot save %s: %s", path, err)
        show_error(f"ctuq cannot save the result: {err}")
        return []
    log.info("wrote %s", out)
    return [os.fspath(out)]
