"""The held-out estimate of the model error: a second fit without some angles, and the
likelihood of the left-out projections as a function of ``(t0, s1)``."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from ctuq.errors import InputError
from ctuq.recon.model_error.coefficients import (_INIT, _LOG_MIN, _NEGLIGIBLE, _VAR_MIN,
                                                 ModelErrorCoefficients)
from ctuq.recon.model_error.edges import _img, edge_strength
from ctuq.recon.model_error.names import HELDOUT

log = logging.getLogger(__name__)

__all__ = ["heldout_split", "heldout_fit", "heldout_data", "HeldoutData", "kept_rows",
           "heldout_step_length", "heldout_misfit", "preferred_input", "HeldoutLikelihood",
           "heldout_likelihood", "fit_heldout", "correlated_rows"]


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
        raise InputError(f"{n_angles} angles are too few for the held-out model error, "
                         f"which leaves out every {_ordinal(every)} angle and needs at least "
                         f"2 left out and 4 kept; use more angles, or another "
                         f"uncertainty.model_error ('calibrated', 'conformal' or 'none')",
                         field="heldout_every")
    return out


def _ordinal(n: int) -> str:
    """``3`` → ``'3rd'``, ``11`` → ``'11th'``, ``22`` → ``'22nd'``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _every_kth(n_angles: int, every: int) -> np.ndarray:
    """Every ``every``-th of ``n_angles``, starting at ``every // 2`` (a bool mask)."""
    return (np.arange(n_angles) % every) == (every // 2)


def heldout_fit(y, op, dip_config, *, every: int = 6, min_out: int = 0,
                noise_std: float | None = None, ray_variance=None, progress=None,
                cancel=None, monitor=None, data: "HeldoutData | None" = None):
    """The DIP fit without every ``every``-th angle, for :func:`fit_heldout`.

    The network input is made from the kept angles only, so nothing of the
    left-out projections reaches the fit: with ``net_input = 'fbp'`` the FBP of
    the whole angle grid with the left-out rows set to zero, scaled by
    ``n_angles / n_kept`` (ODL's FBP needs equispaced angles; this is the FBP of
    the kept ones with the missing ones' weight spread evenly); with ``'tv'`` the
    TV reconstruction of the kept rows.

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
    ray_variance : Tensor, optional
        ``v``, the per-ray relative noise variance (``(n_angles,
        n_detector)``) of the count noise model; the kept rows weigh the fit
        as in :func:`ctuq.recon.dip.fit_dip`. Default None.
    progress, cancel : callable, optional
        Progress events carry the stage ``'model error'``.
    monitor : callable, optional
        ``monitor(iteration, image)`` as in :func:`ctuq.recon.dip.fit_dip`.
    data : HeldoutData, optional
        :func:`heldout_data` of the same arguments, made beforehand. Default:
        made here.

    Returns
    -------
    out_mask : ndarray of bool, shape (n_angles,)
    dip : DIPResult
        The fit on the kept angles.
    """
    from ctuq.recon.dip import fit_dip

    data = data or heldout_data(y, op, dip_config, every=every, min_out=min_out,
                                noise_std=noise_std, ray_variance=ray_variance)
    dip = fit_dip(data.y, data.op, dip_config, noise_std=noise_std,
                  ray_variance=data.ray_variance, progress=progress, cancel=cancel,
                  stage="model error", net_input=data.net_input, monitor=monitor)
    return data.out_mask, dip


@dataclass
class HeldoutData:
    """What a held-out fit is made from (:func:`heldout_data`)."""

    #: ndarray of bool, shape (n_angles,): the left-out angles.
    out_mask: np.ndarray
    #: The operator of the kept angles.
    op: object
    #: Tensor, shape (n_kept, n_detector): their data.
    y: torch.Tensor
    #: Tensor or None: their count noise model's ``v``.
    ray_variance: torch.Tensor | None
    #: Tensor, shape (H, W), or None (``'noise'``: the fit seeds its own).
    net_input: torch.Tensor | None


def heldout_data(y, op, dip_config, *, every: int = 6, min_out: int = 0,
                 noise_std: float | None = None, ray_variance=None) -> HeldoutData:
    """The kept rows and the network input of a held-out fit (:func:`heldout_fit`).

    Made apart from the fit so that fits of several inputs can run side by side
    with everything that builds operators or calls ODL done first, in one thread.
    The input comes from the kept angles only: the FBP of the whole angle grid
    with the left-out rows set to zero, scaled by ``n_angles / n_kept``
    (``'fbp'``), or the TV reconstruction of the kept rows (``'tv'``).
    """
    from ctuq.recon.dip import make_net_input

    out_mask = heldout_split(op.geometry.n_angles, every, min_out)
    y = torch.as_tensor(y, dtype=torch.float32).reshape(op.geometry.range_shape).to(op.device)
    op_in, y_in, v_in = kept_rows(op, y, out_mask, ray_variance)
    net_input = None  # 'noise': the fit's own seeded input
    if dip_config.net_input == "fbp":
        zero_filled = y.clone()
        zero_filled[torch.as_tensor(out_mask).to(y.device)] = 0
        with torch.no_grad():
            net_input = op.fbp(zero_filled) * (op.geometry.n_angles / int((~out_mask).sum()))
    elif dip_config.net_input == "tv":
        net_input = make_net_input(y_in, op_in, dip_config, op_in.device, noise_std)[0, 0]
    return HeldoutData(out_mask, op_in, y_in, v_in, net_input)


def kept_rows(op, y, out_mask, ray_variance=None):
    """The operator, data and per-ray variances of the kept angles (``~out_mask``).

    Returns
    -------
    op_in : RayTransform
        The operator of the kept angles only.
    y_in : Tensor, shape (n_kept, n_detector)
    v_in : Tensor, shape (n_kept, n_detector), or None
        The count noise model's ``v`` of the kept rows (None without one).
    """

    from ctuq.data.operators import RayTransform

    geometry = op.geometry
    keep = torch.as_tensor(~np.asarray(out_mask, dtype=bool))
    y = torch.as_tensor(y, dtype=torch.float32).reshape(geometry.range_shape).to(op.device)
    op_in = RayTransform(dataclasses.replace(geometry, angles=geometry.angles[keep.numpy()]),
                         backend=op.backend, device=op.device)
    v_in = None if ray_variance is None else torch.as_tensor(
        ray_variance, dtype=torch.float32).reshape(geometry.range_shape)[keep]
    return op_in, y[keep.to(y.device)], v_in


def heldout_misfit(op, y, out_mask, x_in, ray_variance=None, *, per_angle: bool = False):
    """How well ``x_in`` predicts the left-out rows: ``mean(w · (y_out − A_out x_in)²)``.

    ``w = 1 / v`` with the count noise model's per-ray variances, else 1; in
    the unit of ``y²`` (the noise variance ``σ²`` is common to every image
    scored on the same rows, so it is left out). Used to choose between fits
    that differ in a setting (``dip.net_input = 'auto'``).

    Parameters
    ----------
    op : RayTransform
        The operator of all angles.
    y : Tensor, shape (n_angles, n_detector)
    out_mask : array of bool, shape (n_angles,)
        The left-out angles (:func:`heldout_split`).
    x_in : Tensor, shape (H, W)
        An image made without the left-out rows.
    ray_variance : Tensor, optional
        ``v``, shape (n_angles, n_detector). Default None (every ray alike).
    per_angle : bool, optional
        Return the mean of each left-out angle instead. Default False.

    Returns
    -------
    float, or ndarray of shape (n_out,) with ``per_angle``
    """
    r, w = _left_out_residual(op, y, out_mask, x_in, ray_variance)
    if per_angle:
        return (w * r * r).mean(dim=1).cpu().numpy()
    return float((w * r * r).mean())


def _left_out_projection(op, out_mask, x):
    """``A x`` on the left-out rows, in the operator's float32, shape (n_out, n_detector)."""
    rows = torch.as_tensor(np.asarray(out_mask, dtype=bool))
    with torch.no_grad():
        ax = op.A(torch.as_tensor(x, dtype=torch.float32).to(op.device))
    return ax[rows.to(ax.device)]


def _left_out_residual(op, y, out_mask, x, ray_variance=None):
    """``(y − A x)`` on the left-out rows and their weights ``1 / v`` (1 without ``v``),
    float64, shape (n_out, n_detector)."""
    rows = torch.as_tensor(np.asarray(out_mask, dtype=bool))
    ax = _left_out_projection(op, out_mask, x)
    shape = op.geometry.range_shape
    r = (torch.as_tensor(y).reshape(shape).to(ax)[rows.to(ax.device)] - ax).double()
    w = torch.ones_like(r) if ray_variance is None else 1.0 / torch.as_tensor(
        ray_variance).reshape(shape)[rows].to(r)
    return r, w


def preferred_input(per_angle: dict, reference: str, t_min: float) -> tuple[str, dict]:
    """The input whose held-out fit predicts the left-out angles clearly better than
    ``reference``'s, else ``reference``.

    For each other input, the paired differences ``d_a = m_ref,a − m_a`` of the
    per-angle misfits (:func:`heldout_misfit` with ``per_angle``) give ``t =
    mean(d) / (std(d) / √n)``, a one-sided paired t statistic over the ``n``
    left-out angles; the input of the largest ``t`` is taken when that ``t``
    exceeds ``t_min``. A lower mean misfit alone is not enough: the left-out
    angles share the noise and the object, and on scans not drawn on the pixel
    grid a small lead in projection space can come with a worse image.

    Parameters
    ----------
    per_angle : dict of str to array of shape (n,)
        The per-angle misfits of each input's held-out fit (the same angles).
    reference : str
        The input kept unless another is clearly better (a key of ``per_angle``).
    t_min : float
        The threshold on ``t``.

    Returns
    -------
    chosen : str
    t : dict of str to float
        ``t`` of every input but ``reference`` (±1e9 where the differences do not vary).
    """
    ref = np.asarray(per_angle[reference], dtype=np.float64)
    t = {}
    for name, m in per_angle.items():
        if name == reference:
            continue
        d = ref - np.asarray(m, dtype=np.float64)
        se = float(d.std(ddof=1)) / math.sqrt(d.size) if d.size > 1 else 0.0
        t[name] = float(d.mean()) / se if se > 0 else math.copysign(1e9, float(d.mean()))
        t[name] = float(np.clip(t[name], -1e9, 1e9))
    best = max(t, key=t.get) if t else reference
    return (best if t and t[best] > t_min else reference), t


def heldout_step_length(op, y, out_mask, x_in, step_in, ray_variance=None) -> float:
    """How far along ``step_in`` the held-out fit's image best predicts the left-out rows.

    ``argmin_a ‖y_out − A_out (x_in + a · step_in)‖²`` (weighted by ``1 / v``
    with the count noise model's per-ray variances), clipped to ``[0, 1]``:
    0 keeps the fit's output, 1 takes the whole step. The left-out noise is
    independent of the rows the step fitted, so a step that fits noise
    predicts them worse and is shortened.

    Parameters
    ----------
    op : RayTransform
        The operator of all angles.
    y : Tensor, shape (n_angles, n_detector)
    out_mask : array of bool, shape (n_angles,)
        The left-out angles (:func:`heldout_split`).
    x_in, step_in : Tensor, shape (H, W)
        The held-out fit's output and its step.
    ray_variance : Tensor, optional
        ``v``, shape (n_angles, n_detector). Default None (every ray alike).

    Returns
    -------
    float
        In ``[0, 1]``; 0 when the step does not reach the left-out rows.
    """
    r, w = _left_out_residual(op, y, out_mask, x_in, ray_variance)
    q = _left_out_projection(op, out_mask, step_in).double()
    qq = float((w * q * q).sum())
    if not qq > 0:
        return 0.0
    return float(min(max(float((w * q * r).sum()) / qq, 0.0), 1.0))


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


def correlated_rows(B, shape, length: float, batch: int = 256):
    """``B G``: each row of ``B`` (an image) convolved with a Gaussian of std ``length`` px.

    ``G`` is the convolution with ``g ∝ exp(−|u|² / (2 length²))`` scaled to
    ``Σ g² = 1``, so a pixel error ``e = G diag(√w) z`` (``z`` white) has the
    covariance ``G diag(w) Gᵀ``: errors correlated over about ``length``
    pixels whose variance at a pixel is ``w`` where ``w`` is locally constant
    (``(g² ∗ w)`` in general). The projections of such errors have the Gram
    matrix ``(B G) diag(w) (B G)ᵀ``. Zero padding at the image border.

    Parameters
    ----------
    B : scipy.sparse matrix, shape (m, H·W)
    shape : (int, int)
        ``(H, W)``.
    length : float
        In pixels; 0 (or below 0.1, where the kernel is one pixel) returns ``B``.
    batch : int, optional
        Rows convolved at once. Default 256.

    Returns
    -------
    scipy.sparse.csr_matrix, shape (m, H·W)
    """
    import scipy.sparse as sp
    import torch.nn.functional as F

    if length < 0.1:
        return B.tocsr()
    radius = int(math.ceil(4 * length))
    u = torch.arange(-radius, radius + 1, dtype=torch.float64)
    g = torch.exp(-0.5 * (u / length) ** 2)
    g = (g / g.square().sum().sqrt()).float()  # Σ (g gᵀ)² = (Σ g²)² = 1
    H, W = shape
    parts = []
    for start in range(0, B.shape[0], batch):
        x = torch.as_tensor(B[start:start + batch].toarray(), dtype=torch.float32)
        x = F.conv2d(x.reshape(-1, 1, H, W), g.reshape(1, 1, -1, 1), padding=(radius, 0))
        x = F.conv2d(x, g.reshape(1, 1, 1, -1), padding=(0, radius)).reshape(len(x), -1)
        dense = x.numpy()
        dense[np.abs(dense) < 1e-6 * max(float(np.abs(dense).max()), 1e-30)] = 0
        parts.append(sp.csr_matrix(dense))
    return sp.vstack(parts).tocsr()


def _finite(x: float) -> float | None:
    """``x``, or None where it is not finite (a result file's JSON has no inf)."""
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class HeldoutLikelihood:
    """The Gaussian likelihood of held-out projections as a function of ``(t0, s1)``.

    ``r ~ N(0, M_post + t0² M_const + s1² M_edge + k σ² V)``, with ``r`` the
    residuals of the held-out measurements and each ``M`` the Gram matrix
    ``B diag(w) Bᵀ`` of their projection rows ``B`` (``w`` the posterior
    variance, its mean, ``e(x̂_in)²``). Made by :func:`heldout_likelihood`;
    the arrays are all a fit needs, so they can be stored and refitted.

    ``V = diag(v)`` the per-ray relative noise variances of the count noise
    model (``V = I`` without them).

    Attributes
    ----------
    r : ndarray, shape (m,)
    M_post, M_const, M_edge : ndarray, shape (m, m)
    noise_var : float
    heldout_angles : int
    ray_variance : ndarray, shape (m,), or None
        ``v`` of the held-out measurements; None: ``V = I``.
    image : ndarray, shape (H, W), or None
        ``x̂_in``, the image whose residuals ``r`` are (not used by the fit:
        kept so that a stored likelihood can be judged against a known
        truth, or rebuilt with other features).
    out_mask : ndarray of bool, shape (n_angles,), or None
        The left-out angles (as ``image``, for a rebuild).
    correlation_length : float
        The pixel correlation length (px) ``M_const`` and ``M_edge`` were
        made with (:func:`correlated_rows`; 0: independent pixels).
    noise_scale : float
        ``k``: the residuals are read with the noise variance ``k σ² V``
        (``heldout_noise``, :func:`ctuq.recon.model_error.terms.heldout_noise_scale`;
        1: the run's ``σ²``). Kept apart from ``noise_var`` so that a stored
        likelihood can be refitted under another rule.
    """

    r: np.ndarray
    M_post: np.ndarray
    M_const: np.ndarray
    M_edge: np.ndarray
    noise_var: float
    heldout_angles: int = 0
    ray_variance: np.ndarray | None = None
    image: np.ndarray | None = None
    out_mask: np.ndarray | None = None
    correlation_length: float = 0.0
    noise_scale: float = 1.0

    def _factor(self, v):
        """``(summed nll, Cholesky factor, α = M⁻¹ r)`` at the variances ``v = (t0², s1²)``.

        ``None`` where ``M`` is not positive definite.
        """
        M = torch.as_tensor(self.M_post + v[0] * self.M_const + v[1] * self.M_edge)
        noise = self.noise_var * self.noise_scale
        if self.ray_variance is None:
            M.diagonal().add_(noise)
        else:
            M.diagonal().add_(noise * torch.as_tensor(self.ray_variance))
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
            mle: "ModelErrorCoefficients | None" = None,
            floor: bool = False, floor_reject: float = math.inf,
            texture: bool = False) -> "ModelErrorCoefficients":
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
        floor : bool, optional
            With ``prior``: the calibration is also a lower bound. A
            coefficient the calibration found negligible stays zero (not
            fitted); each other is the larger of its maximum a posteriori
            and the calibration's. The held-out projections may then widen
            the calibrated interval where they see more error, never narrow
            it (docs/defaults.md: a free ``t0`` takes up the data's excess
            over the noise model, not the image's error). Default False.
        floor_reject : float, optional
            With ``floor``: the floor is dropped (the maximum a posteriori kept,
            negligible coefficients still held at zero) where the held-out
            log-likelihood at the floored coefficients is more than this many
            nats below the maximum a posteriori's: the projections reject it (on
            piecewise-constant images the calibration's ``s1`` predicts several
            times the held-out residual they show; docs/defaults.md). Default
            ``inf``: never dropped.
        texture : bool, optional
            The image is a texture (``heldout_texture_threshold``,
            :func:`~ctuq.recon.model_error.terms.edge_concentration`): its error is
            not where its edges are, and the calibration, made on piecewise-constant
            images, is no estimate of it. Both coefficients are then fitted by maximum
            likelihood (the prior's centre does not pull them); with ``floor`` a
            coefficient the calibration found negligible is fitted instead of held
            at zero, and the others keep the calibration as their lower bound.
            Default False.

        Returns
        -------
        ModelErrorCoefficients
            ``method``: the held-out term's name; ``info`` has the fit's details and, with a
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

        # with the floor, a coefficient the calibration found negligible is held at zero
        held = [floor and not texture and centre is not None and c is None
                for c in (centre or [None, None])]

        def search(with_prior: bool, held=(False, False)):
            # exact gradients (a Cholesky and its inverse per evaluation): L-BFGS-B needs
            # ~20 evaluations where a derivative-free search needed ~200
            best = minimize(objective, np.exp(2 * np.array(_INIT)), args=(with_prior,),
                            jac=True, method="L-BFGS-B",
                            bounds=[(_VAR_MIN, _VAR_MIN if h else 1e8) for h in held],
                            options={"ftol": 1e-13, "gtol": 1e-8, "maxiter": 500})
            return [float(math.sqrt(v)) if v > _VAR_MIN else 0.0 for v in best.x], best.x

        # a texture's coefficients are the projections' alone (the calibration only bounds them)
        (t0, s1), v = search(centre is not None and not texture, held)
        # a covariance that is not positive definite anywhere the search went (a noise
        # variance near zero, rows far more than pixels) gives it no gradient: it stops
        # where it started, which is no fit; the calibration (or no model error) instead
        nll = self._nll_at_variances(v)  # inf where not positive definite
        fit_ok = math.isfinite(nll)
        if not fit_ok:
            log.warning("held-out likelihood not positive definite (noise variance %.3g): "
                        "the model error is %s, not fitted", self.noise_var * self.noise_scale,
                        "the calibration's" if prior is not None else "zero")
            t0, s1 = (prior.t0, prior.s1) if prior is not None else (0.0, 0.0)
            v = [max(c * c, _VAR_MIN) for c in (t0, s1)]
        rejection, rejected = None, False
        if floor and centre is not None and fit_ok:  # the calibration as a lower bound ...
            floored = [c if h else max(c, p)
                       for c, p, h in zip((t0, s1), (prior.t0, prior.s1), held)]
            v_floored = [max(c * c, _VAR_MIN) for c in floored]
            # ... unless the held-out projections reject it (nats, summed over them)
            rejection = m * (self._nll_at_variances(v_floored) - nll)
            rejected = rejection > floor_reject
            if not rejected:
                (t0, s1), v = floored, v_floored
        info = {"heldout_angles": int(self.heldout_angles), "measurements": int(m),
                "fit_ok": bool(fit_ok),
                "correlation_length": float(self.correlation_length),
                "nll_per_measurement": _finite(self._nll_at_variances(v)),
                "nll_without_model_error": _finite(self._nll_at_variances([_VAR_MIN,
                                                                           _VAR_MIN]))}
        if centre is not None:
            t0_ml, s1_ml = search(False)[0] if mle is None else (mle.t0, mle.s1)
            info.update(prior={"t0": prior.t0, "s1": prior.s1, "width": float(prior_width),
                               "floor": bool(floor),
                               "floor_rejection_nats": None if rejection is None
                               else _finite(rejection),
                               "floor_rejected": bool(rejected),
                               "texture": bool(texture)},
                        mle={"t0": t0_ml, "s1": s1_ml})
        return ModelErrorCoefficients(t0, s1, HELDOUT, info=info)

    def with_correlation_length(self, op, length: float, *, max_rows: int = 2048,
                                seed: int = 0) -> "HeldoutLikelihood":
        """The same residuals read with pixel errors correlated over ``length`` px.

        ``M_const`` and ``M_edge`` are rebuilt from the kept ``image`` and
        ``out_mask`` (:func:`correlated_rows`); the posterior's ``M_post`` and
        the noise stay. ``op``, ``max_rows`` and ``seed`` must be those the
        likelihood was made with (:func:`heldout_likelihood`), so that the
        same measurements are selected.

        Raises
        ------
        InputError
            If the likelihood has no ``image`` or ``out_mask`` (stored before
            they were kept), or ``op`` selects other measurements.
        """

        if self.image is None or self.out_mask is None:
            raise InputError("this held-out likelihood was stored without its image and "
                             "left-out angles: it cannot be rebuilt", field="heldout_image")
        rows, B = _heldout_rows(op, self.out_mask, max_rows, seed)
        if len(rows) != len(self.r):
            raise InputError(f"the operator selects {len(rows)} held-out measurements, the "
                             f"likelihood has {len(self.r)}", field="heldout_r")
        # the mean posterior variance M_const was made with, in the likelihood's units
        made = correlated_rows(B, self.image.shape, self.correlation_length)
        mean_vp = float(np.trace(self.M_const) / made.multiply(made).sum())
        M_const, M_edge = _model_error_grams(B, self.image, mean_vp, length)
        return dataclasses.replace(self, M_const=M_const, M_edge=M_edge,
                                   correlation_length=float(length))

    def arrays(self) -> dict:
        """The fields as numpy arrays (for ``np.savez``); :meth:`from_arrays` reads them."""
        out = {"r": self.r, "M_post": self.M_post, "M_const": self.M_const,
               "M_edge": self.M_edge, "noise_var": np.float64(self.noise_var),
               "heldout_angles": np.int64(self.heldout_angles),
               "correlation_length": np.float64(self.correlation_length),
               "noise_scale": np.float64(self.noise_scale)}
        for key in ("ray_variance", "image", "out_mask"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_arrays(cls, arrays) -> "HeldoutLikelihood":
        def optional(key, dtype):  # absent from files made before the field existed
            return np.asarray(arrays[key], dtype) if key in arrays else None

        return cls(*(np.asarray(arrays[k], np.float64) for k in ("r", "M_post", "M_const",
                                                                  "M_edge")),
                   float(arrays["noise_var"]), int(arrays["heldout_angles"]),
                   optional("ray_variance", np.float64), optional("image", np.float32),
                   optional("out_mask", bool),
                   float(arrays["correlation_length"]) if "correlation_length" in arrays else 0.0,
                   float(arrays["noise_scale"]) if "noise_scale" in arrays else 1.0)


def heldout_likelihood(op, y, out_mask, x_hat_in, posterior_variance, noise_var: float, *,
                       max_rows: int = 2048, seed: int = 0, ray_variance=None,
                       correlation_length: float = 0.0,
                       noise_scale: float = 1.0) -> HeldoutLikelihood:
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
    ray_variance : Tensor or ndarray, optional
        ``v``, shape (n_angles, n_detector): the measurements' noise is
        ``σ² v`` (count noise model). Default None (``σ²`` for every ray).
    correlation_length : float, optional
        The model error's pixels are correlated over this many pixels
        (:func:`correlated_rows`): its Gram matrices are ``(B G) diag(w) (B
        G)ᵀ``, while ``w`` stays the per-pixel variance. Errors correlated
        along a ray add up more than independent ones; read as independent,
        their held-out residuals would over-state the per-pixel variance.
        Default 0 (independent pixels; on the realistic validation scans a
        larger length mainly shrank the coefficients toward the prior,
        docs/real_scans.md).
    noise_scale : float, optional
        ``k``: the residuals are read with the noise variance ``k·noise_var``
        (:attr:`HeldoutLikelihood.noise_scale`). Default 1.

    Returns
    -------
    HeldoutLikelihood
    """
    y = torch.as_tensor(y).reshape(op.range_shape)
    out_mask = np.asarray(out_mask, dtype=bool)
    rows, B = _heldout_rows(op, out_mask, max_rows, seed)
    with torch.no_grad():
        pred = op.A(torch.as_tensor(x_hat_in, dtype=torch.float32).to(op.device)).reshape(-1)
    r_all = (y.reshape(-1).to(pred) - pred).double().cpu().numpy()
    vp = _img(posterior_variance).reshape(-1).numpy()
    v_out = None if ray_variance is None else torch.as_tensor(
        ray_variance).detach().double().cpu().numpy().reshape(-1)[rows]
    image = _img(x_hat_in).numpy().astype(np.float32)
    return HeldoutLikelihood(r_all[rows], _gram(B, vp),
                             *_model_error_grams(B, x_hat_in, vp.mean(), correlation_length),
                             float(noise_var), int(out_mask.sum()), v_out, image, out_mask,
                             float(correlation_length), float(noise_scale))


def _heldout_rows(op, out_mask, max_rows: int, seed: int):
    """The held-out measurements a likelihood uses (flat indices) and their rows of ``A``.

    Rays that miss the image carry no error and are dropped; beyond
    ``max_rows`` an even subsample (seeded).
    """
    n_det = op.range_shape[1]
    rows = (np.flatnonzero(out_mask)[:, None] * n_det + np.arange(n_det)[None]).reshape(-1)
    B = _projection_rows(op, rows)
    keep = np.flatnonzero(B.getnnz(axis=1) > 0)
    if len(keep) > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(keep, max_rows, replace=False))
    if len(keep) < 8:
        raise InputError("too few held-out measurements see the image", field="heldout_every")
    return rows[keep], B[keep]


def _gram(B, w) -> np.ndarray:
    """``B diag(w) Bᵀ``, dense float64."""
    return np.asarray((B.multiply(w[None]) @ B.T).toarray(), dtype=np.float64)


def _model_error_grams(B, image, mean_vp: float, length: float):
    """``(M_const, M_edge)`` of the held-out rows ``B`` (pixel errors correlated over
    ``length`` px, :func:`correlated_rows`): the weights ``mean_vp`` and ``e(image)²``."""
    Bc = correlated_rows(B, _img(image).shape, length)
    return _gram(Bc, np.full(B.shape[1], mean_vp)), _gram(Bc, _edge_feature(image))


def _edge_feature(image) -> np.ndarray:
    """``e(x̂_in)²``, flat."""
    return edge_strength(image).square().reshape(-1).numpy()


def fit_heldout(op, y, out_mask, x_hat_in, posterior_variance, noise_var: float, *,
                max_rows: int = 2048, seed: int = 0, prior: ModelErrorCoefficients | None = None,
                prior_width: float = 1.0, ray_variance=None, correlation_length: float = 0.0,
                keep: list | None = None, floor: bool = False, floor_reject: float = math.inf,
                noise_scale: float = 1.0, texture: bool = False
                ) -> ModelErrorCoefficients:
    """Coefficients from the likelihood of held-out projections (the held-out term).

    :func:`heldout_likelihood` followed by :meth:`HeldoutLikelihood.fit`:
    the maximum-likelihood ``(t0, s1)``, or with ``prior`` (a calibration
    of the preset, :func:`coefficients_for`) the maximum a posteriori under
    a log-normal prior of width ``prior_width`` around it. The prior matters
    where the held-out projections cannot see the model error (few angles,
    high noise: the likelihood is flat down to ``t0 = s1 = 0``) and fades
    where they can.

    Parameters
    ----------
    op, y, out_mask, x_hat_in, posterior_variance, noise_var, max_rows, seed, ray_variance
    correlation_length
        As :func:`heldout_likelihood`.
    prior : ModelErrorCoefficients, optional
        Centre of the prior. Default None: maximum likelihood.
    prior_width : float, optional
        Natural-log standard deviation of the prior. Default 1.0.
    floor : bool, optional
        With ``prior``, the calibration is also a lower bound
        (:meth:`HeldoutLikelihood.fit`). Default False.
    floor_reject : float, optional
        Nats by which the held-out projections must reject the floor for it to be
        dropped (:meth:`HeldoutLikelihood.fit`). Default ``inf`` (never).
    texture : bool, optional
        The image is a texture: fitted without the prior's pull, the calibration
        a lower bound only (:meth:`HeldoutLikelihood.fit`). Default False.
    noise_scale
        As :func:`heldout_likelihood`.
    keep : list, optional
        The :class:`HeldoutLikelihood` is appended to it, so that the very
        likelihood a run judged its image with can be refitted later (tuning
        the prior). Default None.

    Returns
    -------
    ModelErrorCoefficients
        With the held-out term's name as ``method`` and the fit's details in ``info``.
    """
    lik = heldout_likelihood(op, y, out_mask, x_hat_in, posterior_variance, noise_var,
                             max_rows=max_rows, seed=seed, ray_variance=ray_variance,
                             correlation_length=correlation_length, noise_scale=noise_scale)
    if keep is not None:
        keep.append(lik)
    return lik.fit(prior, prior_width, floor=floor, floor_reject=floor_reject,
                   texture=texture)

