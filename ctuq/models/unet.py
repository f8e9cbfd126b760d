"""The deep-image-prior U-net.

A small U-net after the one of the reference implementations (``dival`` /
``bayes_dip``, Baguer et al. 2020): 3×3 convolutions with LeakyReLU(0.2),
stride-2 convolutions to go down a scale, bilinear up-sampling to go up, thin
1×1 skip convolutions, and a 1×1 output convolution with an optional sigmoid.

Layout, for ``S`` scales with widths ``channels[0..S-1]``::

    inc      3×3 conv  in_ch → c0                        (scale 0)
    down_i   3×3 conv stride 2, 3×3 conv   c_i → c_{i+1}  (scale i → i+1)
    skip_i   1×1 conv  c_{S-2-i} → skip_channels[S-1-i]   (skip of up_i)
    up_i     bilinear ×2, concat skip_i, 3×3 conv, 3×3 conv
             c_{S-1-i} (+ skip) → c_{S-2-i}               (scale S-1-i → S-2-i)
    out      1×1 conv  c0 → out_ch  (+ sigmoid)

Every 3×3 conv is followed by (optional) ``Dropout2d``, (optional)
``GroupNorm`` and ``LeakyReLU(0.2)``. ``skip_channels`` is indexed as in the
reference code: ``up_i`` uses ``skip_channels[S-1-i]``, so ``skip_channels[0]``
is never used. With ``skip_channels[k] == 0`` the up block has no skip path
at all (the reference instead concatenates one all-zero channel, which only
adds dead weights). The ``reference-28`` preset (3 scales, 32 channels,
skip ``[0, 4, 4]``, sigmoid, no norm) has exactly 76,905 parameters, the
count of the reference network.

The prior of the linearised model is defined per block: :meth:`UNet.blocks`
returns the ordered mapping block name → list of ``(parameter name, conv)``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctuq.errors import InputError

__all__ = [
    "UNetConfig",
    "UNet",
    "PRESETS",
    "unet_preset",
    "build_unet",
    "count_parameters",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UNetConfig:
    """Architecture of a :class:`UNet`.

    Parameters
    ----------
    scales : int
        Number of scales (resolution levels), 1 to 8. Default 3.
    channels : tuple of int
        Width of each scale, length ``scales``. Default ``(32, 32, 32)``.
    skip_channels : tuple of int
        Width of the skip connections, length ``scales``, indexed as in the
        reference code: the up block leaving scale ``k`` (``k >= 1``) uses
        ``skip_channels[k]``; entry 0 is unused. 0 means no skip.
        Default ``(0, 4, 4)``.
    use_sigmoid : bool
        Sigmoid on the output (images in ``[0, 1]``). Default True.
    use_norm : bool
        GroupNorm after every convolution (group counts as in the reference:
        4 in down blocks, 2 in the in/up blocks, 1 on the concatenated up
        input and the skips). Default False.
    dropout : float
        ``Dropout2d`` probability after every 3×3 convolution (MC dropout).
        Default 0 (no dropout layers have any effect).
    in_channels, out_channels : int
        Default 1 each.
    sigmoid_saturation : float or None
        With a sigmoid, the pre-sigmoid activation is clamped to
        ``±sigmoid_saturation`` (reference: 9) so that the output never
        saturates numerically. Unlike the reference, the clamp passes the
        gradient straight through (a network that saturates every pixel
        can recover). None disables the clamp. Default 9.

    Examples
    --------
    >>> cfg = UNetConfig()
    >>> count_parameters(UNet(cfg))
    76905
    """

    scales: int = 3
    channels: tuple[int, ...] = (32, 32, 32)
    skip_channels: tuple[int, ...] = (0, 4, 4)
    use_sigmoid: bool = True
    use_norm: bool = False
    dropout: float = 0.0
    in_channels: int = 1
    out_channels: int = 1
    sigmoid_saturation: float | None = 9.0

    def __post_init__(self):
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        object.__setattr__(self, "skip_channels", tuple(int(c) for c in self.skip_channels))
        if not 1 <= int(self.scales) <= 8:
            raise InputError(f"must be between 1 and 8, got {self.scales}", field="scales")
        if len(self.channels) != self.scales:
            raise InputError(
                f"needs one width per scale ({self.scales}), got {len(self.channels)}",
                field="channels")
        if len(self.skip_channels) != self.scales:
            raise InputError(
                f"needs one entry per scale ({self.scales}), got {len(self.skip_channels)}",
                field="skip_channels")
        if any(c < 1 for c in self.channels):
            raise InputError("widths must be positive", field="channels")
        if any(c < 0 for c in self.skip_channels):
            raise InputError("must be non-negative", field="skip_channels")
        if self.use_norm and any(c % 4 for c in self.channels[1:]) or (
                self.use_norm and any(c % 2 for c in self.channels)):
            raise InputError("with use_norm, widths must be even (multiples of 4 below "
                             "scale 0) for GroupNorm", field="channels")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise InputError(f"must be in [0, 1), got {self.dropout}", field="dropout")

    def to_dict(self) -> dict:
        """Plain-dict form (JSON / TOML friendly)."""
        d = asdict(self)
        d["channels"] = list(self.channels)
        d["skip_channels"] = list(self.skip_channels)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "UNetConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`InputError`."""
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise InputError(f"unknown U-net option(s) {sorted(extra)}", field="unet")
        return cls(**d)

    def with_(self, **changes) -> "UNetConfig":
        """A copy with some fields changed (e.g. ``dropout=0.05``)."""
        return replace(self, **changes)


