"""Sinogram and result file I/O.

Read sinograms from NeXus NXtomo, DXchange, plain HDF5, ``.npy``, ``.npz``
and TIFF files (:func:`read_sinogram`); write ctuq's own NXtomo sinograms
(:func:`write_sinogram`) and NeXus NXtomoproc result files
(:func:`write_result` / :func:`read_result`). Every problem with a file is an
:class:`ctuq.errors.InputError` naming the file and field; writes are atomic
and never replace an input or, unless asked, an existing output.

File layouts: ``docs/file_formats.md``.
"""

from ctuq.data.io._atomic import atomic_output, check_output_path
from ctuq.data.io._common import sha256_file
from ctuq.data.io.nxtomo import write_sinogram
from ctuq.data.io.readers import (SINOGRAM_FORMATS, detect_format, read_sidecar,
                                  read_sinogram, sidecar_path)
from ctuq.data.io.results import Result, read_result, write_result
from ctuq.data.io.sinogram import Sinogram

__all__ = [
    "SINOGRAM_FORMATS",
    "Result",
    "Sinogram",
    "atomic_output",
    "check_output_path",
    "detect_format",
    "read_result",
    "read_sidecar",
    "read_sinogram",
    "sha256_file",
    "sidecar_path",
    "write_result",
    "write_sinogram",
]
