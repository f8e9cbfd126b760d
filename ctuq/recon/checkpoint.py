"""Finished stages of a reconstruction, kept on disk so that a stopped run resumes.

A 512² reconstruction takes hours on a CPU (docs/scaling.md §2): a killed
job, a cluster's wall-time limit or a cancel must not throw the finished
stages away. :class:`StageCheckpoints` saves the result of each long stage
(``dip``: the fitted network; ``em``: the fitted hyperparameters with the
last E-step's solutions and preconditioner; ``predictive``: the posterior
samples) to one file per slice and stage, written atomically; a later run
on the same data with the same settings loads them instead of recomputing
and records which stages it resumed (``config['resumed']``) and their
original seconds (``timings_s``). The folder is removed once the result
file is written.

The files are Python pickles (``torch.save``): load only folders that ctuq
wrote for you. A file whose key (a hash of the slice's data, geometry,
settings, the torch version and ctuq's own source code) does not match is
ignored and overwritten, so changed settings or changed code never resume
from stale work.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

__all__ = ["StageCheckpoints", "STAGES", "checkpoint_folder", "stage_key"]

#: The stages the pipeline saves, in order (``dip``; the Laplace method's ``em``
#: and ``predictive``). A method may save others: any lower-case name.
STAGES = ("dip", "em", "predictive")
_STAGE_NAME = re.compile(r"[a-z][a-z0-9_]*")

#: The names :class:`StageCheckpoints` writes (and only these are removed).
_FILE_NAME = re.compile(r"slice\d+-[a-z][a-z0-9_]*\.pt(?:\.tmp)?")
_SAVED_NAME = re.compile(r"slice\d+-[a-z][a-z0-9_]*\.pt")

#: Settings that do not change the numbers (a run may resume with others).
_NOT_IN_KEY = ("threads",)


class StageCheckpoints:
    """The checkpoint folder of one reconstruction.

    Parameters
    ----------
    folder : path-like
        Created on the first save; holds only files named
        ``slice<i>-<stage>.pt`` (and their ``.tmp`` while written).

    Examples
    --------
    >>> import tempfile
    >>> ck = StageCheckpoints(tempfile.mkdtemp() + "/run.resume")
    >>> ck.save(0, "dip", "key", {"weights": 1}, seconds=2.0)
    >>> ck.load(0, "dip", "key")
    ({'weights': 1}, 2.0)
    >>> ck.load(0, "dip", "other settings") is None
    True
    >>> ck.clear()
    """

    def __init__(self, folder):
        self.folder = Path(folder)

    def _path(self, index: int, stage: str) -> Path:
        if not (isinstance(stage, str) and _STAGE_NAME.fullmatch(stage)):
            raise ValueError(f"not a stage name: {stage!r}")
        return self.folder / f"slice{int(index)}-{stage}.pt"

    def load(self, index: int, stage: str, key: str, map_location=None):
        """``(value, seconds)`` of a finished stage saved under ``key``, else None.

        An unreadable file (a run killed while the file system lost it) or
        one saved under another key is ignored with a log line.
        """
        path = self._path(index, stage)
        try:
            if not path.is_file():
                return None
            payload = torch.load(path, map_location=map_location, weights_only=False)
        except Exception as err:  # a damaged checkpoint only costs the stage again
            log.warning("ignoring the unreadable checkpoint %s (%s)", path, err)
            return None
        if not isinstance(payload, dict) or payload.get("key") != key:
            log.info("ignoring the checkpoint %s: other data or settings", path)
            return None
        log.info("resuming %s of slice %d from %s", stage, index, path)
        return payload["value"], float(payload["seconds"])

    def save(self, index: int, stage: str, key: str, value, *, seconds: float) -> None:
        """Write one stage's result atomically (a temporary file, then a rename)."""
        path = self._path(index, stage)
        tmp = path.with_name(path.name + ".tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            torch.save({"key": key, "value": value, "seconds": float(seconds)}, tmp)
            os.replace(tmp, path)
        except Exception as err:  # a full disk must not fail the reconstruction itself
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            log.warning("could not save the %s checkpoint to %s (%s)", stage, path, err)

    def has_stages(self) -> bool:
        """Whether the folder holds a finished stage (something a rerun can resume)."""
        try:
            return self.folder.is_dir() and any(
                _SAVED_NAME.fullmatch(p.name) for p in self.folder.iterdir() if p.is_file())
        except OSError:
            return False

    def clear(self) -> None:
        """Remove the files this class writes, then the folder if it is empty.

        Nothing else is touched: a file a user put there stays, and so does
        the folder.
        """
        try:
            if not self.folder.is_dir():
                return
            for path in self.folder.iterdir():
                if path.is_file() and _FILE_NAME.fullmatch(path.name):
                    path.unlink(missing_ok=True)
            self.folder.rmdir()
        except OSError as err:  # the result is written: a leftover folder is only litter
            log.info("kept %s (%s)", self.folder, err)


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of ctuq's installed source (every ``.py`` and ``.json`` file).

    The version number alone would let a development checkout resume stages
    that older code computed; any edit of the package changes this hash.
    """
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json") and path.is_file():
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def stage_key(data, geometry, config) -> str:
    """The hash that a checkpoint must match: data, geometry, settings, code.

    Parameters
    ----------
    data : ndarray
        The slice's sinogram.
    geometry : Geometry
    config : ReconstructionConfig
    """
    import ctuq

    settings = {k: v for k, v in config.to_dict().items() if k not in _NOT_IN_KEY}
    h = hashlib.sha256()
    arr = np.ascontiguousarray(np.asarray(data))
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(arr.tobytes())
    h.update(json.dumps({"geometry": geometry.to_dict(), "settings": settings,
                         "ctuq": ctuq.__version__, "code": code_fingerprint(),
                         "torch": torch.__version__},
                        sort_keys=True, default=str).encode())
    return h.hexdigest()


def checkpoint_folder(out_path) -> Path:
    """Where a result file's finished stages are kept: ``.<out name>.resume`` beside it.

    A name that would pass the file system's 255 bytes is replaced by a hash
    of it (``.<sha256 prefix>.ctuq.resume``).
    """
    out_path = Path(out_path)
    name = f".{out_path.name}.resume"
    if len(os.fsencode(name)) > 255:
        digest = hashlib.sha256(os.fsencode(out_path.name)).hexdigest()[:24]
        name = f".{digest}.ctuq.resume"
    return out_path.with_name(name)
