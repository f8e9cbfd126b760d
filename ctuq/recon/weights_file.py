"""U-net weight files: save a fitted DIP's weights, load them for a warm start.

A file holds ``{'format', 'unet', 'state_dict'}`` (``torch.save``); the
architecture is checked against the network it is loaded into.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from ctuq.errors import InputError
from ctuq.models.unet import UNet

__all__ = ["WEIGHTS_FORMAT", "save_weights", "load_weights"]

WEIGHTS_FORMAT = "ctuq-unet-weights"


def save_weights(model: UNet, path) -> None:
    """Save a U-net's weights and architecture to ``path`` (``torch.save`` format).

    The file holds ``{'format', 'unet', 'state_dict'}``; load it with
    :func:`load_weights` or warm-start a fit with ``DIPConfig(init_weights=path)``.
    """
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    payload = {
        "format": WEIGHTS_FORMAT,
        "unet": model.config.to_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    torch.save(payload, path)


_ARCH_FIELDS = ("scales", "channels", "skip_channels", "use_sigmoid", "use_norm",
                "in_channels", "out_channels")


def load_weights(model: UNet, path) -> UNet:
    """Load weights saved by :func:`save_weights` (or a bare state dict) into ``model``.

    Dropout and the sigmoid clamp may differ between the file and ``model``;
    everything else must match.

    Raises
    ------
    InputError
        If the file is missing, unreadable, or its architecture or tensors
        do not match ``model``.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError("no such weights file", file=path, field="init_weights")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a user error
        raise InputError(f"cannot read U-net weights ({exc.__class__.__name__}: {exc})",
                         file=path, field="init_weights") from None
    if isinstance(payload, dict) and payload.get("format") == WEIGHTS_FORMAT:
        file_cfg = payload.get("unet", {})
        ours = model.config.to_dict()
        diff = [f"{k}: file {file_cfg.get(k)!r} vs model {ours[k]!r}"
                for k in _ARCH_FIELDS if k in file_cfg and file_cfg[k] != ours[k]]
        if diff:
            raise InputError("U-net architecture does not match the weights file ("
                             + "; ".join(diff) + ")", file=path, field="init_weights")
        state = payload["state_dict"]
    elif isinstance(payload, dict) and all(isinstance(v, Tensor) for v in payload.values()):
        state = payload
    else:
        raise InputError("not a U-net weights file", file=path, field="init_weights")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise InputError("weights do not fit the U-net architecture: "
                         + " ".join(s.strip() for s in first[:3]),
                         file=path, field="init_weights") from None
    return model
