"""Differentiable 2-D ray transforms in torch, after deepinv's physics objects.

:class:`RayTransform` is a ``torch.nn.Module`` with ``A`` (forward
projection), ``A_adjoint`` (back-projection, the exact Euclidean adjoint:
``<A x, y> = <x, A_adjoint y>`` with plain sums) and ``A_dagger`` (filtered
back-projection). Every method takes a batch: an image tensor of shape
``(..., n0, n1)`` maps to a sinogram of shape ``(..., n_angles, n_detector)``.
Sinogram values are line integrals in image-value × mm.

Backends
--------
``'matrix'``
    The ASTRA system matrix (``astra.projector.matrix``) held as a torch CSR
    tensor together with a precomputed CSR transpose, on the target device,
    inside a custom ``torch.autograd.Function`` whose backward is the other
    matrix. It supports reverse mode (twice: the backward is itself
    differentiable), forward mode (``torch.func.jvp``) and ``torch.func.vmap``.
    The matrix is cached on disk, keyed by the geometry's fingerprint
    (``$CTUQ_CACHE_DIR`` or ``~/.cache/ctuq``).
``'astra'``
    ODL's ``RayTransform`` (``astra_cuda`` when the tensors live on a CUDA
    device and ASTRA has CUDA, ``astra_cpu`` otherwise), for sizes whose
    matrix does not fit in memory. Slower: every call copies through numpy.
``'auto'``
    ``'matrix'`` when its two copies fit in ``max_matrix_bytes``, else
    ``'astra'``; the choice is logged.

Both backends use ASTRA's ``linear`` projector for parallel beam and
``line_fanflat`` for fan beam (ODL's defaults), so they agree to float32
round-off. FBP is ODL's ``fbp_op`` (Hann filter by default).

Convention: images and sinograms are in ctuq's (= ASTRA's) convention, see
:mod:`ctuq.data.geometry` and ``docs/conventions.md``. ODL's first image
axis is ``x`` and its second ``y``, so an image goes to ODL as
``np.rot90(image, -1)`` (shape ``(n1, n0)``) and comes back with
``np.rot90(odl_image, 1)``; ODL's angle partition must increase, so the
sinogram rows are sorted by angle on the way in and put back in the
geometry's order on the way out. Both are exact permutations (the system
matrix is permuted once when it is built). Measured against ASTRA's own
``create_sino`` (parallel ``linear`` and ``line_fanflat``): equal to float32
round-off (docs/conventions.md).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from ctuq.data.geometry import Geometry
from ctuq.errors import InputError

log = logging.getLogger(__name__)

BACKENDS = ("auto", "matrix", "astra")
#: Bumped whenever the meaning of a cached matrix changes (2: ASTRA's image axes).
_MATRIX_LAYOUT = 2
DEFAULT_MAX_MATRIX_BYTES = 2 * 1024**3


# --------------------------------------------------------------------------
# ODL / ASTRA set-up
# --------------------------------------------------------------------------
def angle_order(geometry: Geometry) -> np.ndarray | None:
    """Indices that sort the geometry's angles increasingly (None when already sorted)."""
    order = np.argsort(geometry.angles, kind="stable")
    return None if np.array_equal(order, np.arange(order.size)) else order


def equispaced_angles(geometry: Geometry) -> float | None:
    """The step of the geometry's sorted angles if they are equispaced (or one angle), else None."""
    angles = np.sort(geometry.angles)
    if angles.size == 1:
        return 1.0
    steps = np.diff(angles)
    return float(steps[0]) if np.allclose(steps, steps[0], rtol=1e-9, atol=1e-12) else None


def angular_cells(geometry: Geometry) -> np.ndarray:
    """The angular cell of each projection, in the order of the sorted angles (radians).

    Each angle owns half the gap to each neighbour. Where the angles cover
    the period of the geometry (π for parallel beam, 2π for a parallel scan
    over more than π and for fan beam) the first and last angle are
    neighbours across the wrap-around; otherwise (a limited-angle scan) an
    end angle owns its one inner gap. Equispaced angles get equal cells.
    """
    angles = np.sort(geometry.angles)
    if angles.size == 1:
        return np.ones(1)
    gaps = np.diff(angles)
    span = angles[-1] - angles[0]
    period = np.pi if geometry.beam == "parallel" and span < np.pi * (1 + 1e-6) else 2 * np.pi
    wrap = angles[0] + period - angles[-1]
    if wrap <= 2 * gaps.max() * (1 + 1e-9):
        before, after = np.r_[wrap, gaps], np.r_[gaps, wrap]
    else:
        before, after = np.r_[gaps[0], gaps], np.r_[gaps, gaps[-1]]
    return 0.5 * (before + after)


