"""Small image classifiers for the classification benchmark (docs/method.md §11).

Both output **logits** ``[N, C]`` for images ``[N, 1, H, W]`` and group their
layers into prior blocks with :meth:`blocks` (one block per layer: its weight
and bias), which :class:`ctuq.posterior.linearize.Linearization` uses with
``param_filter='all'`` for layer-wise ARD priors.

- :class:`MLP`: flatten → ``[Linear → ReLU → Dropout?]`` per hidden layer → Linear.
- :class:`SmallCNN`: ``[Conv3×3 (padding 1) → ReLU → MaxPool2 → Dropout2d?]`` per
  conv layer → flatten → Linear. For 8×8 digits with the default channels
  ``(8, 16)``: 1,898 parameters; for 28×28: 8,714.

Dropout (``dropout > 0``) is the MC-dropout baseline's; the MAP and Laplace
models use ``dropout=0``.

Examples
--------
>>> import torch
>>> net = build_classifier("mlp", (1, 8, 8), 10, hidden=(32,))
>>> tuple(net(torch.zeros(5, 1, 8, 8)).shape), list(net.blocks())
((5, 10), ['fc_0', 'out'])
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import Tensor, nn

from ctuq.errors import InputError

__all__ = ["MLP", "SmallCNN", "build_classifier", "CLASSIFIERS"]

#: Names accepted by :func:`build_classifier`.
CLASSIFIERS = ("mlp", "cnn")


def _check_dropout(p: float) -> float:
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise InputError(f"must be in [0, 1), got {p!r}", field="dropout")
    return p


class MLP(nn.Module):
    """Fully connected classifier.

    Parameters
    ----------
    in_shape : tuple of int
        ``(1, H, W)`` (any shape; flattened).
    num_classes : int
    hidden : sequence of int, optional
        Widths of the hidden layers. Default ``(32,)``.
    dropout : float, optional
        Dropout probability after every hidden activation. Default 0.
    """

    def __init__(self, in_shape, num_classes: int, hidden=(32,), dropout: float = 0.0):
        super().__init__()
        d_in = math.prod(in_shape)
        if num_classes < 2 or any(int(h) < 1 for h in hidden):
            raise InputError(f"need >= 2 classes and positive widths, got {num_classes} and "
                             f"{tuple(hidden)}", field="hidden")
        self.dropout = _check_dropout(dropout)
        widths = [d_in, *[int(h) for h in hidden]]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.out = nn.Linear(widths[-1], int(num_classes))
        self.drop = nn.Dropout(self.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = x.flatten(1)
        for layer in self.hidden:
            h = self.drop(torch.relu(layer(h)))
        return self.out(h)

    def blocks(self) -> "OrderedDict[str, list[tuple[str, nn.Module]]]":
        """Prior blocks ``fc_0 … fc_{L-1}, out`` → ``[(weight name, module)]``."""
        out = OrderedDict((f"fc_{i}", [(f"hidden.{i}.weight", m)])
                          for i, m in enumerate(self.hidden))
        out["out"] = [("out.weight", self.out)]
        return out


class SmallCNN(nn.Module):
    """Convolutional classifier: 3×3 convs with max-pooling, then one linear layer.

    Parameters
    ----------
    in_shape : tuple of int
        ``(1, H, W)`` with ``H`` and ``W`` divisible by ``2**len(channels)``.
    num_classes : int
    channels : sequence of int, optional
        Output channels of the conv layers. Default ``(8, 16)``.
    dropout : float, optional
        ``Dropout2d`` probability after every pooled conv layer. Default 0.
    """

    def __init__(self, in_shape, num_classes: int, channels=(8, 16), dropout: float = 0.0):
        super().__init__()
        c, h, w = (tuple(in_shape) if len(in_shape) == 3 else (1, *in_shape))
        n = len(channels)
        if n < 1 or h % 2 ** n or w % 2 ** n:
            raise InputError(f"image {h}x{w} is not divisible by 2^{n} (one pooling per conv "
                             "layer)", field="channels")
        self.dropout = _check_dropout(dropout)
        widths = [c, *[int(k) for k in channels]]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1)
                                   for a, b in zip(widths[:-1], widths[1:]))
        self.out = nn.Linear(widths[-1] * (h // 2 ** n) * (w // 2 ** n), int(num_classes))
        self.drop = nn.Dropout2d(self.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for conv in self.convs:
            h = self.drop(nn.functional.max_pool2d(torch.relu(conv(h)), 2))
        return self.out(h.flatten(1))

    def blocks(self) -> "OrderedDict[str, list[tuple[str, nn.Module]]]":
        """Prior blocks ``conv_0 … conv_{L-1}, out`` → ``[(weight name, module)]``."""
        out = OrderedDict((f"conv_{i}", [(f"convs.{i}.weight", m)])
                          for i, m in enumerate(self.convs))
        out["out"] = [("out.weight", self.out)]
        return out


def build_classifier(kind: str, in_shape, num_classes: int, *, hidden=(32,),
                     channels=(8, 16), dropout: float = 0.0, seed: int | None = None
                     ) -> nn.Module:
    """An :class:`MLP` or :class:`SmallCNN` (initialised from ``seed`` when given).

    Parameters
    ----------
    kind : {'mlp', 'cnn'}
    in_shape : tuple of int
        ``(1, H, W)``.
    num_classes : int
    hidden : sequence of int, optional
        MLP widths. Default ``(32,)``.
    channels : sequence of int, optional
        CNN channels. Default ``(8, 16)``.
    dropout : float, optional
        Default 0.
    seed : int, optional
        Seeds PyTorch's default initialisation (through a forked RNG state).
    """
    if kind not in CLASSIFIERS:
        raise InputError(f"must be one of {', '.join(CLASSIFIERS)}, got {kind!r}",
                         field="model")
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(int(seed))
        if kind == "mlp":
            return MLP(in_shape, num_classes, hidden, dropout)
        return SmallCNN(in_shape, num_classes, channels, dropout)
