"""napari reader: sinogram files of every supported format and ctuq result files.

A sinogram opens as one image layer (``[angles, detector]``, or a stack
``[slices, angles, detector]``) whose ``metadata`` holds what the
reconstruction widget needs (see :func:`sinogram_layers`); a known ground
truth adds a second layer. A ctuq result file opens as reconstruction, std
and, when stored, FBP, ground truth and |error| layers (see
:func:`result_layers`).

The reader refuses (returns ``None``, so that napari tries other readers)
only files that are clearly not ctuq's: a path that is not a file, or a file
whose content is none of the supported formats although its extension is not
one of ours. A file that looks like ours but cannot be read shows one error
notification naming the file and the field, and opens no layer.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ctuq.errors import InputError

log = logging.getLogger(__name__)

#: Extensions the manifest registers the reader for.
EXTENSIONS = (".nxs", ".nx", ".h5", ".hdf5", ".hdf", ".cxi", ".npy", ".npz", ".tif", ".tiff")

#: ``layer.metadata`` keys written by the plugin.
ROLE = "ctuq_role"            # sinogram | ground_truth | fbp | reconstruction | std | error
GEOMETRY = "geometry"         # Geometry.to_dict() (angles in degrees) or None
SINOGRAM_META = "sinogram_meta"  # the Sinogram's meta dict
GROUND_TRUTH = "ground_truth"    # (sinogram layers) the truth array, when known
ASSUMED = "geometry_assumed"     # (sinogram layers) True when the angles were guessed
RESULT_INFO = "ctuq_result"      # (reconstruction layers) the rest of the Result

#: Layer-name suffixes of the result layers (``"<name> reconstruction"``...).
SUFFIX = {"fbp": "FBP", "ground_truth": "truth", "reconstruction": "reconstruction",
          "std": "std", "error": "|error|"}

LayerData = tuple[Any, dict, str]


# -- display helpers ------------------------------------------------------------
def _limits(lo: float, hi: float) -> tuple[float, float]:
    lo, hi = float(lo), float(hi)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return 0.0, 1.0
    if hi <= lo:
        hi = lo + (abs(lo) * 1e-3 or 1.0)
    return lo, hi


def image_limits(image, truth=None) -> tuple[float, float]:
    """Contrast limits of an image: the truth's range when known, else its 1–99 %."""
    ref = np.asarray(truth if truth is not None else image)
    if truth is not None:
        return _limits(ref.min(), ref.max())
    return _limits(*np.percentile(ref, [1, 99]))


def positive_limits(values) -> tuple[float, float]:
    """Contrast limits of a non-negative map (std, |error|): 0 to its 99.5 %."""
    return _limits(0.0, np.percentile(np.asarray(values), 99.5))


def base_name(path) -> str:
    """Layer-name stem of a file: its name without the extension."""
    return Path(path).stem


# -- layer builders -------------------------------------------------------------
def sinogram_layers(sinogram, name: str, *, assumed: bool = False) -> list[LayerData]:
    """Layer data of a :class:`~ctuq.data.io.Sinogram`: the sinogram and its truth.

    Parameters
    ----------
    sinogram : Sinogram
    name : str
        The sinogram layer's name; the truth layer is ``"<name> truth"``.
    assumed : bool
        The geometry was not in the file but guessed (the widget shows it
        for editing).

    Returns
    -------
    list of (data, kwargs, 'image')
        The sinogram layer's ``metadata`` holds ``ctuq_role='sinogram'``,
        ``geometry`` (:meth:`Geometry.to_dict`), ``sinogram_meta``,
        ``geometry_assumed`` and, when known, ``ground_truth`` (the array).
        A stack of one slice (a single detector row) opens as a 2-D sinogram.
    """
    if sinogram.is_stack and sinogram.n_slices == 1:
        sinogram = sinogram.slice(0)
    data = sinogram.data
    meta = {ROLE: "sinogram", GEOMETRY: sinogram.geometry.to_dict(),
            SINOGRAM_META: dict(sinogram.meta), ASSUMED: bool(assumed)}
    if sinogram.ground_truth is not None:
        meta[GROUND_TRUTH] = sinogram.ground_truth
    layers = [(data, {"name": name, "colormap": "gray", "metadata": meta,
                      "contrast_limits": _limits(*np.percentile(data, [0.5, 99.5]))}, "image")]
    if sinogram.ground_truth is not None:
        gt = sinogram.ground_truth
        layers.append((gt, {"name": f"{name} {SUFFIX['ground_truth']}", "colormap": "gray",
                            "contrast_limits": image_limits(gt, gt),
                            "metadata": {ROLE: "ground_truth",
                                         GEOMETRY: sinogram.geometry.to_dict()}}, "image"))
    return layers


def result_info(result) -> dict:
    """Everything of a :class:`~ctuq.data.io.Result` that is not shown as a layer."""
    return {"config": result.config, "hyperparameters": result.hyperparameters,
            "em_trace": result.em_trace, "metrics": result.metrics,
            "input_path": result.input_path, "input_sha256": result.input_sha256,
            "seed": result.seed, "device": result.device, "units": result.units,
            "version": result.version, "created": result.created,
            "variance": result.variance, "samples": result.samples, "dip": result.dip}