def to_odl_image(image: np.ndarray) -> np.ndarray:
    """``[..., row, column]`` (ctuq/ASTRA) -> ``[..., x, y]`` (ODL's axes)."""
    return np.rot90(image, -1, axes=(-2, -1))


def from_odl_image(image: np.ndarray) -> np.ndarray:
    """Inverse of :func:`to_odl_image`."""
    return np.rot90(image, 1, axes=(-2, -1))


def odl_space_and_geometry(geometry: Geometry):
    """The ODL reconstruction space and ODL geometry of a :class:`Geometry`.

    The space has shape ``(n1, n0)`` (see :func:`to_odl_image`) and the angle
    partition holds the angles sorted increasingly (see :func:`angle_order`).
    """
    import odl
    from odl.applications import tomo

    n0, n1 = geometry.image_shape
    p = geometry.pixel_size
    drow, dcol = geometry.image_offset
    cx, cy = dcol * p, -drow * p   # image centre; y grows upwards, against the rows
    space = odl.uniform_discr([cx - n1 * p / 2, cy - n0 * p / 2],
                              [cx + n1 * p / 2, cy + n0 * p / 2], (n1, n0), dtype="float32")
    angles = np.sort(geometry.angles)
    step = equispaced_angles(geometry)
    if angles.size > 1 and step is not None:
        apart = odl.uniform_partition(angles[0] - step / 2, angles[-1] + step / 2, angles.size)
    elif angles.size == 1:
        apart = odl.uniform_partition(angles[0] - 0.5, angles[0] + 0.5, 1)
    else:
        apart = odl.nonuniform_partition(angles)
    half = geometry.detector_width / 2
    # the rotation axis projects center_offset pixels from the detector centre
    shift = geometry.center_offset * geometry.detector_spacing
    dpart = odl.uniform_partition(-half - shift, half - shift, geometry.n_detector)
    if geometry.beam == "parallel":
        odl_geom = tomo.Parallel2dGeometry(apart, dpart)
        if geometry.center_offset:
            # ODL's CPU path hands ASTRA a plain 'parallel' geometry and drops the
            # detector shift (its CUDA path keeps it); give it the shifted one
            import astra
            from odl.applications.tomo.backends.astra_setup import astra_projection_geometry

            plain = astra_projection_geometry(odl_geom, "cpu")
            odl_geom.implementation_cache["astra_cpu"] = astra.geom_postalignment(
                plain, -geometry.center_offset)
    else:
        odl_geom = tomo.FanBeamGeometry(apart, dpart, src_radius=geometry.source_origin,
                                        det_radius=geometry.origin_detector)
    return space, odl_geom


def _astra_matrix(geometry: Geometry):
    """The ASTRA CPU system matrix (scipy CSR, float32) that ODL's forward uses."""
    import astra
    from odl.applications.tomo.backends.astra_cpu import default_astra_proj_type
    from odl.applications.tomo.backends.astra_setup import (
        astra_projection_geometry, astra_projector, astra_volume_geometry)

    space, odl_geom = odl_space_and_geometry(geometry)
    vol_geom = astra_volume_geometry(space, "cpu")
    proj_geom = astra_projection_geometry(odl_geom, "cpu")
    proj_id = astra_projector(default_astra_proj_type(odl_geom), vol_geom, proj_geom, 2)
    mat_id = astra.projector.matrix(proj_id)
    try:
        mat = astra.matrix.get(mat_id).tocsr().astype(np.float32)
    finally:
        astra.matrix.delete(mat_id)
        astra.projector.delete(proj_id)
    # ODL's columns are [x, y] images, its rows sorted angles: permute both into
    # ctuq's image C order and the geometry's angle order
    n0, n1 = geometry.image_shape
    # at each ODL position, the ctuq pixel it holds: ODL column -> ctuq column
    cols = np.ascontiguousarray(to_odl_image(np.arange(n0 * n1).reshape(n0, n1))).reshape(-1)
    mat.indices = cols[mat.indices].astype(mat.indices.dtype)
    mat.has_sorted_indices = False
    order = angle_order(geometry)
    if order is not None:
        n_det = geometry.n_detector
        rows = (np.argsort(order)[:, None] * n_det + np.arange(n_det)).reshape(-1)
        mat = mat[rows]
    mat.sort_indices()
    mat.sum_duplicates()
    mat.eliminate_zeros()
    return mat


