"""Reconstruction results: the :class:`Result` object (its NeXus NXtomoproc
file: :mod:`ctuq.data.io.result_file`, ``docs/file_formats.md``)."""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctuq.data.geometry import Geometry
from ctuq.data.io import result_file as _file
from ctuq.data.io._common import check_array
from ctuq.data.io.result_file import _IMAGES, DEFINITION, squared_units  # noqa: F401 (re-export)
from ctuq.errors import InputError

log = logging.getLogger(__name__)

_ARRAYS = ("reconstruction", "std", "variance", "posterior_std", "model_error_std", "samples",
           "fbp", "dip", "ground_truth")
#: Images that are standard deviations or variances (never negative).
_SPREADS = ("std", "variance", "posterior_std", "model_error_std")


def _default_version() -> str:
    import ctuq
    return str(getattr(ctuq, "__version__", "0"))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(eq=False)
class Result:
    """A reconstruction with its uncertainty and everything needed to redo it.

    Parameters
    ----------
    reconstruction : array_like, shape (H, W) or (S, H, W), optional
        Posterior mean image(s), float32.
    std : array_like, same shape, optional
        Total standard deviation (>= 0): the linearised posterior's and the
        model error's together, ``std² = posterior_std² + model_error_std²``.
        At least one image (reconstruction, std, variance, fbp, dip, ground
        truth, posterior_std, model_error_std) is needed; a result of one
        image is what napari's export of a single layer writes.
    variance : array_like, optional
        Total variance, same shape (>= 0).
    posterior_std, model_error_std : array_like, optional
        The two parts of ``std``: the spread of the linearised posterior (the
        data's uncertainty given the fitted network) and the model-error term
        (the fit's own bias, :mod:`ctuq.recon.model_error`), same shape.
    samples : array_like, optional
        A subset of posterior samples, ``(k, H, W)`` or ``(S, k, H, W)``.
    fbp, dip, ground_truth : array_like, optional
        Same shape as ``reconstruction``.
    geometry : Geometry, optional
        Its ``image_shape`` must be ``(H, W)``; gives the axes in mm.
    config : dict
        The full effective configuration, JSON-able (tuples read back as lists).
    hyperparameters : dict
        Learned hyperparameters, name -> float or list of floats.
    em_trace : list of dict
        One JSON-able dict per EM step.
    metrics : dict
        Name -> float (PSNR, SSIM, calibration, ...), when a ground truth was known.
    input_path, input_sha256 : str, optional
        The input file and its SHA-256 (see :func:`ctuq.data.io.sha256_file`).
    seed : int, optional
    device : str, optional
    units : str, optional
        Units of the images (e.g. ``"1/mm"``), written as ``@units``.
    provenance : dict
        How it was made: library versions, thread count, effective device,
        run id, the requested settings (JSON-able).
    version : str
        ctuq version; default ``ctuq.__version__`` (``"0"`` if unset).
    created : str
        ISO 8601 creation time; default now (UTC).
    diagnostics : dict
        The checks of the data and of the fit, JSON-able (empty when none ran):
        ``chi2_dof``, ``chi2_per_angle``, ``verdict`` (``'ok'``/``'misfit'``),
        ``reason``, ``threshold`` of the data-consistency check
        (:mod:`ctuq.recon.consistency`), ``warnings`` (list of str: the data
        checks before the fit), ``center`` (an estimated centre of rotation).
    residual : array_like, shape (n_angles, n_detector) or (S, n_angles, n_detector), optional
        The whitened residual ``(y − A x̂) / σ`` of the reconstruction
        (dimensionless), float32.
    posterior : object, optional
        In memory only (never written): the fitted posterior of the
        reconstruction (:class:`ctuq.recon.posterior_handle.Posterior`), for
        more samples or the std of a region. None after :func:`read_result`.

    Raises
    ------
    InputError
        Wrong shapes or dimensions, non-finite values, negative std/variance,
        a geometry that does not match, or fields of the wrong type.
    """

    reconstruction: np.ndarray | None = None
    std: np.ndarray | None = None
    variance: np.ndarray | None = None
    posterior_std: np.ndarray | None = None
    model_error_std: np.ndarray | None = None
    samples: np.ndarray | None = None
    fbp: np.ndarray | None = None
    dip: np.ndarray | None = None
    ground_truth: np.ndarray | None = None
    geometry: Geometry | None = None
    config: dict[str, Any] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    em_trace: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    input_path: str | None = None
    input_sha256: str | None = None
    seed: int | None = None
    device: str | None = None
    units: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    version: str = field(default_factory=_default_version)
    created: str = field(default_factory=_now)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    residual: np.ndarray | None = None
    posterior: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        rec = None
        for name in _IMAGES:
            v = getattr(self, name)
            if v is None:
                continue
            arr = check_array(v, file=None, field=name, ndims=(2, 3) if rec is None
                              else (rec.ndim,))
            if rec is not None and arr.shape != rec.shape:
                raise InputError(f"has shape {arr.shape}; the other images have {rec.shape}",
                                 field=name)
            if name in _SPREADS and np.any(arr < 0):
                raise InputError("has negative values", field=name)
            setattr(self, name, arr)
            rec = arr if rec is None else rec
        if rec is None:
            raise InputError("a result needs at least one image (reconstruction or std)",
                             field="reconstruction")
        if self.samples is not None:
            s = check_array(self.samples, file=None, field="samples", ndims=(rec.ndim + 1,))
            want = (rec.shape[:-2] + (s.shape[rec.ndim - 2],) + rec.shape[-2:])
            if s.shape != want:
                raise InputError(f"has shape {s.shape}; (k, H, W) or (S, k, H, W) matching the "
                                 f"reconstruction {rec.shape} expected", field="samples")
            self.samples = s
        if self.residual is not None:
            res = check_array(self.residual, file=None, field="residual", ndims=(rec.ndim,))
            if res.ndim == 3 and res.shape[0] != rec.shape[0]:
                raise InputError(f"has {res.shape[0]} slices; the images have {rec.shape[0]}",
                                 field="residual")
            self.residual = res
        if self.geometry is not None:
            if not isinstance(self.geometry, Geometry):
                raise InputError(f"must be a Geometry, got {type(self.geometry).__name__}",
                                 field="geometry")
            if tuple(self.geometry.image_shape) != rec.shape[-2:]:
                raise InputError(f"image shape {self.geometry.image_shape} does not match the "
                                 f"reconstruction {rec.shape}", field="geometry")
            want = (self.geometry.n_angles, self.geometry.n_detector)
            if self.residual is not None and tuple(self.residual.shape[-2:]) != want:
                raise InputError(f"has shape {self.residual.shape}; the geometry's sinogram is "
                                 f"{want}", field="residual")
        for name, kind in (("config", dict), ("hyperparameters", dict), ("metrics", dict),
                           ("em_trace", list), ("provenance", dict), ("diagnostics", dict)):
            if not isinstance(getattr(self, name), kind):
                raise InputError(f"must be a {kind.__name__}", field=name)
        if not all(isinstance(step, dict) for step in self.em_trace):
            raise InputError("must be a list of dicts, one per EM step", field="em_trace")
        metrics = {}
        for k, v in self.metrics.items():
            if not isinstance(k, str) or not k or "/" in k or k in (".", ".."):
                raise InputError(f"metric name {k!r} must be a non-empty string without '/'",
                                 field="metrics")
            try:
                metrics[k] = float(v)
            except (TypeError, ValueError):
                raise InputError(f"must be a number, got {v!r}", field=f"metrics.{k}") from None
        self.metrics = metrics
        for name in ("input_path", "input_sha256", "device", "units", "version", "created"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, os.PathLike):
                    v = os.fspath(v)
                if not isinstance(v, str):
                    raise InputError(f"must be a string, got {type(v).__name__}", field=name)
                setattr(self, name, v)
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
                raise InputError(f"must be an integer, got {self.seed!r}", field="seed")
            self.seed = int(self.seed)

    @property
    def image(self) -> np.ndarray:
        """The main image: the reconstruction, else the first image present."""
        return next(getattr(self, n) for n in _IMAGES if getattr(self, n) is not None)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.image.shape)

    @property
    def is_stack(self) -> bool:
        return self.image.ndim == 3

    def save(self, path, *, overwrite: bool = False) -> Path:
        """Write this result to ``path`` as a NeXus file (:func:`ctuq.data.io.write_result`).

        The in-memory ``posterior`` is not written.
        """
        return write_result(path, self, overwrite=overwrite)

    def __repr__(self) -> str:
        parts = [" x ".join(map(str, self.shape))]
        present = [n for n in _IMAGES if getattr(self, n) is not None]
        parts.append("images " + ", ".join(present))
        if self.std is not None:
            parts.append(f"mean std {float(self.std.mean()):.4g}"
                         + (f" {self.units}" if self.units else ""))
        if self.geometry is not None:
            g = self.geometry
            parts.append(f"{g.beam} beam, {g.n_angles} angles")
        shown = [k for k in ("psnr", "ssim", "coverage_2sigma") if k in self.metrics]
        if shown:
            parts.append(", ".join(f"{k} {self.metrics[k]:.4g}" for k in shown))
        if self.input_path:
            parts.append(f"input {Path(self.input_path).name}")
        if self.posterior is not None:
            parts.append("posterior in memory")
        return "Result(" + "; ".join(parts) + ")"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Result):
            return NotImplemented
        for name in _ARRAYS + ("residual",):
            a, b = getattr(self, name), getattr(other, name)
            if (a is None) != (b is None):
                return False
            if a is not None and not np.array_equal(a, b, equal_nan=True):
                return False
        if (self.geometry is None) != (other.geometry is None):
            return False
        if self.geometry is not None and self.geometry != other.geometry:
            return False
        same_metrics = (self.metrics.keys() == other.metrics.keys() and all(
            self.metrics[k] == other.metrics[k]
            or (math.isnan(self.metrics[k]) and math.isnan(other.metrics[k]))
            for k in self.metrics))
        return same_metrics and all(getattr(self, n) == getattr(other, n) for n in (
            "config", "hyperparameters", "em_trace", "input_path", "input_sha256", "seed",
            "device", "units", "version", "created", "provenance", "diagnostics"))

    __hash__ = None


