"""napari writer: a reconstruction and its uncertainty as a ctuq result file.

The writer takes the selected image layers (napari's multi-layer writer
contract: a path and a list of ``(data, attributes, layer_type)`` tuples),
finds the reconstruction and the std among them by their ``ctuq_role``
metadata (else by the name suffixes `` reconstruction`` and `` std``), adds
the FBP and the ground truth when they are selected too, and writes a NeXus
NXtomoproc file with :func:`ctuq.data.io.write_result`. Geometry, config,
hyperparameters, EM trace, metrics and the other stored arrays (variance,
samples) come from the reconstruction layer's metadata, so a result file
opened in napari and saved again reads back equal.
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
                "variance", "samples", "dip")


def _role(attributes: dict) -> str | None:
    role = (attributes.get("metadata") or {}).get(ROLE)
    if role:
        return role
    name = str(attributes.get("name", ""))
    for key, suffix in SUFFIX.items():
        if name.endswith(" " + suffix) or name == suffix:
            return key
    return None


def result_from_layers(layer_data: list[tuple[Any, dict, str]]):
    """Build a :class:`~ctuq.data.io.Result` from napari layer data tuples.

    Raises
    ------
    InputError
        No reconstruction or no std layer among them, more than one of
        either, or arrays that do not fit together.
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
        if role is not None:
            by_role.setdefault(role, []).append((data, attributes))
    for role in ("reconstruction", "std"):
        found = by_role.get(role, [])
        if len(found) != 1:
            raise InputError(
                f"select exactly one reconstruction layer and one std layer to save a ctuq "
                f"result ({len(found)} {role} layer(s) selected)", field="layers")
    rec, rec_attrs = by_role["reconstruction"][0]
    std, _ = by_role["std"][0]
    meta = rec_attrs.get("metadata") or {}
    info = {k: v for k, v in (meta.get(RESULT_INFO) or {}).items() if k in _INFO_FIELDS}
    geom = meta.get(GEOMETRY)
    extra = {}
    for role, field in (("fbp", "fbp"), ("ground_truth", "ground_truth")):
        if len(by_role.get(role, [])) == 1:
            extra[field] = by_role[role][0][0]
    # stored arrays that no longer fit the (edited) layers are dropped, not guessed
    shape = np.shape(rec)
    for key in ("variance", "dip"):
        if info.get(key) is not None and np.shape(info[key]) != shape:
            info.pop(key)
    if info.get("samples") is not None and (
            np.shape(info["samples"])[:-3] + np.shape(info["samples"])[-2:] != shape):
        info.pop("samples")
    return Result(reconstruction=np.asarray(rec), std=np.asarray(std),
                  geometry=None if geom is None else Geometry.from_dict(geom),
                  **extra, **{k: v for k, v in info.items() if v is not None})


def write_result_layers(path: str, layer_data: list[tuple[Any, dict, str]]) -> list[str]:
    """npe2 writer contribution: save the selected layers as a ctuq result file.

    Parameters
    ----------
    path : str
        The output file; replaced if it exists (napari's save dialog asks first).
    layer_data : list of (data, attributes, layer_type)
        Must include one reconstruction and one std layer.

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