# --------------------------------------------------------------------------
# building blocks


class GroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` whose CUDA forward in training mode is written with ``var_mean``.

    The U-net uses 1–4 groups; in the DIP fit (batch 1) PyTorch's CUDA
    GroupNorm kernel reduces each of its 1–4 (sample, group) rows of
    ``C/G · H · W`` elements in one thread block and the card idles (half
    the GPU time of a 256² DIP iteration, docs/scaling.md §5); ``var_mean``
    splits those reductions across the card. The linearised network is in
    eval mode and keeps the library kernel: there ``vmap`` folds the batch of
    tangents into the rows, and the kernel's own forward-mode rule was 20 %
    faster for the Jacobian products (docs/scaling.md §5). The two are the
    same function; the mode only picks the kernel. Same parameters and
    state-dict keys; on the CPU always the library kernel (bit-identical
    results there).
    """

    def forward(self, x: Tensor) -> Tensor:
        if not (x.is_cuda and self.training):
            return super().forward(x)
        return group_norm_var_mean(x, self.num_groups, self.weight, self.bias, self.eps)


def group_norm_var_mean(x: Tensor, num_groups: int, weight: Tensor | None = None,
                        bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """``F.group_norm`` from ``torch.var_mean`` (the CUDA path of :class:`GroupNorm`).

    ``x`` ``[N, C, ...]``, ``weight`` and ``bias`` ``[C]`` or None; returns
    ``x``'s shape. Differentiable in both AD modes.
    """
    n, c = x.shape[:2]
    groups = x.reshape(n, num_groups, -1)
    var, mean = torch.var_mean(groups, dim=-1, unbiased=False, keepdim=True)
    out = ((groups - mean) * torch.rsqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


class ConvUnit(nn.Module):
    """3×3 (or 1×1) conv → optional Dropout2d → optional GroupNorm → LeakyReLU(0.2).

    Shapes: ``[B, cin, H, W] → [B, cout, H', W']`` with ``H' = ceil(H/stride)``.
    """

    def __init__(self, cin: int, cout: int, *, kernel_size: int = 3, stride: int = 1,
                 norm_groups: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride=stride,
                              padding=(kernel_size - 1) // 2)
        self.drop = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.norm = (GroupNorm(num_groups=norm_groups, num_channels=cout)
                     if norm_groups else nn.Identity())
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.norm(self.drop(self.conv(x))))


class UpBlock(nn.Module):
    """Bilinear ×2 up-sampling, concatenation with a 1×1-conv skip, two 3×3 convs.

    ``forward(x, skip)``: ``x`` ``[B, cin, h, w]``, ``skip`` ``[B, cskip_in, H, W]``
    (``H ≈ 2h``) → ``[B, cout, H, W]``. The up-sampled tensor is resized to
    the skip's exact size, so odd image sizes work.
    """

    def __init__(self, cin: int, cout: int, skip_in: int, skip_ch: int, *,
                 use_norm: bool, dropout: float):
        super().__init__()
        self.skip_ch = skip_ch
        self.skip = (ConvUnit(skip_in, skip_ch, kernel_size=1,
                              norm_groups=1 if use_norm else None)
                     if skip_ch > 0 else None)
        self.norm_in = (GroupNorm(1, cin + skip_ch) if use_norm else nn.Identity())
        self.conv = nn.Sequential(
            ConvUnit(cin + skip_ch, cout, norm_groups=2 if use_norm else None, dropout=dropout),
            ConvUnit(cout, cout, norm_groups=2 if use_norm else None, dropout=dropout),
        )

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=True)
        if self.skip is not None:
            x = torch.cat([x, self.skip(skip)], dim=1)
        return self.conv(self.norm_in(x))


class UNet(nn.Module):
    """The DIP U-net (see the module docstring for the layout).

    Parameters
    ----------
    config : UNetConfig, optional
        Architecture; default the reference 28×28 network.
    **overrides
        Fields of :class:`UNetConfig` to change, e.g. ``dropout=0.05``.

    Shapes
    ------
    ``forward(x)``: ``[B, in_channels, H, W] → [B, out_channels, H, W]``.
    Any ``H, W >= 1`` work; sizes divisible by ``2**(scales-1)`` avoid
    resampling artefacts.

    Examples
    --------
    >>> net = UNet(unet_preset("reference-28"))
    >>> net(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 1, 28, 28])
    >>> list(net.blocks())
    ['inc', 'down_0', 'down_1', 'skip_0', 'up_0', 'skip_1', 'up_1', 'out']
    """

    def __init__(self, config: UNetConfig | None = None, **overrides):
        super().__init__()
        config = config if config is not None else UNetConfig()
        if overrides:
            config = config.with_(**overrides)
        self.config = config
        c, s = config.channels, config.scales
        p = float(config.dropout)
        norm = config.use_norm
        self.inc = nn.Sequential(
            ConvUnit(config.in_channels, c[0], norm_groups=2 if norm else None, dropout=p))
        self.down = nn.ModuleList(
            nn.Sequential(
                ConvUnit(c[i], c[i + 1], stride=2, norm_groups=4 if norm else None, dropout=p),
                ConvUnit(c[i + 1], c[i + 1], norm_groups=4 if norm else None, dropout=p))
            for i in range(s - 1))
        self.up = nn.ModuleList(
            UpBlock(c[s - 1 - i], c[s - 2 - i], skip_in=c[s - 2 - i],
                    skip_ch=config.skip_channels[s - 1 - i], use_norm=norm, dropout=p)
            for i in range(s - 1))
        self.out = nn.Conv2d(c[0], config.out_channels, kernel_size=1)

    # ------------------------------------------------------------------
    def forward(self, x: Tensor, *, return_pre_sigmoid: bool = False) -> Tensor:
        """Apply the network.

        Parameters
        ----------
        x : Tensor
            ``[B, in_channels, H, W]`` float tensor.
        return_pre_sigmoid : bool
            Return the (clamped) activations before the sigmoid. Default False.

        Returns
        -------
        Tensor
            ``[B, out_channels, H, W]``.
        """
        xs = [self.inc(x)]
        for block in self.down:
            xs.append(block(xs[-1]))
        h = xs[-1]
        for i, block in enumerate(self.up):
            h = block(h, xs[-2 - i])
        h = self.out(h)
        if self.config.use_sigmoid:
            if self.config.sigmoid_saturation is not None:
                # clamp the value but pass the gradient straight through: a
                # plain clamp has zero gradient outside ±t, and a network
                # whose outputs all cross it can never recover
                t = float(self.config.sigmoid_saturation)
                h = h + (h.clamp(-t, t) - h).detach()
            if not return_pre_sigmoid:
                h = torch.sigmoid(h)
        return h

    # ------------------------------------------------------------------
    def blocks(self) -> "OrderedDict[str, list[tuple[str, nn.Conv2d]]]":
        """The conv layers grouped into prior blocks, in forward order.

        Returns
        -------
        OrderedDict
            ``name → [(weight parameter name, conv module), ...]`` with names
            ``inc``, ``down_0 … down_{S-2}``, then for each up block
            ``skip_i`` (its 1×1 skip conv, absent when the skip width is 0)
            and ``up_i`` (its two 3×3 convs), then ``out`` (the 1×1 output
            conv). The parameter names are those of :meth:`named_parameters`
            (``…conv.weight``; the bias is ``…conv.bias``).
        """
        names = {m: n for n, m in self.named_modules()}
        out: OrderedDict[str, list[tuple[str, nn.Conv2d]]] = OrderedDict()

        def convs(module):
            return [(names[m] + ".weight", m) for m in module.modules()
                    if isinstance(m, nn.Conv2d)]

        out["inc"] = convs(self.inc)
        for i, block in enumerate(self.down):
            out[f"down_{i}"] = convs(block)
        for i, block in enumerate(self.up):
            if block.skip is not None:
                out[f"skip_{i}"] = convs(block.skip)
            out[f"up_{i}"] = convs(block.conv)
        out["out"] = [("out.weight", self.out)]
        return out

    def conv_weight_names(self) -> list[str]:
        """Names of every conv weight, in :meth:`blocks` order (biases excluded)."""
        return [n for blk in self.blocks().values() for n, _ in blk]

    def extra_repr(self) -> str:
        cfg = self.config
        return (f"scales={cfg.scales}, channels={list(cfg.channels)}, "
                f"skip={list(cfg.skip_channels)}, sigmoid={cfg.use_sigmoid}, "
                f"norm={cfg.use_norm}, dropout={cfg.dropout}")


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) scalar parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# --------------------------------------------------------------------------
# presets

#: Named architectures. ``reference-28`` is the reference network; the others
#: were chosen by the timings in ``docs/dip.md`` (2-core CPU, forward+backward
#: per DIP iteration).
PRESETS: dict[str, UNetConfig] = {
    "reference-28": UNetConfig(scales=3, channels=(32,) * 3, skip_channels=(0, 4, 4),
                               use_sigmoid=True, use_norm=False),
    # GroupNorm: the ellipse images converge faster with it (docs/dip.md §3); 16
    # channels, not 32: the same image at equal iterations in 0.6 of the time, and the
    # time spent on more iterations instead (docs/dip.md §9 and §11)
    "dip-64": UNetConfig(scales=4, channels=(16,) * 4, skip_channels=(0, 4, 4, 4),
                         use_sigmoid=True, use_norm=True),
    "dip-128": UNetConfig(scales=5, channels=(32,) * 5, skip_channels=(0, 4, 4, 4, 4),
                          use_sigmoid=True, use_norm=True),
    "dip-256": UNetConfig(scales=6, channels=(32,) * 6, skip_channels=(0, 4, 4, 4, 4, 4),
                          use_sigmoid=True, use_norm=True),
    # one more scale than dip-256: the coarsest feature map stays 8² as at 256²
    "dip-512": UNetConfig(scales=7, channels=(32,) * 7, skip_channels=(0, 4, 4, 4, 4, 4, 4),
                          use_sigmoid=True, use_norm=True),
    # the reference's network for 501×501 real data (≈3 M parameters): slow on CPU
    "reference-large": UNetConfig(scales=6, channels=(128,) * 6,
                                  skip_channels=(0, 0, 0, 0, 4, 4),
                                  use_sigmoid=False, use_norm=True),
}

#: Image size each size-based preset is meant for, in increasing order.
_SIZE_PRESETS = [(28, "reference-28"), (64, "dip-64"), (128, "dip-128"), (256, "dip-256"),
                 (512, "dip-512")]


def preset_name_for_size(image_size) -> str:
    """Name of the preset for an image of side ``image_size`` (or shape ``(n0, n1)``).

    The smallest preset whose nominal size is at least ``0.75 × max(n0, n1)``
    wins (so 28→reference-28, 48→dip-64, 100→dip-128, 200→dip-256,
    400→dip-512); larger images use ``dip-512`` too (its 7 scales reach 8²
    feature maps at 512²), within the memory budget that
    :func:`ctuq.recon.pipeline.check_memory` enforces.
    """
    if isinstance(image_size, (tuple, list)):
        n = max(int(v) for v in image_size)
    else:
        n = int(image_size)
    if n < 1:
        raise InputError(f"must be positive, got {image_size}", field="image_size")
    for nominal, name in _SIZE_PRESETS:
        if 0.75 * n <= nominal:
            return name
    return _SIZE_PRESETS[-1][1]


def unet_preset(name_or_image_size) -> UNetConfig:
    """The :class:`UNetConfig` of a named preset, or of the preset for an image size.

    Parameters
    ----------
    name_or_image_size : str or int or tuple of int
        A key of :data:`PRESETS`, or an image side / shape (see
        :func:`preset_name_for_size`).

    Raises
    ------
    InputError
        For an unknown preset name.
    """
    if isinstance(name_or_image_size, str):
        if name_or_image_size not in PRESETS:
            raise InputError(f"unknown U-net preset {name_or_image_size!r}; "
                             f"choose one of {sorted(PRESETS)}", field="preset")
        return PRESETS[name_or_image_size]
    return PRESETS[preset_name_for_size(name_or_image_size)]


#: Held while a seeded network draws its weights (:func:`build_unet`).
_SEEDED = threading.Lock()


def build_unet(config: UNetConfig | str | int = "reference-28", *, seed: int | None = 0,
               device: str | torch.device = "cpu", **overrides) -> UNet:
    """Build a U-net with reproducibly seeded initial weights.

    The weights are drawn on the CPU from a forked RNG seeded with ``seed``
    (the global RNG is left untouched), then moved to ``device``, so a seed
    gives the same initial network on every device.

    Parameters
    ----------
    config : UNetConfig or str or int
        Architecture, preset name or image size.
    seed : int or None
        Initialisation seed; None draws from the global RNG. Default 0.
    device : str or torch.device
        Default ``"cpu"``.
    **overrides
        Fields of :class:`UNetConfig` to change.
    """
    if not isinstance(config, UNetConfig):
        config = unet_preset(config)
    if overrides:
        config = config.with_(**overrides)
    if seed is None:
        net = UNet(config)
    else:  # the lock: fits side by side on threads share torch's global RNG
        with _SEEDED, torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            net = UNet(config)
    return net.to(device)
