"""napari reader: sinogram files of every supported format and ctuq result files.

A sinogram opens as one image layer (``[angles, detector]``, or a stack
``[slices, angles, detector]``) whose ``metadata`` holds what the
reconstruction widget needs (see :func:`sinogram_layers`); a known ground
truth adds a second layer. A ctuq result file opens as reconstruction, std
and, when stored, FBP, ground truth and |error| layers, and the std's two
parts, posterior std and model-error std (see :func:`result_layers`).

The reader refuses (returns ``None``, so that napari tries other readers)
only files that are clearly not ctuq's: a path that is not a file, or a file
whose content is none of the supported formats although its extension is not
one of ours. A file that looks like ours but cannot be read shows one error
notification naming the file and the field, and opens no layer.

Files are opened in a child process with a time limit
(:mod:`ctuq.data.io.isolated`): a corrupt HDF5 file that crashes or hangs the
HDF5 library is one error notification, never a dead or frozen viewer.

Result images are in physical units: mm (``scale`` = pixel size,
``translate`` putting the rotation axis at 0, ``units`` mm), so napari's
scale bar reads mm. A sinogram file's layers (the sinogram and its truth)
are in index space (angle row × detector pixel, image pixels; no units):
napari draws all layers of a viewer in one world with one unit per axis, and
an angle is not a length, so a sinogram in degrees × mm beside images in mm
would make napari drop the units of every layer (the reconstruction widget
shows its results in a viewer of their own for that reason).
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
          "std": "total std", "posterior_std": "posterior std",
          "model_error_std": "model-error std", "error": "|error|",
          "residual": "whitened residual"}
#: Roles of the three std layers, drawn on one colour scale.
STD_ROLES = ("std", "posterior_std", "model_error_std")

LayerData = tuple[Any, dict, str]

#: Time limit of reading one file for the viewer (seconds; napari waits for it):
#: ``$CTUQ_READ_TIMEOUT``, else 30 s plus 1 s per 20 MB of file.
READ_TIMEOUT = float(os.environ["CTUQ_READ_TIMEOUT"]) if os.environ.get(
    "CTUQ_READ_TIMEOUT") else None


def image_placement(geometry) -> dict:
    """``scale``, ``translate`` and ``units`` of an image layer (mm, axis at 0)."""
    if geometry is None:
        return {}
    h, w = geometry.image_shape
    p = geometry.pixel_size
    drow, dcol = geometry.image_offset
    return {"scale": (p, p), "translate": ((0.5 - h / 2 + drow) * p, (0.5 - w / 2 + dcol) * p),
            "units": ("mm", "mm")}


def sinogram_placement(geometry) -> dict:
    """``scale``, ``translate`` and ``units`` of a sinogram layer (degrees x mm)."""
    deg = geometry.angles_deg
    step = float(np.mean(np.diff(deg))) if deg.size > 1 else 1.0
    if step == 0:
        step = 1.0
    s = geometry.detector_spacing
    first_u = (0.5 - geometry.n_detector / 2 - geometry.center_offset) * s
    return {"scale": (step, s), "translate": (float(deg[0]), first_u),
            "units": ("degree", "mm")}


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
    # index space, no units: see the module's docstring
    layers = [(data, {"name": name, "colormap": "gray", "metadata": meta,
                      "contrast_limits": _limits(*np.percentile(data, [0.5, 99.5]))},
               "image")]
    if sinogram.ground_truth is not None:
        gt = sinogram.ground_truth
        layers.append((gt, {"name": f"{name} {SUFFIX['ground_truth']}", "colormap": "gray",
                            "contrast_limits": image_limits(gt, gt),
                            "metadata": {ROLE: "ground_truth",
                                         GEOMETRY: sinogram.geometry.to_dict()}},
                       "image"))
    return layers


def _lead(place: dict, n: int) -> dict:
    """Placement of a layer with ``n`` leading (slice) axes: unit steps there."""
    if not place or n <= 0:
        return place
    return {"scale": (1.0,) * n + tuple(place["scale"]),
            "translate": (0.0,) * n + tuple(place["translate"]),
            "units": ("pixel",) * n + tuple(place["units"])}


def result_info(result) -> dict:
    """Everything of a :class:`~ctuq.data.io.Result` that is not shown as a layer."""
    return {"config": result.config, "hyperparameters": result.hyperparameters,
            "em_trace": result.em_trace, "metrics": result.metrics,
            "input_path": result.input_path, "input_sha256": result.input_sha256,
            "seed": result.seed, "device": result.device, "units": result.units,
            "version": result.version, "created": result.created,
            "provenance": result.provenance, "diagnostics": result.diagnostics,
            "residual": result.residual,
            "variance": result.variance, "samples": result.samples, "dip": result.dip}


def result_layers(result, name: str) -> list[LayerData]:
    """Layer data of a :class:`~ctuq.data.io.Result`.

    Layers, bottom to top: ``"<name> FBP"`` (if stored, gray), ``"<name> truth"``
    (if known, gray), ``"<name> reconstruction"`` (gray), ``"<name> model-error
    std"``, ``"<name> posterior std"`` and ``"<name> total std"`` (each if
    stored; viridis), ``"<name> |error|"`` (if the truth is known, magma).
    The whitened residual is :func:`residual_layer`'s (index space).
    Gray layers share the truth's range (else the reconstruction's 1–99 %);
    the three std maps share one scale, 0 to the total std's 99.5 %, so that
    they compare by colour; |error| goes from 0 to its 99.5 %.
    """
    truth = result.ground_truth
    rec_limits = image_limits(result.image, truth)
    geom = None if result.geometry is None else result.geometry.to_dict()
    place = _lead(image_placement(result.geometry), result.image.ndim - 2)
    info = {RESULT_INFO: result_info(result)}

    def meta(role, **extra):
        return {ROLE: role, GEOMETRY: geom, "units": result.units, **extra}

    def layer(role, data, colormap, limits, **extra):
        return (data, {"name": f"{name} {SUFFIX[role]}", "colormap": colormap,
                       "contrast_limits": limits, "metadata": meta(role, **extra), **place},
                "image")

    # the result's other fields ride on the first of reconstruction / std / any image
    shown = ("reconstruction", "std", "posterior_std", "model_error_std", "fbp", "ground_truth")
    carrier = next((n for n in shown if getattr(result, n) is not None), None)
    layers: list[LayerData] = []
    if result.fbp is not None:
        layers.append(layer("fbp", result.fbp, "gray", rec_limits,
                            **(info if carrier == "fbp" else {})))
    if truth is not None:
        layers.append(layer("ground_truth", truth, "gray", rec_limits,
                            **(info if carrier == "ground_truth" else {})))
    if result.reconstruction is not None:
        layers.append(layer("reconstruction", result.reconstruction, "gray", rec_limits,
                            **info))
    spreads = {r: getattr(result, r) for r in STD_ROLES if getattr(result, r) is not None}
    if spreads:
        top = spreads.get("std", next(iter(spreads.values())))
        std_limits = positive_limits(top)
        for role in ("model_error_std", "posterior_std", "std"):  # the total on top
            if role in spreads:
                layers.append(layer(role, spreads[role], "viridis", std_limits,
                                    **(info if carrier == role else {})))
    if truth is not None and result.reconstruction is not None:
        err = np.abs(result.reconstruction - truth)
        layers.append(layer("error", err, "magma", positive_limits(err)))
    return layers


def residual_layer(result, name: str) -> LayerData | None:
    """The whitened residual ``(y − A x̂)/σ`` of a result as a layer, or None.

    A sinogram (angle × detector) in index space like the sinogram layers, so
    it belongs beside the sinogram, not among the result's layers in mm (one
    viewer with both would have inconsistent units). PiYG around 0, at least
    ±3 (three noise stds).
    """
    r = result.residual
    if r is None:
        return None
    top = max(3.0, float(np.percentile(np.abs(r), 99.5)))
    geom = None if result.geometry is None else result.geometry.to_dict()
    return (r, {"name": f"{name} {SUFFIX['residual']}", "colormap": "PiYG",
                "contrast_limits": (-top, top),
                "metadata": {ROLE: "residual", GEOMETRY: geom, "units": None,
                             "verdict": (result.diagnostics or {}).get("verdict")}},
            "image")


# -- reading ------------------------------------------------------------------
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
    from ctuq.data.io.isolated import read_any_isolated

    name = base_name(path)
    kind, obj = read_any_isolated(path, timeout=READ_TIMEOUT, assume_angles=True)
    if kind == "result":
        return result_layers(obj, name)
    sino = obj
    if not sino.meta.get("angles_assumed"):
        return sinogram_layers(sino, name)
    from napari.utils.notifications import show_warning

    n = sino.geometry.n_angles
    show_warning(f"{os.path.basename(path)}: the file has no projection angles; assuming "
                 f"{n} angles i·180°/{n} (0° to {180 * (n - 1) / n:g}°). Check the geometry "
                 "in the ctuq widget.")
    return sinogram_layers(sino, name, assumed=True)


def _looks_like_ours(path: str) -> bool:
    from ctuq.data.io import detect_format_isolated

    if Path(path).suffix.lower() in EXTENSIONS:
        return True
    try:  # another extension: ours only if the content is a known format
        detect_format_isolated(path, timeout=READ_TIMEOUT)
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