def write_result(path, result: Result, *, overwrite: bool = False) -> Path:
    """Write a :class:`Result` as a NeXus NXtomoproc HDF5 file, atomically
    (the layout: :mod:`ctuq.data.io.result_file`, ``docs/file_formats.md``).

    Parameters
    ----------
    path : path-like
        Output file (conventionally ``.h5`` or ``.nxs``).
    result : Result
    overwrite : bool, optional
        Replace an existing file; the input file (``result.input_path``) is
        never replaced. Default False.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    InputError
        Not a Result; the target exists (without ``overwrite``), is the
        input, or cannot be written; a dict is not JSON-able. Nothing is left
        behind on failure.
    """
    if not isinstance(result, Result):
        raise InputError(f"must be a Result, got {type(result).__name__}", field="result")
    return _file.write_fields(path, result, overwrite=overwrite)


def read_result(path) -> Result:
    """Read a result file written by :func:`write_result`.

    Parameters
    ----------
    path : path-like

    Returns
    -------
    Result
        Equal to the one written (dict values as JSON gives them back).

    Raises
    ------
    InputError
        Missing, not HDF5, corrupt or truncated, not an NXtomoproc file,
        missing or malformed fields.
    """
    kw = _file.read_fields(path)
    try:
        return Result(**kw)
    except InputError as exc:
        raise InputError(exc.message, file=str(path), field=exc.field) from exc
