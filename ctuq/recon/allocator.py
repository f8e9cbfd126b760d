"""Keep freed memory in the process: large CPU tensors without page faults.

glibc's ``malloc`` serves every block above its mmap threshold (at most
32 MiB on 64-bit Linux) with a fresh ``mmap`` and returns it with
``munmap`` when freed. A 32-channel feature map at 512² is 33.5 MB, so on a
CPU every layer of the U-net at 512² maps new pages and the kernel zeroes
them on first touch: at 512² on a 2-core EPYC a reconstruction spent 53 %
of its CPU time in the kernel (661,000 page faults a second), and a
Jacobian pair took 4.4 s instead of 1.7 s (docs/scaling.md §1). At 256² the
maps are 8 MB, below the threshold, and the heap reuses them.

:func:`keep_freed_memory` tells glibc to serve large blocks from its heap
and not to give the heap back while a reconstruction runs (``mallopt``:
``M_MMAP_MAX = 0``, ``M_TRIM_THRESHOLD`` = 2 GiB), the same as running with
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647``; :func:`give_back_memory`
returns the free heap to the system afterwards (``malloc_trim``). This is
what the jemalloc/tcmalloc preloads that PyTorch's CPU performance guides
recommend achieve. It is a setting of the whole process, applied by
:func:`ctuq.reconstruct` once, and skipped

- where the C library is not glibc (macOS, Windows, musl): nothing to do;
- when ``CTUQ_KEEP_FREED_MEMORY=0`` is set;
- when the user already chose (``MALLOC_MMAP_MAX_``, ``MALLOC_TRIM_THRESHOLD_``,
  ``MALLOC_MMAP_THRESHOLD_`` or glibc's malloc tunables in ``GLIBC_TUNABLES``,
  or jemalloc, tcmalloc or mimalloc in ``LD_PRELOAD``).

The price is resident memory: the heap keeps its peak until the
reconstruction ends (2.1 instead of 1.6 GB for one Jacobian pair at 512²).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform

log = logging.getLogger(__name__)

__all__ = ["allocator_setting", "give_back_memory", "keep_freed_memory"]

# mallopt parameters of glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int

_USER_CHOICES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


@functools.lru_cache(maxsize=1)
def _glibc():
    """glibc's handle, or None on any other C library."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # pragma: no cover - glibc without the usual soname
        return None


def _reason_to_skip(environ) -> str | None:
    if environ.get("CTUQ_KEEP_FREED_MEMORY", "1").strip().lower() in ("0", "false", "no", "off"):
        return "CTUQ_KEEP_FREED_MEMORY=0"
    chosen = [name for name in _USER_CHOICES if name in environ]
    if "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        chosen.append("GLIBC_TUNABLES")
    preload = environ.get("LD_PRELOAD", "")
    chosen += [name for name in _OTHER_ALLOCATORS if name in preload]
    if chosen:
        return "the environment chose the allocator (" + ", ".join(chosen) + ")"
    if _glibc() is None:
        return "not glibc"
    return None


_applied: str | None = None


def keep_freed_memory(environ=None) -> str:
    """Serve large blocks from the heap and keep it (once per process).

    Parameters
    ----------
    environ : mapping, optional
        The environment to read the opt-outs from (default ``os.environ``).

    Returns
    -------
    str
        :func:`allocator_setting` after the call.
    """
    global _applied
    if _applied is not None:
        return _applied
    reason = _reason_to_skip(os.environ if environ is None else environ)
    if reason is None:
        libc = _glibc()
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and \
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
        reason = None if ok else "mallopt refused"
    _applied = "keep-freed" if reason is None else f"system ({reason})"
    log.info("memory allocator: %s", _applied)
    return _applied


def allocator_setting() -> str:
    """``'keep-freed'``, ``'system (<why>)'``, or ``'unset'`` before the first call."""
    return _applied or "unset"


def give_back_memory() -> None:
    """Return the heap's free memory to the system (glibc only; else nothing)."""
    if _applied == "keep-freed":
        _glibc().malloc_trim(0)
