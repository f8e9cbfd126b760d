"""Writing a sinogram as one ``.npz`` file that :func:`ctuq.data.io.read_sinogram` reads back.

Keys: ``sinogram`` (float32 ``[n_angles, n_det]`` or a stack), ``geometry``
(JSON text: :meth:`Geometry.to_dict` plus exact ``angles_rad``), ``meta``
(JSON text), ``ground_truth`` (when known). No pickled objects.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ctuq.data.io._atomic import atomic_output
from ctuq.data.io._common import dumps
from ctuq.data.io.sinogram import Sinogram
from ctuq.errors import InputError


def write_sinogram_npz(path, sinogram: Sinogram, *, overwrite: bool = False) -> Path:
    """Write ``sinogram`` to ``path`` (``.npz``) atomically; see the module docstring."""
    if not isinstance(sinogram, Sinogram):
        raise InputError(f"must be a Sinogram, got {type(sinogram).__name__}", field="sinogram")
    meta = {k: v for k, v in sinogram.meta.items() if k not in ("source", "format")}
    geometry = {**sinogram.geometry.to_dict(),
                "angles_rad": [float(a) for a in sinogram.geometry.angles]}
    arrays = {"sinogram": sinogram.data,
              "geometry": np.array(dumps(geometry, field="geometry", file=path)),
              "meta": np.array(dumps(meta, field="meta", file=path))}
    if sinogram.ground_truth is not None:
        arrays["ground_truth"] = sinogram.ground_truth
    with atomic_output(path, overwrite=overwrite, protect=[sinogram.meta.get("source")]) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
    return Path(os.fspath(path))
