"""Anderson acceleration of a fixed-point iteration ``x ← F(x)`` (docs/method.md §6.3).

The EM's hyperparameter loop is such an iteration, in the log-hyperparameters,
and every evaluation of ``F`` is an E-step (the expensive part of the
uncertainty). Near its fixed point ``F`` is close to linear, ``F(x) ≈ x* +
M (x − x*)``: the plain iteration converges at the rate of ``M``'s largest
eigenvalue (≈ 0.5 per step on realistic 64² scans) and rings where an
eigenvalue is negative. Anderson's mixing (type II, Walker & Ni 2011) takes
the combination of the last few iterates whose residuals ``g = F(x) − x``
cancel best; for a linear ``F`` in ``n ≤ depth`` dimensions it reaches the
fixed point after about ``n + 1`` evaluations (it is GMRES on ``(M − I) x = …``).

>>> import torch
>>> M = torch.tensor([[0.5, 0.2], [0.0, -0.8]], dtype=torch.float64)
>>> F = lambda x: M @ x + 1.0
>>> mix, x = AndersonMixer(depth=2, linear_below=10), torch.zeros(2, dtype=torch.float64)
>>> for _ in range(4):
...     x = mix.step(x, F(x))
>>> bool(torch.allclose(F(x), x, atol=1e-10))
True
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["AndersonMixer"]


class AndersonMixer:
    """Anderson mixing of depth ``depth`` with a bounded step.

    Parameters
    ----------
    depth : int
        How many earlier residual differences are combined (``0``: the plain
        iteration). Default 2.
    max_step : float
        Largest change of one coordinate beyond the plain step ``F(x)``;
        a larger mixed step is scaled back to it (in the EM: log units, so
        2.0 is a factor e²). Default 2.0.
    restart : float
        Drop the history when a residual's norm exceeds this × the previous
        one's (see Notes). Default 2.0.
    linear_below : float
        Mix only residuals whose largest coordinate is below this: farther
        from the fixed point the map is not near-linear (the EM's first
        steps move ``σ²`` by factors of 10–50) and the history is dropped.
        Default 0.5.

    Notes
    -----
    A residual that grew by more than ``restart`` × means the map is not
    near-linear there, or the mixing overshot: the history restarts from it and the
    plain step is taken.
    """

    def __init__(self, depth: int = 2, max_step: float = 2.0, restart: float = 2.0,
                 linear_below: float = 0.5):
        self.depth = int(depth)
        self.linear_below = float(linear_below)
        self.max_step = float(max_step)
        self.restart = float(restart)
        self._x: list[Tensor] = []
        self._g: list[Tensor] = []
        self.mixed = False  # whether the last step was a mixed one

    def reset(self) -> None:
        self._x, self._g = [], []

    def step(self, x: Tensor, fx: Tensor) -> Tensor:
        """The next iterate from ``x`` and ``F(x)`` (1-D tensors of one length)."""
        x = x.detach().double().reshape(-1)
        g = fx.detach().double().reshape(-1) - x
        if self._g and (self._g[-1].shape != g.shape or
                        float(g.norm()) > self.restart * float(self._g[-1].norm())):
            self.reset()
        self._x.append(x)
        self._g.append(g)
        del self._x[:-(self.depth + 1)], self._g[:-(self.depth + 1)]
        self.mixed = False
        plain = x + g
        if float(g.abs().max()) >= self.linear_below:
            self.reset()
            return plain
        if len(self._g) < 2:
            return plain
        dG = torch.stack([b - a for a, b in zip(self._g[:-1], self._g[1:])], 1)
        dX = torch.stack([b - a for a, b in zip(self._x[:-1], self._x[1:])], 1)
        # least squares min ‖g − ΔG γ‖, lightly regularised (near-collinear differences)
        lam = 1e-10 * float(dG.square().sum()) + 1e-300
        gamma = torch.linalg.solve(dG.T @ dG + lam * torch.eye(dG.shape[1], dtype=dG.dtype),
                                   dG.T @ g)
        mixed = plain - (dX + dG) @ gamma
        if not bool(torch.isfinite(mixed).all()):
            self.reset()
            return plain
        extra = mixed - plain
        big = float(extra.abs().max())
        if big > self.max_step:
            mixed = plain + extra * (self.max_step / big)
        self.mixed = True
        return mixed
