"""Edge features of an image: where a DIP+TV fit puts its own error (docs/method.md §8.2)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ctuq.errors import InputError

__all__ = ["edge_strength", "edge_mask", "neighbour_difference"]


def _img(x) -> Tensor:
    t = torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x)
    if t.ndim != 2:
        raise InputError(f"expected an image (H, W), got shape {tuple(t.shape)}", field="image")
    return t.double()


def neighbour_difference(x) -> Tensor:
    """``max_j |x_i − x_j|`` over the 4-neighbours ``j`` of every pixel, ``(H, W)`` float64."""
    x = _img(x)
    d = torch.zeros_like(x)
    a, b = (x[1:] - x[:-1]).abs(), (x[:, 1:] - x[:, :-1]).abs()
    d[:-1] = torch.maximum(d[:-1], a)
    d[1:] = torch.maximum(d[1:], a)
    d[:, :-1] = torch.maximum(d[:, :-1], b)
    d[:, 1:] = torch.maximum(d[:, 1:], b)
    return d


def edge_strength(x) -> Tensor:
    """The edge feature ``e(x)``: the largest neighbour difference within one pixel.

    :func:`neighbour_difference` followed by a 3×3 maximum filter, so that
    the pixels on both sides of an edge and their neighbours (where a blurred
    edge puts its error) get the edge's height.

    Parameters
    ----------
    x : array or Tensor, shape (H, W)

    Returns
    -------
    Tensor, shape (H, W), float64
        In the unit of ``x``.
    """
    d = neighbour_difference(x)
    return F.max_pool2d(d[None, None], 3, stride=1, padding=1)[0, 0]


def edge_mask(truth, threshold: float = 0.1) -> Tensor:
    """Pixels within one pixel of an edge of ``truth``, ``(H, W)`` bool.

    An edge is a neighbour difference above ``threshold`` times the truth's
    range; the mask is that set dilated by a 3×3 square (the metric
    "coverage on edges" of the benchmarks).
    """
    t = _img(truth)
    rng = float(t.max() - t.min())
    e = neighbour_difference(t) > threshold * rng if rng > 0 else torch.zeros_like(t, dtype=bool)
    return F.max_pool2d(e[None, None].double(), 3, stride=1, padding=1)[0, 0] > 0