def cache_dir() -> Path:
    """Where system matrices are cached: ``$CTUQ_CACHE_DIR`` or ``~/.cache/ctuq``."""
    root = os.environ.get("CTUQ_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "ctuq"


def system_matrix(geometry: Geometry, use_cache: bool = True):
    """The system matrix of ``geometry`` as scipy CSR, from the disk cache if there.

    Parameters
    ----------
    geometry : Geometry
    use_cache : bool, optional
        Read and write the cache. Default True.

    Returns
    -------
    scipy.sparse.csr_matrix, shape (n_angles * n_detector, n0 * n1), float32
        Rows in sinogram C order (angle-major), columns in image C order.
    """
    import astra
    import scipy.sparse as sp

    path = (cache_dir() / "matrices"
            / f"{geometry.fingerprint[:32]}-astra{astra.__version__}-v{_MATRIX_LAYOUT}.npz")
    if use_cache and path.exists():
        try:
            mat = sp.load_npz(path).tocsr()
            if mat.shape == (int(np.prod(geometry.range_shape)), int(np.prod(geometry.image_shape))):
                return mat
        except (OSError, ValueError) as err:  # a damaged cache entry is rebuilt
            log.warning("ignoring unreadable matrix cache %s: %s", path, err)
    mat = _astra_matrix(geometry)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
            os.close(fd)
            try:
                with open(tmp, "wb") as f:
                    sp.save_npz(f, mat, compressed=False)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        except OSError as err:  # a read-only home must not stop a reconstruction
            log.warning("could not cache the system matrix in %s: %s", path.parent, err)
    return mat


def _to_torch_csr(mat, device) -> torch.Tensor:
    with warnings.catch_warnings():  # "sparse CSR support is in beta": we test what we use
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(mat.indptr.astype(np.int32)),
            torch.from_numpy(mat.indices.astype(np.int32)),
            torch.from_numpy(mat.data.astype(np.float32)),
            size=mat.shape, device=device)


# --------------------------------------------------------------------------
# autograd: a linear map y = M x on the last dimension, with M^T as backward
# --------------------------------------------------------------------------
class CsrPair:
    """A CSR matrix with its precomputed CSR transpose.

    A plain object rather than tensor arguments, so that ``torch.func``
    transforms do not try to wrap the sparse tensors (they cannot).
    """

    def __init__(self, mat: torch.Tensor, mat_t: torch.Tensor, _t: "CsrPair | None" = None):
        self.mat, self.mat_t = mat, mat_t
        self._t = _t

    @property
    def T(self) -> "CsrPair":
        if self._t is None:
            self._t = CsrPair(self.mat_t, self.mat, self)
        return self._t

    def to(self, device=None, dtype=None) -> "CsrPair":
        return CsrPair(self.mat.to(device=device, dtype=dtype),
                       self.mat_t.to(device=device, dtype=dtype))


class _CsrMatmul(torch.autograd.Function):
    """``x [B, n] -> x M^T [B, m]`` for a CSR matrix ``M``; backward uses ``M^T``."""

    @staticmethod
    def forward(x, pair):
        # sparse @ dense with the batch as columns is the fast layout
        return torch.sparse.mm(pair.mat, x.t().contiguous()).t()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.pair = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return _CsrMatmul.apply(grad, ctx.pair.T), None

    @staticmethod
    def jvp(ctx, x_tangent, _):
        return _CsrMatmul.apply(x_tangent, ctx.pair)

    @staticmethod
    def vmap(info, in_dims, x, pair):
        # fold the vmapped dimension into the batch of columns
        x = x.movedim(in_dims[0], 0)
        v, b, n = x.shape
        out = _CsrMatmul.apply(x.reshape(v * b, n), pair)
        return out.reshape(v, b, -1), 0


