"""A model's weights and gradients as views into two contiguous buffers.

The U-nets of the DIP presets are small (30,509 weights in 72 tensors at 64²), so
on the CPU a training step pays for every weight tensor a few small kernels: Adam's
update (torch's ``foreach`` ops fall back to a loop over the tensors on the CPU),
the gradient clipping and the copy of the best iterate. Over one buffer each of
those is one kernel: a 64² DIP step 1.29× faster on two CPU threads
(docs/speed.md). The numbers stay the same bit for bit: Adam's
update is elementwise, and the clipping norm is still taken tensor by tensor, as
:func:`torch.nn.utils.clip_grad_norm_` takes it.

Examples
--------
>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
>>> flat = FlatParameters(model)
>>> flat.weights.shape
torch.Size([21])
>>> opt = torch.optim.Adam(flat.parameters(), lr=0.1)
>>> flat.zero_grad()
>>> model(torch.ones(2, 3)).sum().backward()
>>> total = flat.clip_grad_norm_(1.0)
>>> opt.step()
>>> flat.release()  # the model's weights are independent tensors again
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["FlatParameters"]


class FlatParameters:
    """Every parameter of ``model`` made a view into :attr:`weights`, its gradient a
    view into :attr:`grads` (both 1-D, in ``model.parameters()`` order).

    Parameters
    ----------
    model : torch.nn.Module
        Its parameters must share one dtype and device and all require gradients.

    Notes
    -----
    Autograd accumulates into the gradient views in place, so the gradients are
    zeroed (:meth:`zero_grad`), not set to None. Call :meth:`release` when the
    training loop ends: the parameters become independent tensors again and
    their gradients None.
    """

    def __init__(self, model: nn.Module):
        self.names = [name for name, _ in model.named_parameters()]
        self.params = [p for _, p in model.named_parameters()]
        if not self.params:
            raise ValueError("the model has no parameters")
        first = self.params[0]
        if any(p.dtype != first.dtype or p.device != first.device or not p.requires_grad
               for p in self.params):
            raise ValueError("flat parameters need one dtype, one device and trainable "
                             "parameters throughout")
        n = sum(p.numel() for p in self.params)
        self.weights = torch.empty(n, dtype=first.dtype, device=first.device)
        self.grads = torch.zeros_like(self.weights)
        self._views = []  # (offset, shape) of each parameter
        offset = 0
        with torch.no_grad():
            for p in self.params:
                k = p.numel()
                self.weights[offset: offset + k].copy_(p.reshape(-1))
                p.data = self.weights[offset: offset + k].view(p.shape)
                p.grad = self.grads[offset: offset + k].view(p.shape)
                self._views.append((offset, p.shape))
                offset += k
        self._flat = nn.Parameter(self.weights)  # shares the buffer
        self._flat.grad = self.grads

    def parameters(self) -> list[nn.Parameter]:
        """The one parameter an optimiser should update (all weights, one tensor)."""
        return [self._flat]

    def zero_grad(self) -> None:
        self.grads.zero_()

    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """Scale the gradients as :func:`torch.nn.utils.clip_grad_norm_` does; return
        the total norm (before scaling)."""
        grads = [p.grad for p in self.params]
        get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)
        if get_total_norm is None:  # torch < 2.6: the library's own call, tensor by tensor
            return torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        total = get_total_norm(grads, 2.0)
        self.grads.mul_(torch.clamp(float(max_norm) / (total + 1e-6), max=1.0))
        return total

    def state_dict(self, weights: Tensor | None = None) -> dict[str, Tensor]:
        """``{name: tensor}`` of the parameters in ``weights`` (default: the current
        ones), as independent tensors."""
        weights = self.weights if weights is None else weights
        return {name: weights[offset: offset + shape.numel()].view(shape).clone()
                for name, (offset, shape) in zip(self.names, self._views)}

    def release(self) -> None:
        """Make the parameters independent tensors again (their current values), with
        no gradient."""
        with torch.no_grad():
            for p in self.params:
                p.data = p.data.clone()
                p.grad = None
