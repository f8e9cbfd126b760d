"""One reconstruction problem: the data, its operator, its noise model and the settings.

A :class:`ReconstructionProblem` is made once per 2-D slice
(:meth:`ReconstructionProblem.from_sinogram`) and is what every stage of the
pipeline reads (:mod:`ctuq.recon.pipeline`): the DIP fit, the uncertainty
method (:mod:`ctuq.recon.methods`) and the model-error term
(:mod:`ctuq.recon.model_error`), instead of an operator and a data tensor
travelling as two loose arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ctuq.data.io import Sinogram
from ctuq.data.operators import RayTransform
from ctuq.errors import InputError

__all__ = ["NOISE_MODELS", "NoiseModel", "ReconstructionProblem"]


#: The noise models of the settings' ``noise_model`` (:meth:`NoiseModel.for_config`).
NOISE_MODELS = ("gaussian", "counts", "auto")


@dataclass(frozen=True)
class NoiseModel:
    """Gaussian noise of the measurements: ray ``i`` has variance ``σ² v_i``.

    Attributes
    ----------
    std : float
        The noise std ``σ`` (1/mm, the unit of the line integrals): given in
        the settings, the file's metadata, or estimated from the data; for
        count data the root of the mean delta-method variance.
    known : bool
        ``σ`` is given (settings, file, or the counts themselves with
        ``counts_scale = "known"``) rather than estimated or learned.
    ray_variance : Tensor or None
        ``v``, the per-ray relative variance (float32, the sinogram's shape,
        mean 1), on the data's device. None: ``v ≡ 1``, the scalar model, bit
        for bit the model of every ray alike.
    kind : {'gaussian', 'counts'}
        Where ``v`` came from: none (``'gaussian'``) or the delta-method
        variances of count data (:attr:`ctuq.data.io.Sinogram.variance`).
    """

    std: float
    known: bool
    ray_variance: torch.Tensor | None = None
    kind: str = "gaussian"

    @property
    def variance(self) -> float:
        """The scalar ``σ²`` (the common factor of every ray's variance)."""
        return float(self.std) ** 2

    @property
    def total_variance(self):
        """Every ray's variance ``σ² v`` (a tensor), or the scalar ``σ²`` when ``v ≡ 1``."""
        return self.variance if self.ray_variance is None else self.variance * self.ray_variance

    def summary(self) -> dict:
        """JSON-able: ``noise_model`` and, for counts, ``noise_scale`` (known/learned)
        and the spread of ``v`` (a result's effective config)."""
        if self.ray_variance is None:
            return {"noise_model": "gaussian"}
        v = self.ray_variance.double()
        return {"noise_model": self.kind, "noise_scale": "known" if self.known else "learned",
                "ray_variance_range": [float(v.min()), float(v.max())]}

    @classmethod
    def for_data(cls, sinogram: Sinogram, y: torch.Tensor, noise_std: float | None = None
                 ) -> "NoiseModel":
        """The settings' ``noise_std``, else the file's, else estimated from ``y``."""
        from ctuq.recon.baselines import estimate_noise_std

        if noise_std is not None:
            return cls(float(noise_std), True)
        known = sinogram.noise_std  # validated: a positive finite number or None
        if known is not None:
            return cls(float(known), True)
        return cls(float(estimate_noise_std(y)), False)

    @classmethod
    def for_config(cls, sinogram: Sinogram, y: torch.Tensor, config,
                   noise_std: float | None = None) -> "NoiseModel":
        """The noise model ``config.noise_model`` asks for, for the 2-D slice ``sinogram``.

        ``'gaussian'`` (and ``'auto'`` without per-ray variances):
        :meth:`for_data`. ``'counts'`` (and ``'auto'`` with them): ``σ²`` the
        mean of :attr:`Sinogram.variance` (the settings' ``noise_std``, when
        given, replaces it), ``v`` the variances over that mean; ``known``
        unless ``config.counts_scale`` is ``'learned'``. ``noise_std``: the
        settings' noise std in the units of ``y`` (default ``config.noise_std``;
        the normalised problem passes it divided by the data scale).

        Raises
        ------
        InputError
            ``'counts'`` for data without per-ray variances (not derived from
            counts with flat frames), naming the file and ``noise_model``.
        """
        from ctuq.errors import InputError

        name = config.noise_model
        var = sinogram.variance
        given = config.noise_std if noise_std is None else noise_std
        if name == "gaussian" or (name == "auto" and var is None):
            return cls.for_data(sinogram, y, given)
        if var is None:
            raise InputError("the count noise model needs line integrals derived from photon "
                             "counts with flat frames (raw NXtomo or DXchange data); these "
                             "data carry no per-ray variance: use noise_model = 'gaussian' or "
                             "'auto'", file=sinogram.meta.get("source"), field="noise_model")
        var = torch.as_tensor(var, dtype=torch.float64)
        mean = float(var.mean())
        sigma = float(given) if given is not None else mean ** 0.5
        known = given is not None or config.counts_scale == "known"
        v = (var / mean).to(torch.float32).reshape(y.shape).to(y.device)
        return cls(sigma, known, v, "counts")


@dataclass
class ReconstructionProblem:
    """A 2-D reconstruction to solve, with its resolved settings.

    Attributes
    ----------
    sinogram : Sinogram
        One slice (``data`` ``(n_angles, n_detector)``, geometry, metadata,
        optional ground truth).
    op : RayTransform
        The ray transform of its geometry, on :attr:`device`.
    y : Tensor, shape (n_angles, n_detector)
        The data, float32 on :attr:`device`.
    noise : NoiseModel
    preset : str
        The U-net preset the settings were resolved for.
    config : ReconstructionConfig
        What the user asked for.
    dip : DIPConfig
        The resolved DIP settings (the method's :meth:`adapt_dip` applied).
    uncertainty : UncertaintyConfig
        The resolved uncertainty settings.
    device : torch.device
    scale : float
        The data scale ``s`` (:mod:`ctuq.recon.scaling`): ``sinogram``, ``y``,
        ``noise`` and the ground truth are the data divided by ``s``. Default 1.
    data_sinogram : Sinogram or None
        The slice as given, in data units, when normalised (else None).
    data_dip : DIPConfig or None
        The DIP settings as resolved in data units, when normalised (else None).
    """

    sinogram: Sinogram
    op: RayTransform
    y: torch.Tensor
    noise: NoiseModel
    preset: str
    config: object
    dip: object
    uncertainty: object
    device: torch.device
    scale: float = 1.0
    data_sinogram: Sinogram | None = None
    data_dip: object = None

    @property
    def seed(self) -> int:
        return int(self.config.seed)

    @property
    def geometry(self):
        return self.sinogram.geometry

    @classmethod
    def from_sinogram(cls, sinogram: Sinogram, config, method=None) -> "ReconstructionProblem":
        """Resolve ``config`` for the slice ``sinogram`` (a 2-D one).

        Data whose FBP is mostly negative are refused
        (:func:`~ctuq.recon.scaling.check_representable`). With
        ``config.normalize``, the problem holds the data divided by their
        scale ``s`` (:func:`~ctuq.recon.scaling.data_scale`) and the settings
        that carry the data's unit divided accordingly
        (:func:`~ctuq.recon.scaling.scaled_settings`).

        Parameters
        ----------
        sinogram : Sinogram
        config : ReconstructionConfig
        method : UncertaintyMethod, optional
            Its :meth:`~ctuq.recon.methods.base.UncertaintyMethod.adapt_dip`
            is applied to the DIP settings.

        Raises
        ------
        InputError
            ``field='sinogram'``: the data's FBP is mostly negative, or their
            scale is not a positive finite number.
        """
        from ctuq.recon.dip import resolve_device
        from ctuq.recon.scaling import (check_representable, data_scale, normalized_sinogram,
                                        scaled_settings)

        geometry = sinogram.geometry
        dip_cfg, unc = config.resolve(geometry.image_shape)
        if method is None:
            method = unc.make_method()
        device = resolve_device(config.device)
        op = RayTransform(geometry, backend=config.backend, device=device)
        y = torch.as_tensor(sinogram.data, dtype=torch.float32, device=device)
        src = sinogram.meta.get("source")
        check_representable(y, op, file=src)
        dip_cfg = method.adapt_dip(dip_cfg)
        noise_std, scale, original, data_dip = config.noise_std, 1.0, None, None
        if config.normalize:
            scale = data_scale(y, op)
            if not (scale > 0 and math.isfinite(scale)):
                raise InputError(f"the data have no usable scale (s = {scale:.3g}): their "
                                 "filtered back-projection has no positive high values",
                                 field="sinogram", file=src)
            original, data_dip = sinogram, dip_cfg
            sinogram = normalized_sinogram(sinogram, scale)
            noise_std, dip_cfg = scaled_settings(noise_std, dip_cfg, scale)
            y = torch.as_tensor(sinogram.data, dtype=torch.float32, device=device)
        return cls(sinogram=sinogram, op=op, y=y,
                   noise=NoiseModel.for_config(sinogram, y, config, noise_std),
                   preset=config.preset_for(geometry.image_shape), config=config,
                   dip=dip_cfg, uncertainty=unc, device=device, scale=scale,
                   data_sinogram=original, data_dip=data_dip)
