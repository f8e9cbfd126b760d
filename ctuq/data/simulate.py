"""Simulated measurements: noisy sinograms from an image and a ray transform.

Two noise models:

- ``'gaussian'`` (default, the papers' setting): white Gaussian noise with
  std = ``noise_level`` × mean |A x|;
- ``'poisson'``: photon counts ``N ~ Poisson(I0 · exp(-μ A x))`` turned back
  into line integrals ``-log(max(N, 1) / I0) / μ``. ``μ`` scales the largest
  line integral of the clean sinogram to ``max_attenuation`` (default 3, i.e.
  5 % transmission along the most attenuating ray), so that ``I0`` alone sets
  the dose.

All draws come from a seeded CPU ``torch.Generator``, so a seed gives the
same sinogram on every device.

Realistic scans, without the "inverse crime" of this module's simulation:
:mod:`ctuq.data.realistic`.
"""

from __future__ import annotations

import math

import torch

from ctuq.errors import InputError


def simulate_sinogram(image, op, noise_level: float = 0.05, seed: int = 0, *,
                      noise: str = "gaussian", photons: float = 1e4,
                      max_attenuation: float = 3.0) -> tuple[torch.Tensor, float]:
    """Project an image and add noise.

    Parameters
    ----------
    image : array_like or Tensor, shape (..., n0, n1)
        The ground truth, in attenuation units per mm.
    op : RayTransform
        The forward operator (its device is used).
    noise_level : float, optional
        Gaussian noise std relative to mean |A x|. Default 0.05 (5 %).
    seed : int, optional
        Seed of the noise. Default 0.
    noise : {'gaussian', 'poisson'}, optional
        Noise model. Default ``'gaussian'``.
    photons : float, optional
        Incident photons per detector pixel ``I0`` for Poisson noise. Default 1e4.
    max_attenuation : float, optional
        ``μ · max(A x)`` for Poisson noise. Default 3.

    Returns
    -------
    y : Tensor, shape (..., n_angles, n_detector)
        Noisy sinogram, float32, on the operator's device.
    noise_std : float
        The std of the Gaussian noise; for Poisson noise, the root mean
        square of the per-ray std (a first-order estimate).

    Examples
    --------
    >>> from ctuq.data.geometry import Geometry
    >>> from ctuq.data.operators import RayTransform
    >>> from ctuq.data.phantoms import shepp_logan
    >>> op = RayTransform(Geometry.parallel(32, 20))
    >>> y, sigma = simulate_sinogram(shepp_logan(32), op, 0.05, seed=1)
    >>> tuple(y.shape)
    (20, 46)
    """
    if not (math.isfinite(noise_level) and noise_level >= 0):
        raise InputError(f"must be >= 0, got {noise_level!r}", field="noise_level")
    x = torch.as_tensor(image, dtype=torch.float32, device=op.device)
    with torch.no_grad():
        clean = op.A(x)
    gen = torch.Generator().manual_seed(int(seed))
    if noise == "gaussian":
        sigma = float(noise_level * clean.abs().mean())
        eps = torch.randn(clean.shape, generator=gen).to(clean.device)
        return clean + sigma * eps, sigma
    if noise == "poisson":
        if not photons > 0:
            raise InputError(f"must be > 0, got {photons!r}", field="photons")
        peak = float(clean.max())
        mu = max_attenuation / peak if peak > 0 else 1.0
        rate = photons * torch.exp(-mu * clean.cpu().double())
        counts = torch.poisson(rate, generator=gen).clamp_min(1.0)
        y = (-torch.log(counts / photons) / mu).float().to(clean.device)
        # Var[-log(N/I0)/mu] ~= 1 / (mu^2 I0 e^{-mu p}) to first order
        sigma = float(torch.sqrt((1.0 / (mu**2 * rate)).mean()))
        return y, sigma
    raise InputError(f"must be 'gaussian' or 'poisson', got {noise!r}", field="noise")
