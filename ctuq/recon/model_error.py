"""The fit's own error: an image-space variance beside the linearised posterior (docs/method.md §8.2).

The linearised posterior describes how far the weights may move given the
data around the fitted network; it does not contain the fit's own bias
(DIP+TV rounds and blurs edges), and evidence computed on the sinogram that
the network fitted cannot see that bias either. ctuq therefore models the
reconstruction error as (``docs/method.md``, "The fit's own error")::

    x − x̂ = J (θ − θ*) + δ,     δ ~ N(0, diag(s0² + s1² e(x̂)²))

with ``e(x̂)`` the edge strength of the reconstruction (:func:`edge_strength`)
and ``s0 = t0 · rms(posterior std)``, so that both coefficients ``t0`` and
``s1`` are free of the image's intensity unit. The total per-pixel variance
is ``var_post + s0² + s1² e²``; result files keep the three parts.

Three ways to set the coefficients:

``'heldout'`` (per scan, no ground truth)
    Fit the DIP on the angles without every ``k``-th one; the left-out
    projections ``y_out ~ N(A_out x̂_in, A_out V A_outᵀ + σ² I)``, ``V =
    diag(var_post + s0² + s1² e(x̂_in)²)``, give a likelihood of ``(t0,
    s1)`` (:func:`fit_heldout`); the coefficients are then applied to the
    fit on all angles.
``'calibrated'`` (per preset, from simulated scans)
    Maximise the pixel likelihood of known truths over ``(t0, s1)``
    (:func:`fit_to_truth`); ``ctuq calibrate`` writes the result to a small
    JSON file (:class:`ModelErrorCoefficients`) that a config names. ctuq
    ships such files for its presets, fitted on the tuning split.
``'conformal'`` (per preset, from simulated scans)
    Split-conformal scaling of the posterior std (:func:`conformal_scale`):
    with ``n`` calibration pixels, ``q`` is the ``⌈(n + 1) p⌉``-th smallest
    score ``|x − x̂| / std``; for a new pixel exchangeable with the
    calibration pixels, ``|x − x̂| ≤ q · std`` holds with probability at least
    ``p``. Pixels of one image are not independent and a user's image is not
    drawn from the calibration family, so the guarantee is marginal over
    images like the calibration ones, nothing more.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ctuq.errors import InputError

__all__ = ["METHODS", "ModelErrorCoefficients", "coefficients_for", "edge_strength", "model_error_variance",
           "fit_to_truth", "fit_heldout", "heldout_fit", "heldout_likelihood", "HeldoutLikelihood",
           "heldout_split", "conformal_scale", "shipped_coefficients",
           "edge_mask"]

METHODS = ("none", "heldout", "calibrated", "conformal")
FILE_FORMAT = "ctuq-model-error"


#: Coefficients shipped per preset (``ctuq calibrate`` on the tuning split).
DEFAULTS_DIR = Path(__file__).with_name("model_error_defaults")


def shipped_coefficients(preset: str) -> "ModelErrorCoefficients | None":
    """The calibration ctuq ships for ``preset`` (``model_error_defaults/<preset>.json``) or None."""
    shipped = DEFAULTS_DIR / f"{preset}.json"
    return ModelErrorCoefficients.load(shipped) if shipped.is_file() else None


def coefficients_for(preset: str, path=None) -> "ModelErrorCoefficients":
    """The calibration of ``path``, or the one shipped for ``preset``.

    Raises
    ------
    InputError
        No file given and none shipped for the preset, or a bad file.
    """
    if path is not None:
        return ModelErrorCoefficients.load(path)
    shipped = shipped_coefficients(preset)
    if shipped is None:
        raise InputError(f"ctuq ships no model-error calibration for preset {preset!r}: run "
                         "'ctuq calibrate --size SIDE --out FILE' (SIDE: the image side of "
                         "the scans) and set "
                         "uncertainty.model_error_file = FILE, or use model_error = 'heldout'",
                         field="uncertainty.model_error_file")
    return shipped


def _img(x) -> Tensor:
    t = torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x)
    if t.ndim != 2:
        raise InputError(f"expected an image (H, W), got shape {tuple(t.shape)}", field="image")
    return t.double()


def neighbour_difference(x) -> Tensor:
    """``max_j |x_i − x_j|`` over the 4-neighbours ``j`` of every pixel, ``(H, W)`` float64."""
    x = _img(x)
    d = torch.zeros_like(x)
    a, b = (x[1:] - x[:-1]).abs(), (x[:, 1:] - x[:, :-1]).abs()
    d[:-1] = torch.maximum(d[:-1], a)
    d[1:] = torch.maximum(d[1:], a)
    d[:, :-1] = torch.maximum(d[:, :-1], b)
    d[:, 1:] = torch.maximum(d[:, 1:], b)
    return d


def edge_strength(x) -> Tensor:
    """The edge feature ``e(x)``: the largest neighbour difference within one pixel.

    :func:`neighbour_difference` followed by a 3×3 maximum filter, so that
    the pixels on both sides of an edge and their neighbours (where a blurred
    edge puts its error) get the edge's height.

    Parameters
    ----------
    x : array or Tensor, shape (H, W)

    Returns
    -------
    Tensor, shape (H, W), float64
        In the unit of ``x``.
    """
    d = neighbour_difference(x)
    return F.max_pool2d(d[None, None], 3, stride=1, padding=1)[0, 0]


def edge_mask(truth, threshold: float = 0.1) -> Tensor:
    """Pixels within one pixel of an edge of ``truth``, ``(H, W)`` bool.

    An edge is a neighbour difference above ``threshold`` times the truth's
    range; the mask is that set dilated by a 3×3 square (the metric
    "coverage on edges" of the benchmarks).
    """
    t = _img(truth)
    rng = float(t.max() - t.min())
    e = neighbour_difference(t) > threshold * rng if rng > 0 else torch.zeros_like(t, dtype=bool)
    return F.max_pool2d(e[None, None].double(), 3, stride=1, padding=1)[0, 0] > 0


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
        How they were obtained: ``'heldout'``, ``'calibrated'``, ``'conformal'``
        or ``'none'``.
    conformal : float
        Multiplier of the posterior std used by the ``'conformal'`` method
        (:func:`conformal_scale` on the calibration scans); 1 when not fitted.
    info : dict
        Provenance: what they were fitted on (JSON-able).
    """

    t0: float = 0.0
    s1: float = 0.0
    method: str = "none"
    conformal: float = 1.0
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("t0", "s1", "conformal"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise InputError(f"must be a finite number >= 0, got {v!r}", field=name)
        if self.conformal <= 0:
            raise InputError(f"must be > 0, got {self.conformal!r}", field="conformal")
        if self.method not in METHODS:
            raise InputError(f"must be one of {', '.join(METHODS)}, got {self.method!r}",
                             field="method")

    # -- files ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FILE_FORMAT, "version": 1, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict, *, file=None) -> "ModelErrorCoefficients":
        if not isinstance(d, dict) or d.get("format") != FILE_FORMAT:
            raise InputError(f"not a ctuq model-error file (format {FILE_FORMAT!r} expected)",
                             file=file, field="format")
        keys = {"t0", "s1", "method", "conformal", "info"}
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
    """Coefficients that maximise the pixel likelihood of known truths (method ``'calibrated'``).

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
        With ``method='calibrated'`` and the mean log-likelihood in ``info``.
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
    return ModelErrorCoefficients(t0, s1, "calibrated",
                                  info={"n_images": len(rows), "pixel_log_likelihood": ll})


def heldout_split(n_angles: int, every: int, min_out: int = 0) -> np.ndarray:
    """Mask of the left-out angles: every ``every``-th, starting at ``every // 2``.

    When that leaves out fewer than ``min_out`` angles, ``every`` is lowered
    (not below 3, so two thirds of the angles stay in the fit) until it does:
    a scan with few angles otherwise keeps too few held-out rays to see the
    model error at all (at 30 angles every 6th is 5 angles; every 4th, 7).

    Parameters
    ----------
    n_angles : int
    every : int
        At least 2.
    min_out : int, optional
        Fewest left-out angles wanted. Default 0 (``every`` as given).

    Returns
    -------
    ndarray of bool, shape (n_angles,)

    Raises
    ------
    InputError
        If fewer than 2 angles would be left out or fewer than 4 kept.
    """
    if not isinstance(every, int) or isinstance(every, bool) or every < 2:
        raise InputError(f"must be an integer >= 2, got {every!r}", field="heldout_every")
    while every > 3 and _every_kth(n_angles, every).sum() < min_out:
        every -= 1
    out = _every_kth(n_angles, every)
    if out.sum() < 2 or (~out).sum() < 4:
        raise InputError(f"{n_angles} angles are too few to leave every {every}-th out "
                         f"(need >= 2 left out and >= 4 kept)", field="heldout_every")
    return out


def _every_kth(n_angles: int, every: int) -> np.ndarray:
    """Every ``every``-th of ``n_angles``, starting at ``every // 2`` (a bool mask)."""
    return (np.arange(n_angles) % every) == (every // 2)


def heldout_fit(y, op, dip_config, *, every: int = 6, min_out: int = 0,
                noise_std: float | None = None, progress=None, cancel=None):
    """The DIP fit without every ``every``-th angle, for :func:`fit_heldout`.

    The network input is the FBP of the kept angles only, so nothing of the
    left-out projections reaches the fit: the FBP of the whole angle grid
    with the left-out rows set to zero, scaled by ``n_angles / n_kept``
    (ODL's FBP needs equispaced angles; this is the FBP of the kept ones with
    the missing ones' weight spread evenly).

    Parameters
    ----------
    y : Tensor, shape (n_angles, n_detector)
    op : RayTransform
        The operator of all angles.
    dip_config : DIPConfig
        The same settings as the fit on all angles.
    every : int, optional
        Leave out every ``every``-th angle (:func:`heldout_split`). Default 6.
    min_out : int, optional
        Leave out at least this many angles (:func:`heldout_split`). Default 0.
    noise_std : float, optional
        For the TV weight (as in :func:`ctuq.recon.dip.fit_dip`).
    progress, cancel : callable, optional
        Progress events carry the stage ``'model error'``.

    Returns
    -------
    out_mask : ndarray of bool, shape (n_angles,)
    dip : DIPResult
        The fit on the kept angles.
    """
    import dataclasses

    from ctuq.data.operators import RayTransform
    from ctuq.recon.dip import fit_dip

    geometry = op.geometry
    out_mask = heldout_split(geometry.n_angles, every, min_out)
    keep = torch.as_tensor(~out_mask)
    y = torch.as_tensor(y, dtype=torch.float32).reshape(geometry.range_shape).to(op.device)
    zero_filled = y.clone()
    zero_filled[~keep.to(y.device)] = 0
    with torch.no_grad():
        net_input = op.fbp(zero_filled) * (geometry.n_angles / int(keep.sum()))
    op_in = RayTransform(dataclasses.replace(geometry, angles=geometry.angles[~out_mask]),
                         backend=op.backend, device=op.device)
    dip = fit_dip(y[keep.to(y.device)], op_in, dip_config, noise_std=noise_std,
                  progress=progress, cancel=cancel, stage="model error",
                  net_input=net_input)
    return out_mask, dip


def _projection_rows(op, rows: np.ndarray, batch: int = 256):
    """Rows ``A[rows, :]`` of the ray transform as a scipy CSR matrix, by adjoint products."""
    import scipy.sparse as sp

    n_meas = int(np.prod(op.range_shape))
    parts = []
    for start in range(0, len(rows), batch):
        idx = torch.as_tensor(rows[start:start + batch])
        unit = torch.zeros(len(idx), n_meas, dtype=torch.float32, device=op.device)
        unit[torch.arange(len(idx)), idx.to(op.device)] = 1.0
        with torch.no_grad():
            back = op.A_adjoint(unit.reshape(len(idx), *op.range_shape))
        dense = back.reshape(len(idx), -1).cpu().numpy()
        dense[np.abs(dense) < 1e-7 * max(float(np.abs(dense).max()), 1e-30)] = 0
        parts.append(sp.csr_matrix(dense))
    return sp.vstack(parts).tocsr()


@dataclass(frozen=True)
class HeldoutLikelihood:
    """The Gaussian likelihood of held-out projections as a function of ``(t0, s1)``.

    ``r ~ N(0, M_post + t0² M_const + s1² M_edge + σ² I)``, with ``r`` the
    residuals of the held-out measurements and each ``M`` the Gram matrix
    ``B diag(w) Bᵀ`` of their projection rows ``B`` (``w`` the posterior
    variance, its mean, ``e(x̂_in)²``). Made by :func:`heldout_likelihood`;
    the arrays are all a fit needs, so they can be stored and refitted.

    Attributes
    ----------
    r : ndarray, shape (m,)
    M_post, M_const, M_edge : ndarray, shape (m, m)
    noise_var : float
    heldout_angles : int
    """

    r: np.ndarray
    M_post: np.ndarray
    M_const: np.ndarray
    M_edge: np.ndarray
    noise_var: float
    heldout_angles: int = 0

    def _factor(self, v):
        """``(summed nll, Cholesky factor, α = M⁻¹ r)`` at the variances ``v = (t0², s1²)``.

        ``None`` where ``M`` is not positive definite.
        """
        M = torch.as_tensor(self.M_post + v[0] * self.M_const + v[1] * self.M_edge)
        M.diagonal().add_(self.noise_var)
        L, info = torch.linalg.cholesky_ex(M)
        if int(info) != 0:
            return None
        r = torch.as_tensor(self.r)
        alpha = torch.cholesky_solve(r[:, None], L)[:, 0]
        return float(0.5 * (r @ alpha) + torch.log(torch.diagonal(L)).sum()), L, alpha

    def _nll_at_variances(self, v) -> float:
        f = self._factor(v)
        return math.inf if f is None else f[0] / len(self.r)

    def nll(self, log_t0: float, log_s1: float) -> float:
        """Negative log-likelihood per measurement (without ``log 2π / 2``); ``inf`` if not PD."""
        return self._nll_at_variances([math.exp(2 * max(float(lp), _LOG_MIN))
                                       for lp in (log_t0, log_s1)])

    def _total_nll_and_grad(self, v) -> tuple[float, np.ndarray]:
        """Summed negative log-likelihood and its gradient in the variances ``(t0², s1²)``.

        ``∂/∂v_k = ½ (tr(M⁻¹ M_k) − αᵀ M_k α)`` with ``α = M⁻¹ r``. In the
        variances (not their logarithms) the gradient does not vanish at 0,
        so a search that reaches the boundary can leave it.
        """
        f = self._factor(np.maximum(np.asarray(v, dtype=np.float64), 0.0))
        if f is None:
            return 1e300, np.zeros(2)
        total, L, alpha = f
        inv = torch.cholesky_inverse(L)
        grad = np.array([0.5 * (float((inv * Mk).sum()) - float(alpha @ (Mk @ alpha)))
                         for Mk in (torch.as_tensor(self.M_const), torch.as_tensor(self.M_edge))])
        return total, grad

    def fit(self, prior: "ModelErrorCoefficients | None" = None, prior_width: float = 1.0, *,
            mle: "ModelErrorCoefficients | None" = None) -> "ModelErrorCoefficients":
        """Maximum likelihood, or maximum a posteriori under a log-normal prior.

        Parameters
        ----------
        prior : ModelErrorCoefficients, optional
            Centre of the prior: ``log t0 ~ N(log prior.t0, prior_width²)``
            and the same for ``s1``. A coefficient below 1e-3 in ``prior``
            (the calibration found no such term; a log-normal prior cannot
            be centred on zero) gets no prior. Without ``prior``, the
            maximum-likelihood estimate.
        prior_width : float, optional
            Standard deviation of the prior in natural-log units (> 0).
            Default 1.0.
        mle : ModelErrorCoefficients, optional
            This likelihood's maximum-likelihood fit, when already made (it
            is reported beside the prior's).

        Returns
        -------
        ModelErrorCoefficients
            ``method='heldout'``; ``info`` has the fit's details and, with a
            prior, the maximum-likelihood values beside it (``'mle'``).
        """
        from scipy.optimize import minimize

        m = len(self.r)
        centre = None
        if prior is not None:
            if not (isinstance(prior_width, (int, float)) and prior_width > 0
                    and math.isfinite(prior_width)):
                raise InputError(f"must be a finite number > 0, got {prior_width!r}",
                                 field="uncertainty.heldout_prior_width")
            centre = [math.log(c) if c >= _NEGLIGIBLE else None for c in (prior.t0, prior.s1)]

        def objective(v, with_prior: bool):
            total, grad = self._total_nll_and_grad(v)
            if with_prior:  # log-normal on t0 = √v0 and s1 = √v1
                for k, c in enumerate(centre):
                    if c is not None:
                        z = (0.5 * math.log(v[k]) - c) / prior_width
                        total += 0.5 * z * z
                        grad[k] += z / prior_width * 0.5 / v[k]
            return total, grad

        def search(with_prior: bool):
            # exact gradients (a Cholesky and its inverse per evaluation): L-BFGS-B needs
            # ~20 evaluations where a derivative-free search needed ~200
            best = minimize(objective, np.exp(2 * np.array(_INIT)), args=(with_prior,),
                            jac=True, method="L-BFGS-B", bounds=[(_VAR_MIN, 1e8)] * 2,
                            options={"ftol": 1e-13, "gtol": 1e-8, "maxiter": 500})
            return [float(math.sqrt(v)) if v > _VAR_MIN else 0.0 for v in best.x], best.x

        (t0, s1), v = search(centre is not None)
        info = {"heldout_angles": int(self.heldout_angles), "measurements": int(m),
                "nll_per_measurement": self._nll_at_variances(v),
                "nll_without_model_error": self._nll_at_variances([_VAR_MIN, _VAR_MIN])}
        if centre is not None:
            t0_ml, s1_ml = search(False)[0] if mle is None else (mle.t0, mle.s1)
            info.update(prior={"t0": prior.t0, "s1": prior.s1, "width": float(prior_width)},
                        mle={"t0": t0_ml, "s1": s1_ml})
        return ModelErrorCoefficients(t0, s1, "heldout", info=info)

    def arrays(self) -> dict:
        """The fields as numpy arrays (for ``np.savez``); :meth:`from_arrays` reads them."""
        return {"r": self.r, "M_post": self.M_post, "M_const": self.M_const,
                "M_edge": self.M_edge, "noise_var": np.float64(self.noise_var),
                "heldout_angles": np.int64(self.heldout_angles)}

    @classmethod
    def from_arrays(cls, arrays) -> "HeldoutLikelihood":
        return cls(*(np.asarray(arrays[k], np.float64) for k in ("r", "M_post", "M_const",
                                                                  "M_edge")),
                   float(arrays["noise_var"]), int(arrays["heldout_angles"]))


def heldout_likelihood(op, y, out_mask, x_hat_in, posterior_variance, noise_var: float, *,
                       max_rows: int = 2048, seed: int = 0) -> HeldoutLikelihood:
    """The likelihood of the held-out projections given ``(t0, s1)``.

    The left-out measurements ``y_out`` of a DIP fit ``x̂_in`` on the other
    angles are modelled as ``N(A_out x̂_in, A_out V A_outᵀ + σ² I)`` with
    ``V = diag(var_post + s0² + s1² e(x̂_in)²)`` (exact, by a Cholesky factor
    per evaluation).

    Parameters
    ----------
    op : RayTransform
        The operator of all angles (``op.A_adjoint`` gives the rows of ``A``).
    y : Tensor, shape (n_angles, n_detector)
        The whole sinogram.
    out_mask : array of bool, shape (n_angles,)
        The left-out angles (:func:`heldout_split`).
    x_hat_in : array or Tensor, shape (H, W)
        The reconstruction fitted without the left-out angles.
    posterior_variance : array or Tensor, shape (H, W)
        The linearised posterior's per-pixel variance (of the fit on all
        angles: a stand-in for the subset fit's, which is a little larger).
    noise_var : float
        ``σ²`` of the measurements.
    max_rows : int, optional
        At most this many left-out measurements enter the likelihood (an even
        subsample beyond it; the marginal of a Gaussian is exact). Default 2048.
    seed : int, optional
        Seed of that subsample. Default 0.

    Returns
    -------
    HeldoutLikelihood
    """
    y = torch.as_tensor(y).reshape(op.range_shape)
    out_mask = np.asarray(out_mask, dtype=bool)
    n_det = op.range_shape[1]
    rows = (np.flatnonzero(out_mask)[:, None] * n_det + np.arange(n_det)[None]).reshape(-1)
    with torch.no_grad():
        pred = op.A(torch.as_tensor(x_hat_in, dtype=torch.float32).to(op.device)).reshape(-1)
    r_all = (y.reshape(-1).to(pred) - pred).double().cpu().numpy()
    B = _projection_rows(op, rows)
    keep = np.flatnonzero(B.getnnz(axis=1) > 0)  # rays that miss the image carry no error
    if len(keep) > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(keep, max_rows, replace=False))
    if len(keep) < 8:
        raise InputError("too few held-out measurements see the image", field="heldout_every")
    B = B[keep]
    vp = _img(posterior_variance).reshape(-1).numpy()
    e2 = edge_strength(x_hat_in).square().reshape(-1).numpy()

    def gram(w):
        return np.asarray((B.multiply(w[None]) @ B.T).toarray(), dtype=np.float64)

    return HeldoutLikelihood(r_all[rows[keep]], gram(vp), gram(np.full_like(vp, vp.mean())),
                             gram(e2), float(noise_var), int(out_mask.sum()))


def fit_heldout(op, y, out_mask, x_hat_in, posterior_variance, noise_var: float, *,
                max_rows: int = 2048, seed: int = 0, prior: ModelErrorCoefficients | None = None,
                prior_width: float = 1.0) -> ModelErrorCoefficients:
    """Coefficients from the likelihood of held-out projections (method ``'heldout'``).

    :func:`heldout_likelihood` followed by :meth:`HeldoutLikelihood.fit`:
    the maximum-likelihood ``(t0, s1)``, or with ``prior`` (a calibration
    of the preset, :func:`coefficients_for`) the maximum a posteriori under
    a log-normal prior of width ``prior_width`` around it. The prior matters
    where the held-out projections cannot see the model error (few angles,
    high noise: the likelihood is flat down to ``t0 = s1 = 0``) and fades
    where they can.

    Parameters
    ----------
    op, y, out_mask, x_hat_in, posterior_variance, noise_var, max_rows, seed
        As :func:`heldout_likelihood`.
    prior : ModelErrorCoefficients, optional
        Centre of the prior. Default None: maximum likelihood.
    prior_width : float, optional
        Natural-log standard deviation of the prior. Default 1.0.

    Returns
    -------
    ModelErrorCoefficients
        With ``method='heldout'`` and the fit's details in ``info``.
    """
    lik = heldout_likelihood(op, y, out_mask, x_hat_in, posterior_variance, noise_var,
                             max_rows=max_rows, seed=seed)
    return lik.fit(prior, prior_width)


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
