"""The educated warm start of the DIP: which weights file ``dip.warm_start`` names.

``dip.warm_start`` (:class:`ctuq.recon.dip.DIPConfig`) is

- ``"none"`` (default): the U-net starts from its seeded random weights;
- ``"shipped"``: from the weights shipped with ctuq for the fit's preset,
  ``ctuq/recon/weights/<preset>.pt``: the preset's U-net pretrained,
  supervised, as a post-processor of the FBP on simulated scans of synthetic
  phantoms (the educated DIP of Barbano et al. 2022; how they were made and
  what they gain: docs/dip.md §6);
- a path: a weights file written by :func:`ctuq.recon.dip.save_weights`
  for the same architecture.

The fit then refines the weights on the scan as a DIP; its input is the FBP
of the scan, as in the pretraining.
"""

from __future__ import annotations

import os
from pathlib import Path

from ctuq.errors import InputError

__all__ = ["WEIGHTS_DIR", "shipped_presets", "shipped_weights", "check_warm_start",
           "resolve_warm_start"]

#: Where the shipped weights live (package data).
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


def shipped_presets() -> list[str]:
    """The presets with shipped weights, sorted."""
    return sorted(p.stem for p in WEIGHTS_DIR.glob("*.pt"))


def shipped_weights(preset: str) -> Path:
    """The shipped weights file of ``preset``; InputError (field ``dip.warm_start``) if none."""
    path = WEIGHTS_DIR / f"{preset}.pt"
    if not path.is_file():
        have = ", ".join(shipped_presets()) or "none"
        raise InputError(f"no shipped warm-start weights for preset {preset!r} (shipped for: "
                         f"{have}); use warm_start = 'none' or a weights file",
                         field="dip.warm_start")
    return path


def check_warm_start(value: str) -> str:
    """``'none'``, ``'shipped'`` or a path, as given (ValueError for an empty string)."""
    text = str(value).strip()
    if not text:
        raise ValueError("empty; use 'none', 'shipped' or a weights file")
    return "none" if text.lower() == "none" else "shipped" if text.lower() == "shipped" else text


def resolve_warm_start(value: str, preset: str) -> str | None:
    """The weights file of ``warm_start = value`` for ``preset``, or None for ``'none'``.

    Raises
    ------
    InputError
        No shipped weights for the preset, or the named file does not exist.
    """
    value = check_warm_start(value)
    if value == "none":
        return None
    if value == "shipped":
        return os.fspath(shipped_weights(preset))
    if not os.path.isfile(value):
        raise InputError("no such warm-start weights file", file=value, field="dip.warm_start")
    return value
