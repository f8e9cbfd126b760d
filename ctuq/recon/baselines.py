"""Classical baselines: filtered back-projection and TV-regularised reconstruction.

The TV reconstruction solves

    min_x  ||A x - y||^2 + lam * TV(x)   subject to  x >= 0,

with the anisotropic TV ``TV(x) = sum |x[i+1,j] - x[i,j]| + |x[i,j+1] - x[i,j]|``
(the same data term and TV as the DIP loss, so ``lam`` and the DIP's ``gamma``
are on one scale). The solver is ODL's PDHG, run on our torch ray transform
wrapped as an ODL operator, so that it gets the speed of the matrix backend.

Default TV weight: ``lam = TV_WEIGHT_FACTOR * sigma * r``, with ``sigma`` the
noise std and ``r`` the root-mean-square column norm of ``A``: the size of
``A^T`` applied to unit white noise, per pixel. This balances the gradient of
the data term on pure noise against the TV sub-gradient and makes one
constant work across image sizes, angle counts and pixel sizes. The constant
was chosen by a grid search on tuning images (CHANGELOG.md, "TV baseline").
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch

from ctuq.data.operators import RayTransform
from ctuq.errors import InputError
from ctuq.progress import check_cancel, emit_progress

log = logging.getLogger(__name__)

TV_WEIGHT_FACTOR = 1.0

#: :func:`estimate_noise_std`: a pixel is in the object's shadow when its
#: 3-pixel mean exceeds this many noise stds; chosen on validation-split
#: phantoms (3 and 4 within 2 % of each other; 4 triggers less on noise).
NOISE_AIR_THRESHOLD = 4.0
#: Pixels beside the shadow not counted as air (the rim of a smooth edge).
NOISE_AIR_MARGIN = 3
#: Alternations of shadow detection and estimate (converged after 3 in tests).
NOISE_AIR_ITERATIONS = 5
#: Fewest air degrees of freedom for an air estimate.
NOISE_AIR_MIN_SAMPLES = 32


def fbp_reconstruction(y, op: RayTransform, filter_type: str = "Hann",
                       frequency_scaling: float = 1.0) -> torch.Tensor:
    """Filtered back-projection.

    Parameters
    ----------
    y : Tensor or array_like, shape (..., n_angles, n_detector)
    op : RayTransform
    filter_type : str, optional
        Default ``'Hann'``.
    frequency_scaling : float, optional
        Default 1.

    Returns
    -------
    Tensor, shape (..., n0, n1)
    """
    y = torch.as_tensor(y, dtype=torch.float32, device=op.device)
    return op.fbp(y, filter_type=filter_type, frequency_scaling=frequency_scaling)


def fbp_variance(y, op: RayTransform, noise_std: float, *, n_draws: int = 128,
                 seed: int = 0, fbp=None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """FBP with a per-pixel variance: propagated noise plus a residual-explained term.

    The variance is ``Var[FBP(ε)] + s²``: the first term propagates the
    measurement noise ``ε ~ N(0, σ² I)`` through the (linear) FBP, estimated
    from ``n_draws`` noise sinograms; the second is the variance of an iid
    image error that explains the excess data residual of the FBP, ``r = A
    x_fbp − y``: such an error adds ``s² ‖A_i‖²`` to measurement ``i``, so

        s² = max(0, mean(r²) − σ²) / mean_i ‖A_i‖²,   mean_i ‖A_i‖² = ‖A‖_F² / m.

    This is the FBP baseline of the calibration benchmark
    (docs/calibration.md); it needs no ground truth.

    Parameters
    ----------
    y : Tensor or array_like, shape (n_angles, n_detector)
    op : RayTransform
    noise_std : float
        The measurement noise std ``σ``.
    n_draws : int, optional
        Noise sinograms for the propagated term. Default 128.
    seed : int, optional
        Seed of the noise draws and of the ‖A‖_F probes. Default 0.
    fbp : Tensor, optional
        The reconstruction whose residual is used. Default: FBP of ``y``.

    Returns
    -------
    x : Tensor, shape (n0, n1)
        The reconstruction.
    variance : Tensor, shape (n0, n1), float64
    info : dict
        ``noise_variance_mean`` and ``residual_image_variance`` (``s²``).
    """
    y = torch.as_tensor(y, dtype=torch.float32, device=op.device)
    x = fbp_reconstruction(y, op) if fbp is None else torch.as_tensor(fbp).to(y)
    gen = torch.Generator().manual_seed(seed)
    eps = float(noise_std) * torch.randn(int(n_draws), *op.range_shape, generator=gen)
    var_noise = fbp_reconstruction(eps.to(op.device), op).double().var(0)
    with torch.no_grad():
        r = op.A(x) - y
    frob2 = x.numel() * rms_column_norm(op, seed, n_probes=8) ** 2  # ‖A‖_F²
    excess = max(0.0, float(r.double().square().mean()) - float(noise_std) ** 2)
    s2 = excess * r.numel() / frob2
    return x, var_noise + s2, {"noise_variance_mean": float(var_noise.mean()),
                               "residual_image_variance": s2}


def rms_column_norm(op: RayTransform, seed: int = 0, n_probes: int = 1) -> float:
    """Root-mean-square column norm of ``A``: ``sqrt(E‖Aᵀε‖² / n)``, ``ε ~ N(0, I)``.

    Exact in expectation; ``n_probes`` random probes (default 1, enough for
    the TV weight) average the estimate.
    """
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(int(n_probes), *op.range_shape, generator=gen).to(op.device)
    with torch.no_grad():
        back = op.A_adjoint(eps)  # [n_probes, H, W]
    return float(back.norm() / math.sqrt(back.numel()))


def default_tv_weight(op: RayTransform, noise_std: float) -> float:
    """The documented default ``lam = TV_WEIGHT_FACTOR * noise_std * rms_column_norm(A)``."""
    return TV_WEIGHT_FACTOR * float(noise_std) * rms_column_norm(op)


def _detail_mad_std(y: np.ndarray) -> float:
    """Donoho's MAD of the finest detector-direction details (stencil ``[1, -2, 1]``).

    Unbiased on pure noise; on a sinogram the object's own high frequencies
    add to it, so it is an upper bound (50 % to 10× too high at 0.5 % noise).
    """
    d2 = y[:, 2:] - 2 * y[:, 1:-1] + y[:, :-2]
    return float(1.4826 * np.median(np.abs(d2)) / math.sqrt(6.0)) if d2.size else 0.0


def _air_std(y: np.ndarray, sigma0: float, threshold: float = NOISE_AIR_THRESHOLD,
             margin: int = NOISE_AIR_MARGIN) -> tuple[float, int]:
    """Std of the detector pixels outside the object's shadow, and how many there are.

    Per row, the object's shadow runs from the first to the last pixel whose
    3-pixel mean exceeds ``threshold`` times its noise std ``sigma0/√3``;
    the pixels beyond it, less ``margin`` pixels, are air. Each run of air
    pixels (left and right of each row) loses its own mean (a flat-field
    offset per projection does not count as noise), one degree of freedom
    each. Returns ``(inf, n)`` when fewer than ``NOISE_AIR_MIN_SAMPLES``
    degrees of freedom remain.
    """
    n_rows, n_det = y.shape
    smooth = np.abs(y[:, :-2] + y[:, 1:-1] + y[:, 2:]) / 3
    above = smooth > threshold * sigma0 / math.sqrt(3.0)
    has = above.any(axis=1)
    first = np.where(has, above.argmax(axis=1) + 1, n_det // 2)
    last = np.where(has, n_det - 2 - above[:, ::-1].argmax(axis=1), n_det // 2)
    cols = np.arange(n_det)[None, :]
    left = cols < (first - margin)[:, None]
    right = cols > (last + margin)[:, None]
    ss, n, groups = 0.0, 0, 0
    for mask in (left, right):
        counts = mask.sum(axis=1)
        keep = counts >= 2
        if not keep.any():
            continue
        vals = np.where(mask, y, 0.0)[keep]
        counts = counts[keep]
        means = vals.sum(axis=1) / counts
        dev = np.where(mask[keep], y[keep] - means[:, None], 0.0)
        ss += float((dev**2).sum())
        n += int(counts.sum())
        groups += int(keep.sum())
    if n - groups < NOISE_AIR_MIN_SAMPLES:
        return math.inf, n
    return math.sqrt(ss / (n - groups)), n


#: Smallest noise std :func:`estimate_noise_std` returns, relative to the
#: sinogram's RMS (noise-free simulations).
NOISE_FLOOR = 1e-3


def estimate_noise_std(y) -> float:
    """Noise std of a parallel-beam sinogram, from the air beside the object.

    Estimator: the detector pixels outside the object's shadow (air) carry
    only noise. Starting from Donoho's wavelet-MAD estimate of the finest
    detector details (Donoho & Johnstone 1994, "Ideal spatial adaptation by
    wavelet shrinkage", Biometrika 81(3); an upper bound here, since the
    object's edges add to the details), each row's shadow is found by
    thresholding its 3-pixel running mean at ``NOISE_AIR_THRESHOLD`` noise
    stds; the pixels beyond it (less ``NOISE_AIR_MARGIN`` pixels, against
    the shadow's faint rim) give the std about the mean of each run, with
    one degree of freedom per run removed. The threshold uses the current
    estimate, so the two steps are iterated (``NOISE_AIR_ITERATIONS``
    times; the estimate only decreases). The result is the smaller of the
    two estimates: without enough air (an object wider than the field of
    view, fewer than ``NOISE_AIR_MIN_SAMPLES`` air pixels) it is the
    wavelet-MAD upper bound, and a warning is logged.

    Measured on off-grid simulations (phantoms of the validation split
    rendered at 4× and projected by ASTRA's ``strip`` projector, white
    Gaussian noise of std ``p · mean|A x|``): within ±10 % of the truth
    over 28²–256² images, 20–180 angles over 180° and p = 0.5–10 %, bias
    below 1 %; at 28² with 20 angles (about 300 air pixels) the sampling
    error is ±4.8 % and 4 % of draws fall outside ±10 % (up to 13 %). The
    wavelet-MAD estimate alone is 1.3–10× too high on the same data.

    Assumes white noise of one std and a detector that sees air on both
    sides of the object. On photon-count data the air rays are the least
    noisy ones, so the estimate is the noise of unattenuated rays, a lower
    bound for the rest: use the per-ray variances of :mod:`ctuq.data.counts`
    there.

    Noise-free data (an estimate of zero) get ``NOISE_FLOOR`` times the
    sinogram's RMS, with a warning.

    Parameters
    ----------
    y : Tensor or array_like, shape (..., n_angles, n_detector)
        The sinogram (line integrals); leading axes (slices) are pooled.

    Returns
    -------
    float
        The noise std, in the sinogram's unit, positive for a sinogram that
        is not all zero.
    """
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().double().numpy()
    y = np.asarray(y, dtype=np.float64)
    if y.ndim < 2:
        raise InputError(f"expected a sinogram (n_angles, n_detector), got shape {y.shape}",
                         field="sinogram")
    y = y.reshape(-1, y.shape[-1])
    if y.shape[1] < 3:
        raise InputError(f"need at least 3 detector pixels, got {y.shape[1]}", field="sinogram")
    sigma = _detail_mad_std(y)
    n_air = 0
    for _ in range(NOISE_AIR_ITERATIONS):
        air, n_air = _air_std(y, sigma)
        if not air < sigma:
            break
        sigma = air
    if not math.isfinite(air) and n_air < NOISE_AIR_MIN_SAMPLES:
        log.warning("noise std from the wavelet-MAD estimate only (%d air pixels beside the "
                    "object): an upper bound", n_air)
    floor = NOISE_FLOOR * float(np.sqrt(np.mean(y**2)))
    if not sigma > floor:
        # noise-free (simulated) data: a zero σ would make the likelihood singular
        log.warning("the sinogram looks noise-free (estimated noise std %.3g): using %.3g, "
                    "%g of its RMS; give noise_std if you know it", sigma, floor, NOISE_FLOOR)
        sigma = floor
    return float(sigma)


def _odl_wrap(op: RayTransform, scale: float = 1.0):
    """``scale * A`` as an ODL operator between unit-cell (unweighted) spaces."""
    import odl

    img, sino = op.domain_shape, op.range_shape
    dom = odl.uniform_discr([0, 0], img, img, dtype="float32")
    ran = odl.uniform_discr([0, 0], sino, sino, dtype="float32")

    class _Torch(odl.Operator):
        def __init__(self, adjoint=False):
            super().__init__(ran if adjoint else dom, dom if adjoint else ran, linear=True)
            self._is_adj = adjoint

        def _call(self, x):
            t = torch.as_tensor(np.asarray(x.asarray() if hasattr(x, "asarray") else x),
                                dtype=torch.float32, device=op.device)
            with torch.no_grad():
                out = op.A_adjoint(t) if self._is_adj else op.A(t)
            return (scale * out).cpu().numpy()

        @property
        def adjoint(self):
            return _Torch(not self._is_adj)

    return _Torch(), dom, ran


def _grad(x: torch.Tensor) -> torch.Tensor:
    """Forward differences with a zero last difference (Neumann), shape (2, n0, n1)."""
    g = torch.zeros((2, *x.shape), dtype=x.dtype, device=x.device)
    g[0, :-1] = x[1:] - x[:-1]
    g[1, :, :-1] = x[:, 1:] - x[:, :-1]
    return g


def _grad_adjoint(g: torch.Tensor) -> torch.Tensor:
    """Adjoint of :func:`_grad` (minus the divergence)."""
    out = torch.zeros(g.shape[1:], dtype=g.dtype, device=g.device)
    out[:-1] -= g[0, :-1]
    out[1:] += g[0, :-1]
    out[:, :-1] -= g[1, :, :-1]
    out[:, 1:] += g[1, :, :-1]
    return out


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation ``Σ|x[i+1,j]−x[i,j]| + Σ|x[i,j+1]−x[i,j]|``.

    The regulariser of the TV baseline, the DIP+TV loss and TV-PredCP.

    Parameters
    ----------
    x : Tensor, shape (..., H, W)

    Returns
    -------
    Tensor
        The sum over the last two axes, shape ``(...)``.
    """
    d0 = (x[..., 1:, :] - x[..., :-1, :]).abs().sum(dim=(-2, -1))
    d1 = (x[..., :, 1:] - x[..., :, :-1]).abs().sum(dim=(-2, -1))
    return d0 + d1


def tv_reconstruction(y, op: RayTransform, weight: float | None = None, *,
                      iterations: int = 1000, noise_std: float | None = None,
                      nonnegative: bool = True, solver: str = "torch",
                      progress=None, cancel=None) -> torch.Tensor:
    """TV-regularised reconstruction by PDHG (Chambolle–Pock).

    Minimises ``||A x - y||^2 + weight * TV(x)`` (``x >= 0``). The problem is
    solved in the equivalent form ``||B x - y/a||^2 + weight/a^2 TV(x)`` with
    ``B = A/a``, ``a = ||A||``, so one pair of step sizes suits both ``B``
    and the finite differences.

    Parameters
    ----------
    y : Tensor or array_like, shape (n_angles, n_detector)
        The sinogram.
    op : RayTransform
    weight : float, optional
        TV weight. Default: :func:`default_tv_weight` with ``noise_std``
        (estimated from ``y`` by :func:`estimate_noise_std` when not given).
    iterations : int, optional
        PDHG iterations. Default 1000.
    noise_std : float, optional
        The noise std, used only for the default weight.
    nonnegative : bool, optional
        Constrain ``x >= 0``. Default True.
    solver : {'torch', 'odl'}, optional
        ``'torch'`` (default): our PDHG in torch, on the operator's device.
        ``'odl'``: ODL's ``pdhg`` on the same problem (slower per iteration
        by ODL's overhead; kept as a cross-check, see the tests).
    progress : callable, optional
        Receives ``stage="tv"`` progress events every 50 iterations
        (see :mod:`ctuq.progress`).
    cancel : callable, optional
        Returns True to stop; raises :class:`ctuq.errors.Cancelled`.

    Returns
    -------
    Tensor, shape (n0, n1)
    """
    y = torch.as_tensor(y, dtype=torch.float32, device=op.device)
    if tuple(y.shape) != tuple(op.range_shape):
        raise InputError(f"expected shape {op.range_shape}, got {tuple(y.shape)}",
                         field="sinogram")
    if weight is None:
        weight = default_tv_weight(op, estimate_noise_std(y) if noise_std is None else noise_std)
    if not (math.isfinite(weight) and weight >= 0):
        raise InputError(f"must be >= 0, got {weight!r}", field="tv_weight")
    if solver not in ("torch", "odl"):
        raise InputError(f"must be 'torch' or 'odl', got {solver!r}", field="solver")
    t0 = time.perf_counter()
    a = op.opnorm(iterations=30)
    mu = weight / a**2
    # ||L||^2 <= ||B||^2 + ||grad||^2 <= 1 + 8 in 2-D; tau * sigma * ||L||^2 < 1
    tau = sigma = 1.0 / (1.02 * 3.0)

    def report(i):
        check_cancel(cancel, "TV reconstruction")
        if i % 50 == 0 or i == iterations:
            emit_progress(progress, "tv", i, iterations, "PDHG")

    if solver == "odl":
        x = _tv_odl(y / a, op, a, mu, iterations, tau, sigma, nonnegative, report)
    else:
        yb = y / a
        x = torch.zeros(op.domain_shape, device=op.device)
        x_bar = x.clone()
        p = torch.zeros_like(y)
        q = torch.zeros((2, *op.domain_shape), device=op.device)
        with torch.no_grad():
            for i in range(1, iterations + 1):
                # dual of ||u - yb||^2: prox is (v - sigma yb) / (1 + sigma/2)
                p = (p + sigma * (op.A(x_bar) / a) - sigma * yb) / (1 + sigma / 2)
                # dual of mu ||.||_1: projection onto the box [-mu, mu]
                q = (q + sigma * _grad(x_bar)).clamp_(-mu, mu)
                x_new = x - tau * (op.A_adjoint(p) / a + _grad_adjoint(q))
                if nonnegative:
                    x_new.clamp_(min=0)
                x_bar = 2 * x_new - x
                x = x_new
                report(i)
    log.info("TV (%s, lam=%.3g, %d iterations) in %.2f s", solver, weight, iterations,
             time.perf_counter() - t0)
    return x


def _tv_odl(yb, op, a, mu, iterations, tau, sigma, nonnegative, report):
    import odl

    B, dom, ran = _odl_wrap(op, 1.0 / a)
    grad = odl.Gradient(dom, pad_mode="order0")  # forward differences, unit spacing
    L = odl.BroadcastOperator(B, grad)
    F = odl.functionals
    g = F.SeparableSum(F.L2NormSquared(ran).translated(ran.element(yb.cpu().numpy())),
                       mu * F.L1Norm(grad.range))
    f = F.IndicatorNonnegativity(dom) if nonnegative else F.ZeroFunctional(dom)
    x = dom.zero()

    class _Callback(odl.solvers.Callback):
        i = 0

        def __call__(self, _):
            self.i += 1
            report(self.i)

    odl.solvers.pdhg(x, f, g, L, niter=iterations, tau=tau, sigma=sigma, callback=_Callback())
    return torch.as_tensor(np.asarray(x.asarray()), dtype=torch.float32, device=op.device)