class _OdlLinear(torch.autograd.Function):
    """An ODL linear operator on numpy, applied image by image."""

    @staticmethod
    def forward(x, fwd, adj):
        x_np = x.detach().cpu().numpy()
        out = np.stack([fwd(xi) for xi in x_np])
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).to(x.device)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, ctx.fwd, ctx.adj = inputs

    @staticmethod
    def backward(ctx, grad):
        return _OdlLinear.apply(grad, ctx.adj, ctx.fwd), None, None

    @staticmethod
    def jvp(ctx, x_tangent, *_):
        return _OdlLinear.apply(x_tangent, ctx.fwd, ctx.adj)


# --------------------------------------------------------------------------
# the operator
# --------------------------------------------------------------------------
class RayTransform(torch.nn.Module):
    """2-D ray transform with forward, adjoint and FBP, batched, on CPU or CUDA.

    Parameters
    ----------
    geometry : Geometry
        The acquisition geometry.
    backend : {'auto', 'matrix', 'astra'}, optional
        See the module docstring. Default ``'auto'``.
    device : str or torch.device, optional
        Where the operator's tensors live. Default ``'cpu'``.
    max_matrix_bytes : int, optional
        Largest matrix (both copies) ``'auto'`` accepts. Default 2 GiB.
    use_cache : bool, optional
        Cache system matrices on disk. Default True.

    Examples
    --------
    >>> import torch
    >>> from ctuq.data.geometry import Geometry
    >>> op = RayTransform(Geometry.parallel(28, n_angles=20), backend="matrix")
    >>> x = torch.rand(4, 1, 28, 28)
    >>> op.A(x).shape
    torch.Size([4, 1, 20, 40])
    >>> op.A_adjoint(op.A(x)).shape
    torch.Size([4, 1, 28, 28])
    """

    def __init__(self, geometry: Geometry, backend: str = "auto", device="cpu", *,
                 max_matrix_bytes: int = DEFAULT_MAX_MATRIX_BYTES, use_cache: bool = True):
        super().__init__()
        if not isinstance(geometry, Geometry):
            raise InputError(f"expected a Geometry, got {type(geometry).__name__}",
                             field="geometry")
        if backend not in BACKENDS:
            raise InputError(f"must be one of {', '.join(BACKENDS)}, got {backend!r}",
                             field="backend")
        self.geometry = geometry
        self._device = torch.device(device)
        if backend == "auto":
            backend = self._choose_backend(max_matrix_bytes)
        self.backend = backend
        self._odl = None  # (ray_trafo, fbp_op, adjoint scale), built lazily
        self._pair64 = None  # the matrix in float64, made on the first float64 product
        if backend == "matrix":
            mat = system_matrix(geometry, use_cache=use_cache)
            self._pair = CsrPair(_to_torch_csr(mat, self._device),
                                 _to_torch_csr(mat.T.tocsr(), self._device))
        log.info("ray transform %s: backend %s on %s", geometry, backend, self._device)

    def _choose_backend(self, max_bytes: int) -> str:
        # ASTRA's linear projector touches about two detector cells per pixel and angle;
        # each stored entry costs 4 (value) + 4 (int32 column index) bytes, times two copies
        n_pixels = int(np.prod(self.geometry.image_shape))
        est_bytes = 2 * 8 * 2 * n_pixels * self.geometry.n_angles
        choice = "matrix" if est_bytes <= max_bytes else "astra"
        log.info("backend 'auto' chose %r (matrix estimated at %.2f GiB, limit %.2f GiB)",
                 choice, est_bytes / 1024**3, max_bytes / 1024**3)
        return choice

    # -- device handling: sparse tensors are plain attributes, moved by hand ----
    @property
    def device(self) -> torch.device:
        return self._device

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        probe = fn(torch.zeros(1, device=self._device))
        if probe.device != self._device:
            self._device = probe.device
            if self.backend == "matrix":
                self._pair = self._pair.to(self._device)
            self._odl, self._pair64 = None, None
        return self

    @property
    def domain_shape(self) -> tuple[int, int]:
        return self.geometry.image_shape

    @property
    def range_shape(self) -> tuple[int, int]:
        return self.geometry.range_shape

    # -- ODL objects --------------------------------------------------------
    def _odl_ops(self):
        if self._odl is None:
            from odl.applications import tomo

            space, odl_geom = odl_space_and_geometry(self.geometry)
            impl = "astra_cpu"
            if self._device.type == "cuda":
                import astra
                if astra.use_cuda():
                    impl = "astra_cuda"
            ray = tomo.RayTransform(space, odl_geom, impl=impl)
            # ODL's adjoint is taken in cell-volume weighted inner products
            scale = float(space.weighting.const) / float(ray.range.weighting.const)
            self._odl = (ray, scale)
        return self._odl

    def _rows_from_odl(self, y: np.ndarray) -> np.ndarray:
        order = angle_order(self.geometry)
        return y if order is None else y[..., np.argsort(order), :]

    def _rows_to_odl(self, y: np.ndarray) -> np.ndarray:
        order = angle_order(self.geometry)
        return y if order is None else y[..., order, :]

    def _odl_forward(self, x: np.ndarray) -> np.ndarray:
        out = self._odl_ops()[0](np.ascontiguousarray(to_odl_image(x))).asarray()
        return self._rows_from_odl(out)

    def _odl_adjoint(self, y: np.ndarray) -> np.ndarray:
        ray, scale = self._odl_ops()
        out = ray.adjoint(np.ascontiguousarray(self._rows_to_odl(y))).asarray() * scale
        return np.ascontiguousarray(from_odl_image(out))

    def _odl_flat_maps(self):
        """Forward and adjoint as maps between flat numpy vectors."""
        img, sino = self.domain_shape, self.range_shape
        return (lambda v: self._odl_forward(v.reshape(img)).reshape(-1),
                lambda v: self._odl_adjoint(v.reshape(sino)).reshape(-1))

    # -- the operator -------------------------------------------------------
    def _check(self, t: torch.Tensor, shape: tuple[int, int], what: str) -> torch.Tensor:
        if not torch.is_tensor(t):
            t = torch.as_tensor(t, dtype=torch.float32, device=self._device)
        if t.ndim < 2 or tuple(t.shape[-2:]) != tuple(shape):
            raise InputError(f"expected shape (..., {shape[0]}, {shape[1]}), got "
                             f"{tuple(t.shape)}", field=what)
        return t

    def _apply_linear(self, t, in_shape, out_shape, forward: bool, what: str):
        t = self._check(t, in_shape, what)
        lead = t.shape[:-2]
        if t.numel() == 0:
            return t.new_zeros(*lead, *out_shape)
        flat = t.reshape(-1, in_shape[0] * in_shape[1])
        if self.backend == "matrix" and flat.dtype == torch.float64:
            if self._pair64 is None:
                self._pair64 = self._pair.to(dtype=torch.float64)
            out = _CsrMatmul.apply(flat, self._pair64 if forward else self._pair64.T)
        elif self.backend == "matrix":
            pair = self._pair if forward else self._pair.T
            out = _CsrMatmul.apply(flat.float(), pair)
        else:
            fwd, adj = self._odl_flat_maps()
            out = _OdlLinear.apply(flat.float(), *((fwd, adj) if forward else (adj, fwd)))
        return out.reshape(*lead, *out_shape)

    @property
    def supports_float64(self) -> bool:
        """Whether float64 inputs are projected in float64 (the matrix backend: the same
        float32 entries, summed in float64); ASTRA's projectors compute in float32."""
        return self.backend == "matrix"

    def A(self, x: torch.Tensor) -> torch.Tensor:
        """Forward projection.

        Parameters
        ----------
        x : Tensor, shape (..., n0, n1)

        Returns
        -------
        Tensor, shape (..., n_angles, n_detector)
            float32; float64 for a float64 ``x`` where :attr:`supports_float64`.
        """
        return self._apply_linear(x, self.domain_shape, self.range_shape, True, "image")

    def A_adjoint(self, y: torch.Tensor) -> torch.Tensor:
        """Back-projection, the Euclidean adjoint of :meth:`A`.

        Parameters
        ----------
        y : Tensor, shape (..., n_angles, n_detector)

        Returns
        -------
        Tensor, shape (..., n0, n1)
            float32; float64 for a float64 ``y`` where :attr:`supports_float64`.
        """
        return self._apply_linear(y, self.range_shape, self.domain_shape, False, "sinogram")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.A(x)

    @torch.no_grad()
    def fbp(self, y: torch.Tensor, filter_type: str = "Hann",
            frequency_scaling: float = 1.0) -> torch.Tensor:
        """Filtered back-projection by ODL's ``fbp_op`` (not differentiable).

        Parameters
        ----------
        y : Tensor, shape (..., n_angles, n_detector)
        filter_type : str, optional
            ODL filter: ``'Ram-Lak'``, ``'Shepp-Logan'``, ``'Cosine'``,
            ``'Hamming'`` or ``'Hann'``. Default ``'Hann'``.
        frequency_scaling : float, optional
            Relative cut-off frequency in (0, 1]. Default 1.

        Returns
        -------
        Tensor, shape (..., n0, n1)
        """
        from odl.applications import tomo

        y = self._check(y, self.range_shape, "sinogram")
        if equispaced_angles(self.geometry) is None:
            return self._fbp_nonuniform(y, filter_type, frequency_scaling)
        ray, _ = self._odl_ops()
        fbp = tomo.fbp_op(ray, filter_type=filter_type, frequency_scaling=frequency_scaling)
        flat = y.detach().reshape(-1, *self.range_shape).cpu().numpy()
        out = np.stack([from_odl_image(fbp(np.ascontiguousarray(self._rows_to_odl(s))).asarray())
                        for s in flat]).astype(np.float32)
        return torch.from_numpy(out).to(y.device).reshape(*y.shape[:-2], *self.domain_shape)

    def _fbp_nonuniform(self, y: torch.Tensor, filter_type: str,
                        frequency_scaling: float) -> torch.Tensor:
        """FBP for angles that are not equispaced (golden-angle, irregular, missing views).

        ODL's FBP filter needs a uniform angle partition (it returns NaN
        otherwise). The filter depends on the detector sampling only, so the
        filter of an equispaced stand-in geometry (same detector, same number
        of angles, same total angular cell) is applied, each projection is
        weighted by its own angular cell (:func:`angular_cells`) over the
        stand-in's, and the result is back-projected along the true angles.
        For equispaced angles this is ODL's FBP to rounding (tested).
        """
        import dataclasses

        from odl.applications import tomo

        g = self.geometry
        cells = angular_cells(g)                      # sorted order
        n = g.n_angles
        step = float(cells.sum()) / n
        stand_in = dataclasses.replace(g, angles=np.sort(g.angles)[0] + step * np.arange(n))
        space, odl_geom = odl_space_and_geometry(stand_in)
        ray = tomo.RayTransform(space, odl_geom, impl="astra_cpu")
        filt = tomo.fbp_filter_op(ray, filter_type=filter_type,
                                  frequency_scaling=frequency_scaling)
        # ODL's adjoint is the transpose times the ratio of the cell-volume weightings
        const = float(ray.range.weighting.const) / float(space.weighting.const)
        flat = y.detach().reshape(-1, *self.range_shape).cpu().numpy()
        rows = np.stack([filt(np.ascontiguousarray(self._rows_to_odl(s))).asarray()
                         for s in flat]) * (cells / step)[:, None]
        rows = self._rows_from_odl(rows).astype(np.float32)
        out = self.A_adjoint(torch.from_numpy(rows).to(self._device)) * const
        return out.to(y.device).reshape(*y.shape[:-2], *self.domain_shape)

    def A_dagger(self, y: torch.Tensor) -> torch.Tensor:
        """Pseudo-inverse used as a quick reconstruction: the FBP (Hann)."""
        return self.fbp(y)

    def opnorm(self, iterations: int = 50, seed: int = 0) -> float:
        """Operator norm ``||A||_2`` by power iteration on ``A^T A``."""
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(self.domain_shape, generator=gen).to(self._device)
        norm = 0.0
        with torch.no_grad():
            for _ in range(iterations):
                x = self.A_adjoint(self.A(x))
                norm = float(x.norm())
                x = x / norm
        return float(np.sqrt(norm))

    def extra_repr(self) -> str:
        return f"{self.geometry!r}, backend={self.backend!r}, device={self._device}"
