"""A small seeded CT problem for tests, benchmarks and examples.

``toy_problem()`` simulates a phantom's scan and fits a small U-net by a few
Adam steps: enough for the linearisation and sampling maths, which do not
need a good fit. The sampling benchmark and the tests use it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from ctuq.posterior import Linearization
from ctuq.recon.dip import dip_tv_loss

__all__ = ["ToyProblem", "toy_problem"]


@dataclass
class ToyProblem:
    """A simulated CT problem with a (briefly) fitted U-net.

    Attributes
    ----------
    op : RayTransform
    truth : Tensor, shape (H, W)
    y : Tensor, shape (n_angles, n_det)
    noise_std : float
        ``σ`` of the simulated Gaussian noise.
    model : UNet
        Fitted, eval mode.
    net_input : Tensor, shape (1, 1, H, W)
    fit_time : float
        Seconds spent fitting.
    """

    op: object
    truth: Tensor
    y: Tensor
    noise_std: float
    model: torch.nn.Module
    net_input: Tensor
    fit_time: float

    def linearization(self, **kwargs) -> Linearization:
        """A fresh :class:`Linearization` of the fitted model."""
        return Linearization(self.model, self.net_input, **kwargs)


@functools.lru_cache(maxsize=4)
def toy_problem(size: int = 28, n_angles: int = 20, *, unet="reference-28",
                channels: tuple[int, ...] | None = (4, 4, 4), fit_steps: int = 200,
                lr: float = 5e-3, tv_weight: float = 0.5, noise_level: float = 0.05,
                phantom: str | None = None, seed: int = 0, device="cpu",
                threads: int | None = 1) -> ToyProblem:
    """A small seeded CT problem: phantom, noisy sinogram, U-net fitted by a few Adam steps.

    The fit (Adam on ``‖A f(θ) − y‖² + γ TV(f(θ))`` from the FBP input,
    ``fit_steps`` steps) is deliberately short: the linearisation maths does
    not need a good fit. Results are cached per argument tuple (the same
    objects come back: do not modify them).

    Parameters
    ----------
    size, n_angles : int
        Image side and number of parallel-beam angles. Defaults 28, 20.
    unet : str
        U-net preset. Default ``'reference-28'``.
    channels : tuple of int or None
        Override of the preset's widths (default ``(4, 4, 4)``: 1,512 conv
        weights, so the dense oracle is cheap); None keeps the preset's.
    fit_steps, lr, tv_weight : optional
        Adam steps (default 200), learning rate (5e-3), TV weight γ (0.5).
    noise_level : float
        Noise std relative to mean |A x|. Default 0.05.
    phantom : str or None
        ``'digits'``, ``'shepp'``, ``'ellipses'``…; None: digits for sizes
        ≤ 32, else ellipses.
    seed : int
    device : str
    threads : int or None
        CPU threads for the fit (restored afterwards). Default 1: a 28² fit
        gains nothing from more, and on a busy machine oversubscribed
        threads make it up to 40× slower (measured). None: leave as is.
    """
    import time

    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import make_phantom
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.models.unet import build_unet

    t0 = time.perf_counter()
    device = torch.device(device)
    op = RayTransform(Geometry.parallel(size, n_angles), backend="matrix", device=device)
    name = phantom or ("digits" if size <= 32 else "ellipses")
    truth = torch.as_tensor(make_phantom(name, size, seed), dtype=torch.float32).to(device)
    y, noise_std = simulate_sinogram(truth, op, noise_level, seed=seed + 1)
    overrides = {} if channels is None else {"channels": tuple(channels)}
    model = build_unet(unet, seed=seed, device=device, **overrides)
    net_input = op.fbp(y).reshape(1, 1, size, size).float().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    old_threads = torch.get_num_threads()
    if threads is not None and device.type == "cpu":
        torch.set_num_threads(int(threads))
    try:
        _fit(model, net_input, op, y, opt, int(fit_steps), float(tv_weight))
    finally:
        torch.set_num_threads(old_threads)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return ToyProblem(op, truth, y, float(noise_std), model, net_input.detach(),
                      time.perf_counter() - t0)


def _fit(model, net_input, op, y, opt, steps: int, tv_weight: float) -> None:
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = dip_tv_loss(model(net_input)[0, 0], y, op, tv_weight)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
