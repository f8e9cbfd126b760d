"""Atomic, non-clobbering file output.

A writer fills a temporary file in the target folder; only when it has
finished is that file moved to its final name (``os.link`` when an existing
file must not be replaced, which fails instead of clobbering a file that
appeared meanwhile; ``os.replace`` otherwise). Any failure removes the
temporary file, so a failed write never leaves anything behind, and a reader
never sees a half-written result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from pathlib import Path
from typing import Iterable, Iterator

from ctuq.errors import InputError

log = logging.getLogger(__name__)


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


def check_output_path(target, *, overwrite: bool = False, protect: Iterable = ()) -> Path:
    """Check that ``target`` may be written, without touching the disk.

    Parameters
    ----------
    target : path-like
        The output file.
    overwrite : bool
        Allow replacing an existing file (never one listed in ``protect``).
    protect : iterable of path-like or None
        Files that must never be overwritten (the inputs).

    Raises
    ------
    InputError
        The folder is missing, the target is a directory or an input, or the
        target exists and ``overwrite`` is False.
    """
    try:
        target = Path(os.fspath(target))
    except TypeError:
        raise InputError(f"not a file path: {target!r}", field="output") from None
    parent = target.parent
    if not parent.is_dir():
        raise InputError("the output folder does not exist", file=target, field="output")
    if target.is_dir():
        raise InputError("is a directory; an output file name is needed", file=target,
                         field="output")
    for src in protect:
        if src is None:
            continue
        if _same_file(target, Path(os.fspath(src))):
            raise InputError("refusing to overwrite the input file", file=target,
                             field="output")
    if os.path.lexists(target) and not overwrite:
        raise InputError("already exists; pass overwrite=True (--overwrite) to replace it",
                         file=target, field="output")
    return target


@contextlib.contextmanager
def atomic_output(target, *, overwrite: bool = False, protect: Iterable = ()) -> Iterator[Path]:
    """Context manager yielding a temporary path to write; moved into place on
    success, deleted on any failure.

    Parameters
    ----------
    target, overwrite, protect
        See :func:`check_output_path`.

    Yields
    ------
    pathlib.Path
        An empty file ``.<name>.<random>.tmp`` in the target's folder
        (created with the usual permissions, i.e. ``0o666`` less the umask).

    Raises
    ------
    InputError
        See :func:`check_output_path`; also if the folder is not writable.

    Examples
    --------
    >>> with atomic_output("out.h5") as tmp:           # doctest: +SKIP
    ...     with h5py.File(tmp, "w") as f:
    ...         f["x"] = 1
    """
    protect = list(protect)
    target = check_output_path(target, overwrite=overwrite, protect=protect)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise InputError(f"cannot write in the output folder ({exc.strerror or exc})",
                         file=target, field="output") from exc
    os.close(fd)
    try:
        yield tmp
        # Flush to disk before the rename so a crash cannot leave a renamed
        # but empty file.
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        # Re-check: the protected inputs and the target may have changed
        # while we were writing.
        check_output_path(target, overwrite=overwrite, protect=protect)
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)          # fails if target exists: no clobbering
            except FileExistsError:
                raise InputError("already exists; pass overwrite=True (--overwrite) to "
                                 "replace it", file=target, field="output") from None
            except OSError:
                # Hard links unsupported on this file system (e.g. some FUSE
                # or SMB mounts): fall back to a plain rename.
                os.replace(tmp, target)
        log.debug("wrote %s", target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    else:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
