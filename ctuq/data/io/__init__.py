"""Sinogram and result file I/O.

Read sinograms from NeXus NXtomo, DXchange, plain HDF5, ``.npy``, ``.npz``
and TIFF files (:func:`read_sinogram`; untrusted files in a child process
with a time limit: :func:`read_sinogram_isolated`); write ctuq's own NXtomo sinograms
(:func:`write_sinogram`) and NeXus NXtomoproc result files
(:func:`write_result` / :func:`read_result`). Every problem with a file is an
:class:`ctuq.errors.InputError` naming the file and field; writes are atomic
and never replace an input or, unless asked, an existing output.

File layouts: ``docs/file_formats.md``.
"""

from ctuq.data.io._atomic import atomic_output, check_output_path, remove_stale_temporaries
from ctuq.data.io._common import check_array, default_memory_budget, sha256_file
from ctuq.data.io._resolve import from_options as geometry_part, resolve as resolve_geometry
from ctuq.data.io.isolated import (detect_format_isolated, read_result_isolated,
                                   read_sinogram_isolated)
from ctuq.data.io.nxtomo import write_sinogram
from ctuq.data.io.options import GeometryOptions, ReadOptions
from ctuq.data.io.readers import (SINOGRAM_FORMATS, detect_format, read_sidecar,
                                  read_sinogram, sidecar_path)
from ctuq.data.io.results import Result, read_result, write_result
from ctuq.data.io.sinogram import Sinogram

__all__ = [
    "SINOGRAM_FORMATS",
    "GeometryOptions",
    "ReadOptions",
    "Result",
    "Sinogram",
    "atomic_output",
    "check_output_path",
    "detect_format",
    "detect_format_isolated",
    "read_result",
    "read_result_isolated",
    "read_sidecar",
    "read_sinogram",
    "read_sinogram_isolated",
    "remove_stale_temporaries",
    "sha256_file",
    "sidecar_path",
    "write_result",
    "write_sinogram",
]
