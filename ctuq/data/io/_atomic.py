"""Atomic, non-clobbering file output, and the removal of provably stale temporaries.

A writer fills a temporary file in the target folder; only when it has
finished is that file moved to its final name (``os.link`` when an existing
file must not be replaced, which fails instead of clobbering a file that
appeared meanwhile; ``os.replace`` otherwise). Any failure removes the
temporary file, so a failed write never leaves anything behind, and a reader
never sees a half-written result.

A process killed mid-write (SIGKILL, power loss) leaves its temporary
behind. Each write therefore owns a token: its temporary is
``.ctuq-<token>.<name>.tmp`` and, for the whole write, it holds an exclusive
``flock`` on ``.ctuq-<token>.lock``, created *before* the temporary.
:func:`remove_stale_temporaries` deletes a temporary only when it matches that
pattern exactly and its lock file exists and can be locked, i.e. its writer
is gone; it never touches anything else (an input called ``.scan.tmp``, a
user's ``.notes.tmp``, the live temporary of a concurrent run).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Iterable, Iterator

from ctuq.errors import InputError

log = logging.getLogger(__name__)

#: ``.ctuq-<16 hex>.<up to 64 characters of the target name>.tmp``
TEMP_PATTERN = re.compile(r"^\.ctuq-([0-9a-f]{16})\..{1,64}\.tmp$", re.DOTALL)
_NAME_IN_TEMP = 64
#: A lock file without its temporary is removed only when older than this
#: (seconds), so that one being created right now is left alone.
LOCK_GRACE = 60.0


def _lock_path(folder: Path, token: str) -> Path:
    return folder / f".ctuq-{token}.lock"


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _same_file(a: Path, b: Path) -> bool:
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, RuntimeError, ValueError):  # loops, names too long: not the same
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
    limit = _name_max(parent) if os.path.isdir(parent) else 255
    if len(os.fsencode(target.name)) > limit:
        raise InputError(f"the output file name has {len(os.fsencode(target.name))} bytes; "
                         f"this file system allows {limit}", file=target, field="output")
    if not os.path.isdir(parent):
        raise InputError("the output folder does not exist", file=target, field="output")
    if os.path.isdir(target):
        raise InputError("is a directory; an output file name is needed", file=target,
                         field="output")
    for src in protect:
        if src is None:
            continue
        if _same_file(target, Path(os.fspath(src))):
            raise InputError("refusing to overwrite the input file", file=target,
                             field="output")
    if os.path.lexists(target) and not overwrite:
        raise InputError("already exists; set overwrite (--overwrite) to replace it",
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
        An empty file ``.ctuq-<token>.<name>.tmp`` in the target's folder
        (created with the usual permissions, i.e. ``0o666`` less the umask),
        guarded by a locked ``.ctuq-<token>.lock`` (see the module docstring).

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
    token = secrets.token_hex(8)
    tmp = target.parent / f".ctuq-{token}.{target.name[:_NAME_IN_TEMP]}.tmp"
    lock = _lock_path(target.parent, token)
    try:
        lock_fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise InputError(f"cannot write in the output folder ({exc.strerror or exc})",
                         file=target, field="output") from exc
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        os.write(lock_fd, f"{os.getpid()} {os.uname().nodename}\n".encode())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        os.close(lock_fd)
        with contextlib.suppress(OSError):
            lock.unlink()
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
                raise InputError("already exists (written meanwhile by another process); "
                                 "set overwrite (--overwrite) to replace it", file=target,
                                 field="output") from None
            except OSError:
                # Hard links unsupported on this file system (e.g. some FUSE
                # or SMB mounts): fall back to a plain rename.
                os.replace(tmp, target)
        log.debug("wrote %s", target)
    except OSError as exc:  # a full disk, a quota, an I/O error: the target's failure
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InputError(f"cannot be written ({exc.strerror or exc}); nothing was left "
                         "behind", file=target, field="output") from exc
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    else:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    finally:
        # the temporary is gone before the lock is: a temporary is never unguarded
        with contextlib.suppress(OSError):
            lock.unlink()
        os.close(lock_fd)


def _stale(lock: Path) -> bool:
    """True when ``lock`` exists and no process holds it (its writer is gone)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False  # a live writer holds it
        return False
    else:
        return True
    finally:
        os.close(fd)


def remove_stale_temporaries(folder, protect: Iterable = ()) -> list[Path]:
    """Delete the temporaries of :func:`atomic_output` whose writer is gone.

    Parameters
    ----------
    folder : path-like
    protect : iterable of path-like
        Files never to delete whatever their name (the inputs of a run).

    Returns
    -------
    list of Path
        What was removed: only ``.ctuq-<token>.<name>.tmp`` files whose
        ``.ctuq-<token>.lock`` exists and is not locked, and such lock files
        left without a temporary for more than a minute.
    """
    folder = Path(folder)
    keep = set()
    for p in protect:
        with contextlib.suppress(OSError, TypeError):
            keep.add(os.path.realpath(os.fspath(p)))
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = TEMP_PATTERN.match(name)
        if not m:
            continue
        tmp = folder / name
        if os.path.realpath(tmp) in keep or not tmp.is_file() or tmp.is_symlink():
            continue
        lock = _lock_path(folder, m.group(1))
        if _stale(lock):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed.append(tmp)
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
    now = time.time()
    for name in names:
        m = re.match(r"^\.ctuq-([0-9a-f]{16})\.lock$", name)
        if not m:
            continue
        lock = folder / name
        if os.path.realpath(lock) in keep or any(
                TEMP_PATTERN.match(n) and n.startswith(f".ctuq-{m.group(1)}.") for n in names):
            continue
        with contextlib.suppress(OSError):
            if now - lock.stat().st_mtime > LOCK_GRACE and _stale(lock):
                lock.unlink()
                removed.append(lock)
    return removed