def result_layers(result, name: str) -> list[LayerData]:
    """Layer data of a :class:`~ctuq.data.io.Result`.

    Layers, bottom to top: ``"<name> FBP"`` (if stored, gray), ``"<name> truth"``
    (if known, gray), ``"<name> reconstruction"`` (gray), ``"<name> std"``
    (viridis), ``"<name> |error|"`` (if the truth is known, magma). Gray
    layers share the truth's range (else the reconstruction's 1–99 %); std
    and |error| go from 0 to their 99.5 %.
    """
    truth = result.ground_truth
    rec_limits = image_limits(result.reconstruction, truth)
    geom = None if result.geometry is None else result.geometry.to_dict()

    def meta(role, **extra):
        return {ROLE: role, GEOMETRY: geom, **extra}

    layers: list[LayerData] = []
    if result.fbp is not None:
        layers.append((result.fbp, {"name": f"{name} {SUFFIX['fbp']}", "colormap": "gray",
                                    "contrast_limits": rec_limits, "metadata": meta("fbp")},
                       "image"))
    if truth is not None:
        layers.append((truth, {"name": f"{name} {SUFFIX['ground_truth']}", "colormap": "gray",
                               "contrast_limits": rec_limits,
                               "metadata": meta("ground_truth")}, "image"))
    layers.append((result.reconstruction,
                   {"name": f"{name} {SUFFIX['reconstruction']}", "colormap": "gray",
                    "contrast_limits": rec_limits,
                    "metadata": meta("reconstruction", **{RESULT_INFO: result_info(result)})},
                   "image"))
    layers.append((result.std, {"name": f"{name} {SUFFIX['std']}", "colormap": "viridis",
                                "contrast_limits": positive_limits(result.std),
                                "metadata": meta("std")}, "image"))
    if truth is not None:
        err = np.abs(result.reconstruction - truth)
        layers.append((err, {"name": f"{name} {SUFFIX['error']}", "colormap": "magma",
                             "contrast_limits": positive_limits(err),
                             "metadata": meta("error")}, "image"))
    return layers


# -- reading ------------------------------------------------------------------
def _n_rows(path) -> int | None:
    """Projection rows of a sinogram file that has no angles (None if unknown)."""
    try:  # the array loader of ctuq.data.io, without the geometry resolution
        from ctuq.data.io.readers import _load

        return int(_load(Path(path), dataset=None, raw=None, format=None).data.shape[-2])
    except Exception:  # noqa: BLE001 - the caller reports the original error
        return None


def read_layers(path) -> list[LayerData]:
    """Read one file into napari layer data.

    Parameters
    ----------
    path : path-like
        A sinogram file (any format of :func:`ctuq.data.io.read_sinogram`) or
        a ctuq result file.

    Returns
    -------
    list of (data, kwargs, 'image')

    Raises
    ------
    InputError
        The file cannot be read (the message names the file and field).

    Notes
    -----
    A sinogram without angles (a bare ``.npy`` or TIFF without a sidecar) is
    opened with equispaced angles over 180° and ``geometry_assumed`` set, and
    a warning asks to check the geometry in the widget.
    """
    from ctuq.data.io import detect_format, read_result, read_sinogram

    name = base_name(path)
    if detect_format(path) == "result":
        return result_layers(read_result(path), name)
    try:
        return sinogram_layers(read_sinogram(path), name)
    except InputError as err:
        if err.field != "angles" or "no projection angles" not in err.message:
            raise
        rows = _n_rows(path)
        if rows is None:
            raise
    sino = read_sinogram(path, n_angles=rows)
    from napari.utils.notifications import show_warning

    show_warning(f"{os.path.basename(path)}: the file has no projection angles; assuming {rows} "
                 "equispaced angles over 180°. Check the geometry in the ctuq widget.")
    return sinogram_layers(sino, name, assumed=True)


def _looks_like_ours(path: str) -> bool:
    from ctuq.data.io import detect_format

    if Path(path).suffix.lower() in EXTENSIONS:
        return True
    try:  # another extension: ours only if the content is a known format
        detect_format(path)
    except InputError:
        return False
    return True


def napari_get_reader(path) -> Callable | None:
    """npe2 reader contribution: a reader function for ``path``, or None.

    Parameters
    ----------
    path : str or list of str

    Returns
    -------
    callable or None
        None when ``path`` is clearly not a ctuq file (not a regular file,
        or neither a known extension nor a known content). The function
        returns the layer data; when the file cannot be read it shows an
        error notification and returns ``[(None,)]`` (napari's "no layers").
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths or not all(os.path.isfile(p) and _looks_like_ours(os.fspath(p))
                            for p in paths):
        return None
    return reader_function


def reader_function(path) -> list:
    """Read one file or a list of files into napari layer data.

    Files that cannot be read give an error notification each and no layer.
    """
    from napari.utils.notifications import show_error

    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    layers: list = []
    for p in paths:
        try:
            layers.extend(read_layers(p))
        except InputError as err:
            log.warning("cannot open %s: %s", p, err)
            show_error(f"ctuq cannot open this file: {err}")
        except Exception as err:  # noqa: BLE001 - a bug, but keep the viewer usable
            log.exception("unexpected error reading %s", p)
            show_error(f"ctuq cannot open {p}: {type(err).__name__}: {err}")
    return layers or [(None,)]
