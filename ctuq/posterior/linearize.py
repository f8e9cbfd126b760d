"""The tangent linear model of a fitted network: Jacobian products (docs/method.md §2).

For a network ``f(θ)`` with a fixed input and a fit ``θ̃``, the linearisation
is ``h(θ) = f(θ̃) + J (θ − θ̃)`` with ``J = ∂f/∂θ`` at ``θ̃`` (shape
``d_x × d_θ``, ``d_x = H·W``). Only a chosen subset of the parameters enters
``θ`` (by default every convolution weight, the reference choice; biases and
normalisation parameters stay fixed at their fitted values). The chosen
parameters are flattened into one vector, ordered and grouped by the
network's prior blocks (:meth:`ctuq.models.unet.UNet.blocks`).

:class:`Linearization` provides, batched over many vectors at once:

- ``jvp(v)``: ``J v`` by forward-mode AD (``torch.func.jvp`` under ``vmap``),
- ``vjp(u)``: ``Jᵀ u`` by reverse-mode AD (``torch.func.vjp``; the forward
  pass is taken once at construction and reused by every call),
- ``dense()``: the dense ``J`` for small problems (float32 or float64).

The map from the network output to the data (a ray transform, a softmax)
stays outside the Jacobian: it belongs to the likelihood
(:mod:`ctuq.posterior.likelihood`). The output sigmoid of the U-net stays
inside ``f`` (reference choice).

Examples
--------
>>> import torch
>>> from ctuq.models.unet import build_unet
>>> net = build_unet("reference-28", channels=(4, 4, 4)).eval()
>>> lin = Linearization(net, torch.rand(1, 1, 28, 28))
>>> v = torch.randn(3, lin.num_params)
>>> tuple(lin.jvp(v).shape), tuple(lin.vjp(torch.randn(2, 28, 28)).shape)
((3, 28, 28), (2, 1512))
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import numbers
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vjp, vmap

from ctuq.errors import InputError

__all__ = ["ParamSegment", "ParamBlock", "Linearization", "select_parameters",
           "auto_chunk_size", "CPU_CHUNK_ELEMENTS", "full_float32", "in_full_float32"]

log = logging.getLogger(__name__)

#: Most activation elements (vectors × :meth:`Linearization.activation_numel`)
#: in one batched product on the CPU. Measured on the 2-core CPU of
#: docs/benchmarks.md with 2 threads: a batched JVP+VJP costs per vector the
#: same up to ≈ 1.2e8 elements and about twice as much beyond (dip-256, 9
#: vectors: 6.2 s in one batch, 3.7 s in chunks of 3, 6.8 s in chunks of 4;
#: dip-128, 32 vectors: 5.8 s in one batch, 2.8 s in chunks of 12, 5.8 s in
#: chunks of 16).
CPU_CHUNK_ELEMENTS = 120_000_000


@contextlib.contextmanager
def full_float32(device):
    """Float32 arithmetic in full precision on CUDA while the block runs: no TF32.

    torch lets cuDNN compute float32 convolutions in TF32 (a 10-bit mantissa)
    on Ampere and later GPUs. A DIP fit does not mind; the linearised model
    does: ``J v`` and ``Jᵀ u`` then agree only to about 1e-3 relative, the
    CG solves' own tolerance, and the solves stall at their iteration cap
    (on an H200 every EM step of the 64²–512² speed scans did, and the
    posterior std came out 3–43× the CPU's; TF32's rounding emulated on the
    CPU gave the GPU's 64² figures: docs/scaling.md §5c). Turns cuDNN's
    and cuBLAS's TF32 off and restores both flags afterwards; does nothing
    off CUDA.

    Parameters
    ----------
    device : torch.device or str
        The device of the tensors the block computes with.
    """
    if torch.device(device).type != "cuda":
        yield
        return
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    old = cudnn.allow_tf32, matmul.allow_tf32
    cudnn.allow_tf32 = matmul.allow_tf32 = False
    try:
        yield
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = old


def in_full_float32(method):
    """Run a :class:`Linearization` method under :func:`full_float32` of its device."""
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        with full_float32(self.device):
            return method(self, *args, **kwargs)
    return wrapped


def auto_chunk_size(activation_numel: int, device) -> int:
    """Vectors per batched Jacobian product for a network of this activation size.

    Parameters
    ----------
    activation_numel : int
        Elements of the activations of one forward pass
        (:meth:`Linearization.activation_numel`).
    device : torch.device or str

    Returns
    -------
    int
        CPU: ``CPU_CHUNK_ELEMENTS // activation_numel`` (at least 1). CUDA:
        as many vectors as fit a quarter of the free memory at 16 bytes per
        activation element and vector (float32 primal, tangent and the
        saved values of the backward pass), at least 1.
    """
    per_vector = max(1, int(activation_numel))
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return max(1, int(free // 4 // (16 * per_vector)))
    return max(1, CPU_CHUNK_ELEMENTS // per_vector)


@dataclass(frozen=True)
class ParamSegment:
    """One network parameter tensor inside the flat parameter vector.

    Attributes
    ----------
    name : str
        Parameter name as in ``model.named_parameters()`` (e.g. ``inc.0.conv.weight``).
    shape : tuple of int
        Its shape (``[c_out, c_in, kh, kw]`` for a conv weight).
    slice : slice
        Where it lies in the flat vector.
    """

    name: str
    shape: tuple[int, ...]
    slice: slice

    @property
    def numel(self) -> int:
        return self.slice.stop - self.slice.start

    @property
    def kernel_size(self) -> tuple[int, int] | None:
        """``(kh, kw)`` for a 4-D conv weight, else None."""
        return tuple(self.shape[-2:]) if len(self.shape) == 4 else None


@dataclass(frozen=True)
class ParamBlock:
    """A prior block: consecutive parameter tensors sharing prior hyperparameters.

    Attributes
    ----------
    name : str
        Block name (``inc``, ``down_0``, ``skip_0``, ``up_0``, ``out`` for the U-net).
    slice : slice
        Where the block lies in the flat vector.
    segments : tuple of ParamSegment
        Its parameter tensors, in order.
    """

    name: str
    slice: slice
    segments: tuple[ParamSegment, ...]

    @property
    def numel(self) -> int:
        return self.slice.stop - self.slice.start

    @property
    def kernel_size(self) -> tuple[int, int] | None:
        """The common ``(kh, kw)`` of the block's conv weights, or None if mixed / not conv."""
        sizes = {s.kernel_size for s in self.segments}
        return sizes.pop() if len(sizes) == 1 else None


def select_parameters(model: nn.Module, param_filter="conv_weights"
                      ) -> "OrderedDict[str, list[str]]":
    """Choose the linearised parameters and group them into prior blocks.

    Parameters
    ----------
    model : nn.Module
        With a ``blocks()`` method (the U-net) the blocks are its blocks; any
        other module gets one block per top-level child module.
    param_filter : {'conv_weights', 'conv', 'all'} or callable
        ``'conv_weights'`` (default, reference): the weights of the convs of
        ``model.blocks()`` (all ``Conv2d`` weights for other modules);
        ``'conv'``: their weights and biases; ``'all'``: every trainable
        parameter (parameters outside the blocks form a block ``'other'``);
        a callable ``(name, parameter) -> bool`` filters ``'all'``.

    Returns
    -------
    OrderedDict
        Block name → list of parameter names, in network order.
    """
    params = dict(model.named_parameters())
    blocks: OrderedDict[str, list[str]] = OrderedDict()
    if hasattr(model, "blocks"):
        for bname, convs in model.blocks().items():
            names = []
            for wname, conv in convs:
                names.append(wname)
                if conv.bias is not None:
                    names.append(wname[: -len("weight")] + "bias")
            blocks[bname] = names
    else:
        for cname, child in model.named_children():
            names = [f"{cname}.{n}" for n, _ in child.named_parameters()]
            if names:
                blocks[cname] = names
    covered = {n for names in blocks.values() for n in names}
    rest = [n for n in params if n not in covered]

    if param_filter == "conv_weights" or param_filter == "conv":
        keep_bias = param_filter == "conv"
        mods = dict(model.named_modules())

        def is_conv_param(n: str) -> bool:
            mod = mods.get(n.rsplit(".", 1)[0]) if "." in n else model
            if not isinstance(mod, nn.Conv2d | nn.ConvTranspose2d):
                return False
            return n.endswith(".weight") or (keep_bias and n.endswith(".bias"))

        out = OrderedDict((b, [n for n in names if is_conv_param(n)])
                          for b, names in blocks.items())
    elif param_filter == "all" or callable(param_filter):
        keep = (lambda n, p: True) if param_filter == "all" else param_filter
        out = OrderedDict((b, [n for n in names if keep(n, params[n])])
                          for b, names in blocks.items())
        extra = [n for n in rest if keep(n, params[n])]
        if extra:
            out["other"] = extra
    else:
        raise InputError("must be 'conv_weights', 'conv', 'all' or a callable, got "
                         f"{param_filter!r}", field="param_filter")
    out = OrderedDict((b, names) for b, names in out.items() if names)
    if not out:
        raise InputError("no parameters selected for the linearisation", field="param_filter")
    return out


class Linearization:
    """Jacobian operator of a fitted network at its weights ``θ̃``.

    Parameters
    ----------
    model : nn.Module
        The fitted network (put in eval mode here: dropout off). Its
        parameters are not modified.
    net_input : Tensor
        The fixed network input, e.g. ``[1, 1, H, W]`` for the DIP.
    param_filter : str or callable, optional
        Which parameters form ``θ`` (see :func:`select_parameters`).
        Default ``'conv_weights'``.
    chunk_size : int or None or 'auto', optional
        Largest number of vectors pushed through one ``vmap``-ed product;
        larger batches are processed in chunks. None: all at once.
        ``'auto'`` (default): on the CPU, as many vectors as keep
        ``chunk × activation_numel()`` under :data:`CPU_CHUNK_ELEMENTS`; on
        CUDA, as many as fit a quarter of the free memory (see
        :func:`auto_chunk_size`).
    vectorize : bool, optional
        Use ``torch.func.vmap`` (default True). If vmap fails for some layer,
        the products fall back to an explicit loop (logged once).

    Attributes
    ----------
    theta_hat : Tensor, shape (d_θ,)
        The chosen parameters at the fit, flattened (float32, on the model's device).
    x_hat : Tensor
        ``f(θ̃)``, the network output with the batch/channel axes of size one
        squeezed: ``[H, W]`` for the DIP.
    blocks : OrderedDict[str, ParamBlock]
        The prior blocks, in network order.
    block_slices : OrderedDict[str, slice]
        Block name → slice of the flat vector.
    device, dtype
        Of ``theta_hat``.

    Notes
    -----
    The linearisation point is frozen at construction (the parameters and
    buffers are copied; the VJP's forward pass is cached): later changes to
    the model's weights do not reach it.

    Cost: ``jvp`` of ``k`` vectors ≈ 2–3 forward passes of a batch of ``k``;
    ``vjp`` ≈ the same (the primal forward pass is cached).
    """

    def __init__(self, model: nn.Module, net_input: Tensor, param_filter="conv_weights", *,
                 chunk_size: int | str | None = "auto", vectorize: bool = True):
        model.eval()
        self.model = model
        self.net_input = net_input.detach()
        auto = isinstance(chunk_size, str) and chunk_size == "auto"
        if chunk_size is not None and not auto and (
                isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)
                or chunk_size < 1):
            raise InputError(f"must be a positive integer, None or 'auto', got {chunk_size!r}",
                             field="chunk_size")
        self._vectorize = bool(vectorize)

        groups = select_parameters(model, param_filter)
        params = dict(model.named_parameters())
        blocks: OrderedDict[str, ParamBlock] = OrderedDict()
        names, shapes, offset = [], [], 0
        for bname, pnames in groups.items():
            segs, start = [], offset
            for pn in pnames:
                p = params[pn]
                segs.append(ParamSegment(pn, tuple(p.shape), slice(offset, offset + p.numel())))
                names.append(pn)
                shapes.append(tuple(p.shape))
                offset += p.numel()
            blocks[bname] = ParamBlock(bname, slice(start, offset), tuple(segs))
        self.blocks = blocks
        self.block_slices = OrderedDict((b, blk.slice) for b, blk in blocks.items())
        self.param_names: list[str] = names
        self._shapes = shapes
        self._sizes = [math.prod(s) for s in shapes]
        self.theta_hat = torch.cat([params[n].detach().reshape(-1) for n in names])
        self.device, self.dtype = self.theta_hat.device, self.theta_hat.dtype
        chosen = set(names)
        self._fixed = {n: p.detach().clone() for n, p in params.items() if n not in chosen}
        self._fixed.update({n: b.detach().clone() for n, b in model.named_buffers()})

        with torch.no_grad(), full_float32(self.device):
            out = self._f_raw(self.theta_hat)
        self.out_shape = tuple(out.shape)
        self.x_hat = out.reshape(self.image_shape)
        self._vjp_fn: Callable | None = None
        self._float64: tuple | None = None  # (f, θ̃, VJP) of the network in float64
        self._act_numel: int | None = None
        self.chunk_size: int | None = (
            auto_chunk_size(self.activation_numel(), self.device) if auto
            else None if chunk_size is None else int(chunk_size))
        log.info("linearisation: %d parameters in %d blocks (%s), output %s",
                 self.num_params, len(blocks), param_filter if isinstance(param_filter, str)
                 else "custom filter", self.image_shape)

    # ------------------------------------------------------------------ shapes
    @property
    def num_params(self) -> int:
        """``d_θ``."""
        return int(self.theta_hat.numel())

    @property
    def image_shape(self) -> tuple[int, ...]:
        """The output shape without singleton batch/channel axes (``(H, W)`` for the DIP)."""
        shape = tuple(self.out_shape)
        while len(shape) > 2 and shape[0] == 1:
            shape = shape[1:]
        return shape

    @property
    def num_outputs(self) -> int:
        """``d_x``."""
        return math.prod(self.image_shape)

    def block_sizes(self) -> "OrderedDict[str, int]":
        """Block name → ``d_b``."""
        return OrderedDict((b, blk.numel) for b, blk in self.blocks.items())

    def split(self, v: Tensor) -> "OrderedDict[str, Tensor]":
        """Views of the blocks of ``v`` (``[..., d_θ]`` → name → ``[..., d_b]``)."""
        return OrderedDict((b, v[..., sl]) for b, sl in self.block_slices.items())

    # --------------------------------------------------------------- the map f
    def _params_from(self, theta: Tensor, fixed: dict | None = None) -> dict:
        p = dict(self._fixed if fixed is None else fixed)
        for n, t, s in zip(self.param_names, theta.split(self._sizes), self._shapes):
            p[n] = t.view(s)
        return p

    def _f_raw(self, theta: Tensor, fixed: dict | None = None,
               net_input: Tensor | None = None) -> Tensor:
        inp = self.net_input if net_input is None else net_input
        return functional_call(self.model, self._params_from(theta, fixed), (inp,))

    def f(self, theta: Tensor) -> Tensor:
        """The network output at the flat parameters ``theta`` (``[d_θ]`` → image shape)."""
        return self._f_raw(theta).reshape(self.image_shape)

    def linear_model(self, theta: Tensor) -> Tensor:
        """``f(θ̃) + J (θ − θ̃)`` for ``theta`` ``[d_θ]`` or ``[k, d_θ]``."""
        single = theta.ndim == 1
        t = theta.reshape(-1, self.num_params)
        out = self.x_hat + self.jvp(t - self.theta_hat)
        return out[0] if single else out

    # ------------------------------------------------------------ the products
    def _chunks(self, v: Tensor):
        n = v.shape[0]
        step = n if self.chunk_size is None else self.chunk_size
        for i in range(0, n, max(step, 1)):
            yield v[i:i + step]

    def _jvp_one(self, v: Tensor) -> Tensor:
        return jvp(lambda th: self._f_raw(th).reshape(self.image_shape),
                   (self.theta_hat,), (v,))[1]

    def _get_vjp_fn(self) -> Callable:  # called from vjp() and dense(), in full float32
        if self._vjp_fn is None:
            _, self._vjp_fn = vjp(lambda th: self._f_raw(th).reshape(self.image_shape),
                                  self.theta_hat)
        return self._vjp_fn

    def release_float64(self) -> None:
        """Drop the float64 copy of the network that :meth:`jvp`/:meth:`vjp` with
        ``dtype=torch.float64`` make: its VJP holds a double-precision forward pass,
        twice the float32 one's memory (a sampler's refinement calls this after each
        solve; the next float64 product makes it again)."""
        self._float64 = None

    def _in_float64(self) -> tuple:
        """``(f, θ̃, VJP)`` of the network recomputed in float64 (made once)."""
        if self._float64 is None:
            fixed = {k: v.double() if v.is_floating_point() else v
                     for k, v in self._fixed.items()}
            inp = self.net_input.double()

            def f(th):
                return self._f_raw(th, fixed, inp).reshape(self.image_shape)

            theta = self.theta_hat.double()
            self._float64 = (f, theta, vjp(f, theta)[1])
        return self._float64

    def _batched(self, fn: Callable, v: Tensor) -> Tensor:
        if self._vectorize:
            try:
                return vmap(fn)(v)
            except (RuntimeError, NotImplementedError) as err:
                log.warning("vmap failed (%s); falling back to an explicit loop", err)
                self._vectorize = False
        return torch.stack([fn(vi) for vi in v])

    @in_full_float32
    def jvp(self, v: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """``J v`` for a batch of parameter-space vectors.

        Parameters
        ----------
        v : Tensor, shape (k, d_θ) or (d_θ,)
        dtype : torch.dtype, optional
            ``torch.float64``: the network recomputed in double precision
            (about twice the cost; for residuals that float32 cannot resolve).
            Default None: :attr:`dtype` (float32).

        Returns
        -------
        Tensor, shape (k, H, W) (or (H, W) for a single vector)
        """
        single = v.ndim == 1
        double = dtype == torch.float64
        v = v.reshape(-1, self.num_params).to(torch.float64 if double else self.dtype)
        if v.shape[0] == 0:
            return v.new_zeros(0, *self.image_shape)
        if double:
            f, theta, _ = self._in_float64()
            one = lambda vi: jvp(f, (theta,), (vi,))[1]  # noqa: E731
        else:
            one = self._jvp_one
        out = torch.cat([self._batched(one, c) for c in self._chunks(v)])
        return out[0] if single else out

    @in_full_float32
    def vjp(self, u: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """``Jᵀ u`` for a batch of image-space vectors.

        Parameters
        ----------
        u : Tensor, shape (k, H, W) or (H, W)
        dtype : torch.dtype, optional
            As for :meth:`jvp`. Default None: :attr:`dtype` (float32).

        Returns
        -------
        Tensor, shape (k, d_θ) (or (d_θ,) for a single image)
        """
        single = u.ndim == len(self.image_shape)
        double = dtype == torch.float64
        u = u.reshape(-1, *self.image_shape).to(torch.float64 if double else self.dtype)
        if u.shape[0] == 0:
            return u.new_zeros(0, self.num_params)
        fn = self._in_float64()[2] if double else self._get_vjp_fn()
        out = torch.cat([self._batched(lambda ui: fn(ui)[0], c) for c in self._chunks(u)])
        return out[0] if single else out

    # ------------------------------------------------------------------ dense
    def activation_numel(self) -> int:
        """Elements of all intermediate activations of one forward pass (memory estimates)."""
        if self._act_numel is None:
            total = [0]

            def hook(_mod, _inp, out):
                if torch.is_tensor(out):
                    total[0] += out.numel()

            handles = [m.register_forward_hook(hook) for m in self.model.modules()
                       if not list(m.children())]
            try:
                with torch.no_grad():
                    self._f_raw(self.theta_hat)
            finally:
                for h in handles:
                    h.remove()
            self._act_numel = int(total[0])
        return self._act_numel

    @in_full_float32
    def dense(self, dtype: torch.dtype = torch.float32, chunk_size: int | None = None,
              max_chunk_bytes: int = 2**30) -> Tensor:
        """The dense Jacobian, row by row via batched VJPs (small problems only).

        Parameters
        ----------
        dtype : torch.dtype, optional
            ``torch.float64`` recomputes the network in double precision (the
            exact oracle). Default float32.
        chunk_size : int or None, optional
            Rows per batched VJP. Default: as many as keep the backward
            activations (≈ 3 × :meth:`activation_numel` per row) under
            ``max_chunk_bytes``, at most 256.
        max_chunk_bytes : int, optional
            Default 1 GiB.

        Returns
        -------
        Tensor, shape (d_x, d_θ)
            ``J[i, j] = ∂ f_i / ∂ θ_j`` with ``i`` the C-order pixel index.
        """
        n_out, d = self.num_outputs, self.num_params
        itemsize = torch.finfo(dtype).bits // 8
        if chunk_size is None:
            per_row = 3 * self.activation_numel() * itemsize
            chunk_size = int(max(1, min(256, max_chunk_bytes // max(per_row, 1))))
        log.info("dense Jacobian %d x %d (%s, %.1f MB), %d rows per VJP batch", n_out, d,
                 dtype, n_out * d * itemsize / 1e6, chunk_size)
        if dtype == self.dtype:
            fn = self._get_vjp_fn()
        elif dtype == torch.float64:
            fn = self._in_float64()[2]
        else:
            fixed = {k: v.to(dtype) if v.is_floating_point() else v
                     for k, v in self._fixed.items()}
            inp = self.net_input.to(dtype)
            theta = self.theta_hat.to(dtype)
            _, fn = vjp(lambda th: self._f_raw(th, fixed, inp).reshape(self.image_shape), theta)
        out = torch.empty(n_out, d, dtype=dtype, device=self.device)
        eye_rows = torch.arange(n_out, device=self.device)
        for i in range(0, n_out, chunk_size):
            idx = eye_rows[i:i + chunk_size]
            basis = torch.zeros(idx.numel(), n_out, dtype=dtype, device=self.device)
            basis[torch.arange(idx.numel(), device=self.device), idx] = 1
            basis = basis.reshape(-1, *self.image_shape)
            if self._vectorize:
                try:
                    out[idx] = vmap(lambda ui: fn(ui)[0])(basis)
                    continue
                except (RuntimeError, NotImplementedError) as err:
                    log.warning("vmap failed (%s); falling back to an explicit loop", err)
                    self._vectorize = False
            out[idx] = torch.stack([fn(ui)[0] for ui in basis])
        return out

    def __repr__(self) -> str:
        return (f"Linearization(d_theta={self.num_params}, blocks={list(self.blocks)}, "
                f"output={self.image_shape})")

