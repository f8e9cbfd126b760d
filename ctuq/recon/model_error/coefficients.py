"""Coefficients of the model-error variance, their files and the shipped calibrations.

The model-error variance of a pixel is ``s0² + s1² e(x̂)²`` with ``e`` the edge
strength of the reconstruction (:func:`~ctuq.recon.model_error.edges.edge_strength`)
and ``s0 = t0 · rms(posterior std)``; :class:`ModelErrorCoefficients` holds
``(t0, s1)`` and a conformal multiplier, and is what ``ctuq calibrate`` writes.
How each term of :mod:`ctuq.recon.model_error.terms` sets them is described there.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.recon.model_error.edges import _img, edge_strength
from ctuq.recon.model_error.names import CALIBRATED, NONE

__all__ = ["ModelErrorCoefficients", "coefficients_for", "shipped_coefficients",
           "model_error_variance", "fit_to_truth", "conformal_scale", "DEFAULTS_DIR",
           "FILE_FORMAT"]

FILE_FORMAT = "ctuq-model-error"


#: Coefficients shipped per preset (``ctuq calibrate`` on the tuning split).
DEFAULTS_DIR = Path(__file__).parents[1] / "model_error_defaults"


def shipped_coefficients(preset: str) -> "ModelErrorCoefficients | None":
    """The calibration ctuq ships for ``preset`` (``model_error_defaults/<preset>.json``) or None."""
    shipped = DEFAULTS_DIR / f"{preset}.json"
    return ModelErrorCoefficients.load(shipped) if shipped.is_file() else None


@dataclass(frozen=True)
class ModelErrorCoefficients:
    """Coefficients of the model-error variance ``(t0 · rms(std_post))² + s1² e(x̂)²``.

    Parameters
    ----------
    t0 : float
        Constant term in units of the scan's RMS posterior std (>= 0).
    s1 : float
        Weight of the edge strength (dimensionless, >= 0).
    method : str
        The term that set them: a name of
        :data:`~ctuq.recon.model_error.terms.MODEL_ERROR_TERMS` (checked where a
        calibration is read for a term, :func:`~ctuq.recon.model_error.terms.coefficients_for`).
    conformal : float
        Multiplier of the posterior std of the split-conformal term
        (:func:`conformal_scale` on the calibration scans); 1 when not fitted.
    info : dict
        Provenance: what they were fitted on (JSON-able).
    """

    t0: float = 0.0
    s1: float = 0.0
    method: str = NONE
    conformal: float = field(default=1.0, metadata={"positive": True})
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        for f in fields(self):
            if f.type != "float":
                continue
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise InputError(f"must be a finite number >= 0, got {v!r}", field=f.name)
            if f.metadata.get("positive") and v == 0:  # a multiplier of the std
                raise InputError(f"must be > 0, got {v!r}", field=f.name)
        if not isinstance(self.method, str):
            raise InputError(f"must be a model-error term's name, got {self.method!r}",
                             field="method")

    # -- files ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FILE_FORMAT, "version": 1, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict, *, file=None) -> "ModelErrorCoefficients":
        if not isinstance(d, dict) or d.get("format") != FILE_FORMAT:
            raise InputError(f"not a ctuq model-error file (format {FILE_FORMAT!r} expected)",
                             file=file, field="format")
        keys = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in d.items() if k in keys})
        except InputError as err:
            raise InputError(err.message, file=file, field=err.field) from None
        except TypeError as err:
            raise InputError(str(err), file=file, field="model_error") from None

    def save(self, path) -> Path:
        """Write the coefficients as JSON (atomically)."""
        from ctuq.data.io import atomic_output

        path = Path(path)
        with atomic_output(path, overwrite=True) as tmp:
            Path(tmp).write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path) -> "ModelErrorCoefficients":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError("no such model-error file", file=path, field="model_error_file") \
                from None
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"cannot read the model-error file: {err}", file=path,
                             field="model_error_file") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"not valid JSON: {err}", file=path, field="model_error_file") \
                from None
        return cls.from_dict(data, file=path)

    # -- use --------------------------------------------------------------------
    def variance(self, x_hat, posterior_variance) -> Tensor:
        """The model-error variance map ``s0² + s1² e(x̂)²``, ``(H, W)`` float64."""
        return model_error_variance(x_hat, posterior_variance, self.t0, self.s1)


def model_error_variance(x_hat, posterior_variance, t0: float, s1: float) -> Tensor:
    """``(t0 · rms(std_post))² + s1² e(x̂)²`` per pixel, ``(H, W)`` float64.

    Parameters
    ----------
    x_hat : array or Tensor, shape (H, W)
        The reconstruction.
    posterior_variance : array or Tensor, shape (H, W)
        The linearised posterior's per-pixel variance (its mean sets the
        unit of ``t0``).
    t0, s1 : float
    """
    vp = _img(posterior_variance)
    e = edge_strength(x_hat)
    return (t0**2) * vp.mean() + (s1**2) * e.square()



# ------------------------------------------------------------------------------
# fits


def _positive_lbfgs(nll, init: list[float], max_iter: int = 200) -> Tensor:
    """Minimise ``nll(log_params)`` with L-BFGS; returns the minimiser (log space)."""
    p = torch.tensor(init, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([p], max_iter=max_iter, tolerance_grad=1e-10,
                            tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = nll(p)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return p.detach()


#: Starting point and floor of the fits, in log space: t0 = 1, s1 = 0.3.
_INIT = (0.0, math.log(0.3))
_LOG_MIN = math.log(1e-8)
#: A calibrated coefficient below this carries no prior (1e-3: a term of at most
#: 1e-6 of the posterior variance, or of the squared edge height).
_NEGLIGIBLE = 1e-3
#: Lower bound of the variances t0², s1² in the held-out search (a log-normal
#: prior is infinite at 0); at or below it a coefficient is reported as 0.
_VAR_MIN = 1e-16


def fit_to_truth(truths, means, posterior_variances) -> ModelErrorCoefficients:
    """Coefficients that maximise the pixel likelihood of known truths (the calibrated term).

    Maximises ``Σ_images mean_pixels log N(x; x̂, var_post + s0² + s1² e(x̂)²)``
    over ``(t0, s1)``: every image counts the same, whatever its size.

    Parameters
    ----------
    truths, means, posterior_variances : sequences of arrays, each (H, W)
        Ground truths, reconstructions and posterior variances of the
        calibration scans.

    Returns
    -------
    ModelErrorCoefficients
        With ``method`` the calibrated term's name and the mean log-likelihood in ``info``.
    """
    rows = []
    for t, m, v in zip(truths, means, posterior_variances, strict=True):
        vp = _img(v)
        rows.append(((_img(t) - _img(m)).square().reshape(-1), vp.reshape(-1),
                     vp.mean(), edge_strength(m).square().reshape(-1)))
    if not rows:
        raise InputError("no calibration images", field="truths")

    def nll(p):
        lp = p.clamp_min(_LOG_MIN)
        t0sq, s1sq = torch.exp(2 * lp[0]), torch.exp(2 * lp[1])
        total = 0
        for r2, vp, vbar, e2 in rows:
            var = vp + t0sq * vbar + s1sq * e2
            total = total + 0.5 * (r2 / var + var.log()).mean()
        return total / len(rows)

    p = _positive_lbfgs(nll, list(_INIT))
    t0, s1 = (float(math.exp(v)) if v > _LOG_MIN else 0.0 for v in p.tolist())
    ll = -float(nll(p)) - 0.5 * math.log(2 * math.pi)
    return ModelErrorCoefficients(t0, s1, CALIBRATED,
                                  info={"n_images": len(rows), "pixel_log_likelihood": ll})



def conformal_scale(truths, means, stds, coverage: float = math.erf(2 / math.sqrt(2))) -> float:
    """Split-conformal multiplier ``q / 2`` of the std for ``±2σ`` at ``coverage``.

    The score of a pixel is ``|x − x̂| / std``; with ``n`` pooled calibration
    pixels ``q`` is the ``⌈(n + 1) · coverage⌉``-th smallest score. The
    returned factor ``q / 2`` makes ``x̂ ± 2 · factor · std`` a conformal
    interval at that coverage (see the module docstring for what the
    guarantee covers).

    Parameters
    ----------
    truths, means, stds : sequences of arrays, each (H, W)
    coverage : float, optional
        Target coverage of the ±2σ interval. Default 0.9545.

    Returns
    -------
    float
    """
    if not 0 < coverage < 1:
        raise InputError(f"must be in (0, 1), got {coverage!r}", field="coverage")
    scores = torch.cat([((_img(t) - _img(m)).abs() / _img(s).clamp_min(1e-300)).reshape(-1)
                        for t, m, s in zip(truths, means, stds, strict=True)])
    n = scores.numel()
    if n == 0:
        raise InputError("no calibration pixels", field="truths")
    k = math.ceil((n + 1) * coverage)
    if k > n:
        raise InputError(f"{n} calibration pixels are too few for coverage {coverage}",
                         field="coverage")
    q = float(torch.kthvalue(scores, k).values)
    return q / 2.0
