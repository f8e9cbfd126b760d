"""Gaussian priors on the linearised weights (docs/method.md §4).

``θ ~ N(0, Σ)`` with ``Σ`` block-diagonal over the network's prior blocks:

- :class:`BlockPrior` ``kind='matern'`` (reference): ``Σ_b = a_b C_b`` with
  ``C_b = I_{n_b} ⊗ M_b``, where ``M_b[i, j] = exp(−‖p_i − p_j‖ / ℓ_b)`` is a
  Matérn-½ (exponential) covariance between the ``kh·kw`` positions ``p_i``
  of a conv kernel on the integer grid, shared by all ``n_b`` filters
  (``c_out · c_in`` kernels) of the block; 1×1 convs (and biases) get the
  identity. ``kind='iso'``: ``C_b = I`` (per-block ARD).
- :class:`GPrior`: ``Σ = g · diag(s)²`` with ``s_i = (diag(ΦᵀΦ)_i / n)^{-1/2}``
  for the likelihood's factor ``Φ`` and its number of observations ``n``
  (CT: ``Φ = A J``, ``n = d_y``, so ``s_i = (mean_rows (A J)²_{:, i})^{-1/2}``;
  classifiers: ``Φ = B J``, ``n = N``), equivalently the columns of ``Φ``
  rescaled by ``s`` and an isotropic prior of variance ``g``; one hyperparameter.

Both keep their hyperparameters as ``torch.nn.Parameter`` in log space
(``log_a`` of shape ``[B]``, ``log_l`` of shape ``[B]``; ``log_g`` of shape
``[1]``) and are differentiable in them (the evidence fit of docs/method.md §6 optimises them).
Every operator acts on a batch of flat parameter vectors ``v`` of shape
``[..., d_θ]`` and returns the same shape:

- ``cov(v)`` = ``Σ v``, ``precision(v)`` = ``Σ⁻¹ v``,
- ``cov_sqrt(v)`` = ``L v`` and ``cov_sqrt(v, transpose=True)`` = ``Lᵀ v``
  with ``Σ = L Lᵀ`` (``L`` block-diagonal: ``√a_b (I ⊗ chol M_b)``),
- ``sample(k, generator)`` = ``θ⁰ ~ N(0, Σ)``, ``[k, d_θ]``,
- ``logdet()`` = ``log|Σ|``, ``quadratic(v)`` = ``‖v‖²_{Σ⁻¹}``,
- ``block_quadratic(v, b)`` = ``‖v_b‖²_{C_b⁻¹}`` (without ``a_b``; the
  MacKay / EM updates need ``‖θ*_b‖²_{C_b⁻¹}`` and ``‖z_b‖²_{C_b⁻¹}``) and
  ``block_quadratics(v)`` for all blocks at once, ``[..., B]``.

A jitter of ``1e-6`` is added to the diagonal of every Matérn ``M_b`` so
that its Cholesky factor exists for any ``ℓ_b`` (``M_b → 11ᵀ`` as ``ℓ_b → ∞``).

Examples
--------
>>> import torch
>>> from ctuq.models.unet import build_unet
>>> from ctuq.posterior.linearize import Linearization
>>> lin = Linearization(build_unet("reference-28", channels=(4, 4, 4)), torch.rand(1, 1, 28, 28))
>>> prior = BlockPrior(lin)
>>> theta0 = prior.sample(5, torch.Generator().manual_seed(0))
>>> tuple(theta0.shape), tuple(prior.block_quadratics(theta0).shape)
((5, 1512), (5, 8))
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import Mapping

import torch
from torch import Tensor, nn

from ctuq.errors import InputError
from ctuq.posterior.linearize import Linearization, ParamBlock

__all__ = ["GaussianPrior", "BlockPrior", "GPrior", "matern_half_kernel", "kernel_positions",
           "build_prior", "PRIOR_KINDS", "PRIORS", "PriorKind", "prior_kind"]

log = logging.getLogger(__name__)

MATERN_JITTER = 1e-6


def kernel_positions(kh: int, kw: int, dtype=torch.float64, device="cpu") -> Tensor:
    """Integer-grid positions of the ``kh·kw`` taps of a conv kernel, C order, ``[kh·kw, 2]``."""
    r, c = torch.meshgrid(torch.arange(kh, dtype=dtype, device=device),
                          torch.arange(kw, dtype=dtype, device=device), indexing="ij")
    return torch.stack([r.reshape(-1), c.reshape(-1)], dim=1)


def matern_half_kernel(lengthscale: Tensor, kh: int = 3, kw: int = 3,
                       jitter: float = MATERN_JITTER) -> Tensor:
    """Matérn-½ covariance ``exp(−dist/ℓ) + jitter·I`` between kernel taps, ``[kh·kw, kh·kw]``.

    Differentiable in ``lengthscale`` (a 0-d tensor); dtype and device follow it.
    """
    pos = kernel_positions(kh, kw, lengthscale.dtype, lengthscale.device)
    dist = torch.cdist(pos, pos)
    eye = torch.eye(kh * kw, dtype=lengthscale.dtype, device=lengthscale.device)
    return torch.exp(-dist / lengthscale) + jitter * eye


class _Piece:
    """Consecutive coordinates of one block sharing one per-filter covariance ``M`` (p×p)."""

    __slots__ = ("start", "stop", "p", "kernel")

    def __init__(self, start: int, stop: int, p: int, kernel: tuple[int, int] | None):
        self.start, self.stop, self.p, self.kernel = start, stop, p, kernel

    @property
    def n(self) -> int:
        return (self.stop - self.start) // self.p


def _block_pieces(block: ParamBlock, structured: bool) -> list[_Piece]:
    pieces: list[_Piece] = []
    for seg in block.segments:
        ks = seg.kernel_size if structured else None
        p = ks[0] * ks[1] if ks is not None else 1
        kernel = ks if p > 1 else None
        start, stop = seg.slice.start, seg.slice.stop
        last = pieces[-1] if pieces else None
        if last is not None and last.p == p and last.kernel == kernel and last.stop == start:
            pieces[-1].stop = stop
        else:
            pieces.append(_Piece(start, stop, p, kernel))
    return pieces


class GaussianPrior(nn.Module):
    """Interface of a zero-mean block-diagonal Gaussian prior on the flat parameters.

    Subclasses implement :meth:`_factors`; everything else is shared.

    Attributes
    ----------
    block_names : list of str
        The hyperparameter blocks, in order.
    block_slices : OrderedDict[str, slice]
        Block → slice of the flat vector.
    num_params : int
        ``d_θ``.
    """

    block_names: list[str]
    block_slices: "OrderedDict[str, slice]"
    num_params: int

    # -- to be provided by subclasses ------------------------------------------------
    def _factors(self, dtype, device) -> list[dict]:  # pragma: no cover - abstract
        """Per block: ``{'a': 0-d variance, 'pieces': [(piece, M, L, M_inv, logdet_M)]}``."""
        raise NotImplementedError

    # -- bookkeeping ---------------------------------------------------------------
    @property
    def block_dims(self) -> Tensor:
        """``d_b`` per block, float64 ``[B]``."""
        return torch.tensor([sl.stop - sl.start for sl in self.block_slices.values()],
                            dtype=torch.float64)

    @property
    def num_blocks(self) -> int:
        return len(self.block_names)

    @property
    def lengthscale_blocks(self) -> list[bool]:
        """Per block: whether its covariance has a lengthscale ``ℓ_b`` (in ``log_l``)
        that matters. Default: none."""
        return [False] * self.num_blocks

    @property
    def learns_lengthscale(self) -> bool:
        """Some block has a lengthscale to learn (:attr:`lengthscale_blocks`)."""
        return any(self.lengthscale_blocks)

    def _index(self, b) -> int:
        if isinstance(b, str):
            try:
                return self.block_names.index(b)
            except ValueError:
                raise InputError(f"unknown prior block {b!r}; blocks are {self.block_names}",
                                 field="block") from None
        return int(b)

    #: Parameters that are log-scales of a block's covariance (``Σ_b = a_b C_b``).
    _log_scale_names: tuple[str, ...] = ("log_a", "log_g")

    def log_scale_change(self, old: Tensor, rtol: float = 1e-9) -> float | None:
        """``c`` with ``Σ = e^c · Σ_old`` when only a common scale moved, else None.

        Parameters
        ----------
        old : Tensor
            The log-hyperparameters then, flat in ``parameters()`` order
            (``preconditioner.hyper_vector``'s layout).
        rtol : float
            Tolerance on the shifts' spread and on every other parameter's move.

        Returns
        -------
        float or None
            The common shift of every log-scale parameter, when all of them
            moved by the same amount and nothing else moved.
        """
        shifts, offset = [], 0
        for name, p in self.named_parameters():
            now = p.detach().reshape(-1).double().cpu()
            d = now - old[offset:offset + now.numel()].double().cpu()
            offset += now.numel()
            if name in self._log_scale_names:
                shifts.append(d)
            elif d.numel() and float(d.abs().max()) > rtol:
                return None
        if not shifts or offset != old.numel():
            return None
        shifts = torch.cat(shifts)
        if float(shifts.max() - shifts.min()) > rtol:
            return None
        return float(shifts.mean())

    def _cache_key(self, dtype, device):
        ps = tuple((p._version, p.data_ptr()) for p in self.parameters())
        bs = tuple((b._version, b.data_ptr()) for b in self.buffers())
        return (dtype, str(device), ps, bs)

    def _get_factors(self, dtype, device) -> list[dict]:
        needs_graph = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        if needs_graph:
            return self._factors(dtype, device)
        key = self._cache_key(dtype, device)
        cache = self.__dict__.setdefault("_factor_cache", {})
        if key not in cache:
            cache.clear()
            with torch.no_grad():
                facs = self._factors(dtype, device)
            if facs:
                facs[0]["_ops"] = {}  # per-operator matrices with the scales folded in
            cache[key] = facs
        return cache[key]

    def clear_cache(self) -> None:
        """Drop cached factors (only needed after editing ``.data`` of a hyperparameter)."""
        self.__dict__.pop("_factor_cache", None)

    # -- the operators ---------------------------------------------------------------
    def _apply(self, fn, recurse=True):  # nn.Module device/dtype moves drop the cache
        self.clear_cache()
        return super()._apply(fn, recurse)

    @staticmethod
    def _build_ops(facs: list[dict], which: str) -> list[tuple]:
        """Per piece ``(start, stop, p, matrix or None, scale)`` with the block scale folded in.

        ``scale`` is a 0-d tensor or (GPrior) a per-coordinate vector.
        """
        ops = []
        for fac in facs:
            a = fac["a"]
            scale = {"cov": a, "sqrt": a.sqrt(), "sqrt_t": a.sqrt(), "prec": 1.0 / a}[which]
            diag = fac.get("diag")
            for piece, M, L, Minv, _ in fac["pieces"]:
                if piece.p > 1:
                    mat = {"cov": M, "sqrt": L.mT, "sqrt_t": L, "prec": Minv}[which]
                    ops.append((piece.start, piece.stop, piece.p, mat * scale, None))
                elif diag is not None:  # GPrior: per-coordinate s_i (or s_i²)
                    d = diag[piece.start:piece.stop]
                    vec = {"cov": d * d, "sqrt": d, "sqrt_t": d, "prec": 1.0 / (d * d)}[which]
                    ops.append((piece.start, piece.stop, 1, None, vec * scale))
                else:
                    ops.append((piece.start, piece.stop, 1, None, scale))
        return ops

    def _get_ops(self, which: str, dtype, device) -> list[tuple]:
        facs = self._get_factors(dtype, device)
        store = facs[0].get("_ops") if facs else None  # present only on cached factors
        if store is None:
            return self._build_ops(facs, which)
        if which not in store:
            store[which] = self._build_ops(facs, which)
        return store[which]

    def _map(self, v: Tensor, which: str) -> Tensor:
        if v.shape[-1] != self.num_params:
            raise InputError(f"expected vectors of length {self.num_params}, got "
                             f"{tuple(v.shape)}", field="v")
        lead = v.shape[:-1]
        outs = []
        for start, stop, p, mat, scale in self._get_ops(which, v.dtype, v.device):
            seg = v[..., start:stop]
            if mat is not None:
                outs.append((seg.reshape(*lead, (stop - start) // p, p) @ mat).reshape(seg.shape))
            else:
                outs.append(seg * scale)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def cov(self, v: Tensor) -> Tensor:
        """``Σ v`` for ``v`` of shape ``[..., d_θ]``."""
        return self._map(v, "cov")

    def cov_sqrt(self, v: Tensor, transpose: bool = False) -> Tensor:
        """``L v`` (or ``Lᵀ v``) with ``Σ = L Lᵀ``, ``L`` the block Cholesky factor."""
        return self._map(v, "sqrt_t" if transpose else "sqrt")

    def precision(self, v: Tensor) -> Tensor:
        """``Σ⁻¹ v`` for ``v`` of shape ``[..., d_θ]``."""
        return self._map(v, "prec")

    def sample(self, k: int, generator: torch.Generator | None = None, *,
               device=None, dtype=torch.float32) -> Tensor:
        """``k`` draws ``θ⁰ ~ N(0, Σ)``, ``[k, d_θ]``.

        The standard normals are drawn on the CPU from ``generator`` (so a
        seed gives the same draws on every device) and moved to ``device``
        (default: the hyperparameters' device).
        """
        device = self._device() if device is None else device
        u = torch.randn(int(k), self.num_params, generator=generator, dtype=dtype)
        return self.cov_sqrt(u.to(device))

    def _device(self):
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    def logdet(self, dtype=torch.float64) -> Tensor:
        """``log|Σ|`` (0-d, differentiable)."""
        facs = self._get_factors(dtype, self._device())
        total = torch.zeros((), dtype=dtype, device=self._device())
        for fac in facs:
            for piece, _, _, _, logdet_m in fac["pieces"]:
                total = total + (piece.stop - piece.start) * torch.log(fac["a"]) \
                    + piece.n * logdet_m
            if fac.get("diag") is not None:
                total = total + 2 * torch.log(fac["diag"]).sum()
        return total

    def quadratic(self, v: Tensor) -> Tensor:
        """``vᵀ Σ⁻¹ v`` per vector, ``[...]``."""
        return (v * self.precision(v)).sum(-1)

    def block_quadratics(self, v: Tensor) -> Tensor:
        """``‖v_b‖²_{C_b⁻¹}`` for every block (no ``a_b``), ``[..., B]``."""
        w = self.precision(v)
        a = self.variances.to(v.dtype).to(v.device)
        cols = [(v[..., sl] * w[..., sl]).sum(-1) for sl in self.block_slices.values()]
        return torch.stack(cols, dim=-1) * a

    def block_quadratic(self, v: Tensor, b) -> Tensor:
        """``‖v_b‖²_{C_b⁻¹}`` for block ``b`` (name or index), ``[...]``."""
        return self.block_quadratics(v)[..., self._index(b)]

    def to_dense(self, dtype=torch.float64) -> Tensor:
        """The dense ``Σ``, ``[d_θ, d_θ]`` (tiny problems only)."""
        eye = torch.eye(self.num_params, dtype=dtype, device=self._device())
        return self.cov(eye)

    @property
    def variances(self) -> Tensor:  # pragma: no cover - abstract
        """The block variances ``a_b`` (``[B]``)."""
        raise NotImplementedError


class BlockPrior(GaussianPrior):
    """Per-block ARD prior, isotropic or with a Matérn-½ filter covariance.

    Parameters
    ----------
    blocks : Linearization or mapping of str to ParamBlock
        The block layout (``lin.blocks``).
    kind : {'matern', 'iso'}, optional
        ``'matern'`` (reference): Matérn-½ covariance between the taps of
        each k×k kernel (k > 1); ``'iso'``: ``C_b = I``. Default ``'matern'``.
    variance : float or sequence of float, optional
        Initial ``a_b`` (one value, or one per block). Default 1 (reference).
    lengthscale : float or sequence of float, optional
        Initial ``ℓ_b`` in kernel-grid units. Default 0.1 (reference; nearly
        diagonal ``C_b``: off-diagonal ``exp(−10) ≈ 4.5e-5``).
    device : str or torch.device, optional
        Where the hyperparameters live. Default: the linearisation's device, else CPU.

    Attributes
    ----------
    log_a : nn.Parameter, shape (B,)
        ``log a_b``, float64.
    log_l : nn.Parameter, shape (B,)
        ``log ℓ_b``, float64 (unused for blocks without k×k kernels and for ``kind='iso'``).
    """

    def __init__(self, blocks, kind: str = "matern", variance=1.0, lengthscale=0.1, *,
                 device=None):
        super().__init__()
        if isinstance(blocks, Linearization):
            device = blocks.device if device is None else device
            blocks = blocks.blocks
        if kind not in ("matern", "iso"):
            raise InputError(f"must be 'matern' or 'iso', got {kind!r}", field="kind")
        device = torch.device("cpu") if device is None else torch.device(device)
        self.kind = kind
        self.blocks: OrderedDict[str, ParamBlock] = OrderedDict(blocks)
        self.block_names = list(self.blocks)
        self.block_slices = OrderedDict((b, blk.slice) for b, blk in self.blocks.items())
        self.num_params = max(sl.stop for sl in self.block_slices.values())
        self._pieces = [_block_pieces(blk, kind == "matern") for blk in self.blocks.values()]
        nb = len(self.block_names)
        self.log_a = nn.Parameter(self._init(variance, nb, "variance", device).log())
        self.log_l = nn.Parameter(self._init(lengthscale, nb, "lengthscale", device).log())

    @staticmethod
    def _init(value, nb: int, field: str, device) -> Tensor:
        t = torch.as_tensor(value, dtype=torch.float64).reshape(-1)
        if t.numel() == 1:
            t = t.expand(nb).clone()
        if t.numel() != nb or not bool(torch.all(t > 0)) or not bool(torch.isfinite(t).all()):
            raise InputError(f"needs one positive value or {nb} (one per block), got {value!r}",
                             field=field)
        return t.to(device)

    @property
    def name(self) -> str:
        """``'matern'`` or ``'ard'`` (the isotropic kind), as in :data:`PRIOR_KINDS`."""
        return "matern" if self.kind == "matern" else "ard"

    @property
    def variances(self) -> Tensor:
        """``a_b`` per block, ``[B]`` (differentiable)."""
        return self.log_a.exp()

    @property
    def lengthscales(self) -> Tensor:
        """``ℓ_b`` per block, ``[B]`` (differentiable)."""
        return self.log_l.exp()

    @property
    def matern_blocks(self) -> list[bool]:
        """Per block: whether its ``C_b`` depends on ``ℓ_b``."""
        return [any(p.p > 1 for p in pieces) for pieces in self._pieces]

    @property
    def lengthscale_blocks(self) -> list[bool]:
        """The Matérn blocks (``kind='matern'``); none for ``'iso'``."""
        return self.matern_blocks if self.kind == "matern" else [False] * self.num_blocks

    @torch.no_grad()
    def set_hyperparameters(self, variances=None, lengthscales=None) -> None:
        """Overwrite ``a_b`` and/or ``ℓ_b`` (e.g. after a closed-form M-step).

        Parameters
        ----------
        variances, lengthscales : Tensor, sequence, mapping block → value, or None
        """
        for value, param, field in ((variances, self.log_a, "variances"),
                                    (lengthscales, self.log_l, "lengthscales")):
            if value is None:
                continue
            if isinstance(value, Mapping):
                cur = param.exp().clone()
                for b, val in value.items():
                    cur[self._index(b)] = float(val)
                value = cur
            param.copy_(self._init(value, len(self.block_names), field, param.device).log())

    def _factors(self, dtype, device) -> list[dict]:
        a_all = self.log_a.exp().to(dtype=dtype, device=device)
        l_all = self.log_l.exp().to(dtype=dtype, device=device)
        out, mats = [], {}
        for i, pieces in enumerate(self._pieces):
            plist = []
            for piece in pieces:
                if piece.p > 1:
                    key = (i, piece.kernel)
                    if key not in mats:
                        M = matern_half_kernel(l_all[i], *piece.kernel)
                        L = torch.linalg.cholesky(M)
                        Minv = torch.cholesky_inverse(L)
                        logdet_m = 2 * torch.log(torch.diagonal(L)).sum()
                        mats[key] = (M, L, Minv, logdet_m)
                    plist.append((piece, *mats[key]))
                else:
                    plist.append((piece, None, None, None, torch.zeros((), dtype=dtype,
                                                                      device=device)))
            out.append({"a": a_all[i], "pieces": plist})
        return out

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, blocks={self.block_names}, d={self.num_params}"


class GPrior(GaussianPrior):
    """The g-prior: ``Σ = g · diag(s)²``, ``s_i = (diag(ΦᵀΦ)_i / n)^{-1/2}`` (module docstring).

    One block ``'all'`` covering every parameter, with ``C = diag(s)²`` and
    ``a = g``; the interface is that of :class:`BlockPrior`.

    Parameters
    ----------
    scale : Tensor, shape (d_θ,)
        ``s`` (build it with :meth:`from_likelihood`).
    g : float, optional
        Initial ``g``. Default 1.

    Attributes
    ----------
    log_g : nn.Parameter, shape (1,)
    scale : buffer, shape (d_θ,)
    """

    def __init__(self, scale: Tensor, g: float = 1.0):
        super().__init__()
        scale = torch.as_tensor(scale, dtype=torch.float64).reshape(-1)
        if not bool(torch.all(scale > 0)) or not bool(torch.isfinite(scale).all()):
            raise InputError("scales must be positive and finite", field="scale")
        if not g > 0:
            raise InputError(f"must be > 0, got {g!r}", field="g")
        self.register_buffer("scale", scale)
        self.log_g = nn.Parameter(torch.tensor([math.log(g)], dtype=torch.float64,
                                               device=scale.device))
        self.num_params = int(scale.numel())
        self.block_names = ["all"]
        self.block_slices = OrderedDict(all=slice(0, self.num_params))
        self._piece = _Piece(0, self.num_params, 1, None)

    @classmethod
    def from_likelihood(cls, likelihood, g: float = 1.0, *, n_probes: int = 256,
                        generator: torch.Generator | None = None, exact: bool = False,
                        floor: float = 1e-6) -> "GPrior":
        """Estimate ``s`` from the likelihood's ``diag(ΦᵀΦ)`` (probes, or exact).

        Parameters
        ----------
        likelihood : Likelihood
            Gives ``Φ`` (:meth:`~ctuq.posterior.likelihood.Likelihood.diag_normal`)
            and the normaliser ``n = likelihood.num_observations``.
        g : float, optional
            Initial ``g``. Default 1.
        n_probes : int, optional
            Rademacher probes. Default 256.
        generator : torch.Generator, optional
            For the probes (CPU). Default: seeded with 0.
        exact : bool, optional
            Compute ``diag(ΦᵀΦ)`` from dense Jacobians. Default False.
        floor : float, optional
            ``diag`` entries below ``floor · mean(diag)`` (dead weights) are
            raised to it so that ``s`` stays finite. Default 1e-6.
        """
        diag = likelihood.diag_normal(n_probes=n_probes, generator=generator, exact=exact)
        diag = diag.clamp_min(floor * float(diag.mean()) + 1e-300)
        return cls((diag / likelihood.num_observations).rsqrt().to(likelihood.device), g=g)

    name = "gprior"

    @property
    def variances(self) -> Tensor:
        """``[g]``."""
        return self.log_g.exp()

    @torch.no_grad()
    def set_hyperparameters(self, variances=None, lengthscales=None) -> None:
        """Overwrite ``g`` (``lengthscales`` is accepted and ignored)."""
        if variances is not None:
            if isinstance(variances, Mapping):
                variances = variances["all"]
            t = torch.as_tensor(variances, dtype=torch.float64).reshape(-1)
            self.log_g.copy_(t.log().to(self.log_g.device))

    def _factors(self, dtype, device) -> list[dict]:
        zero = torch.zeros((), dtype=dtype, device=device)
        return [{"a": self.log_g.exp().to(dtype=dtype, device=device)[0],
                 "diag": self.scale.to(dtype=dtype, device=device),
                 "pieces": [(self._piece, None, None, None, zero)]}]

    def extra_repr(self) -> str:
        return f"d={self.num_params}"
