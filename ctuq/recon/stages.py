"""Run a pipeline stage, or load it from a slice's checkpoint (:mod:`ctuq.recon.checkpoint`)."""

from __future__ import annotations

import time
from typing import Callable

from ctuq.progress import emit_progress
from ctuq.recon.checkpoint import StageCheckpoints, stage_key

__all__ = ["StageRunner"]


class StageRunner:
    """The checkpointed stages of one slice.

    Parameters
    ----------
    ckpt : StageCheckpoints or None
        None: every stage runs, nothing is saved.
    index : int
        The slice.
    problem : ReconstructionProblem, optional
        Its data, geometry and settings make the checkpoints' key (needed
        with ``ckpt``).

    Attributes
    ----------
    resumed : list of str
        The stages loaded instead of run.
    """

    def __init__(self, ckpt: StageCheckpoints | None, index: int = 0, problem=None):
        self.ckpt, self.index, self.resumed = ckpt, index, []
        self.key = None if ckpt is None else stage_key(problem.sinogram.data,
                                                       problem.geometry, problem.config)
        self.device = None if problem is None else problem.device

    def run(self, stage: str, compute: Callable, *, pack: Callable = lambda v: v,
            unpack: Callable = lambda v: v, progress: Callable | None = None):
        """``(value, seconds)``: the saved stage (its original seconds), else ``compute()``."""
        if self.ckpt is not None:
            saved = self.ckpt.load(self.index, stage, self.key, map_location=self.device)
            if saved is not None:
                self.resumed.append(stage)
                emit_progress(progress, stage, 1, 1, f"resumed from {self.ckpt.folder}")
                return unpack(saved[0]), saved[1]
        t0 = time.perf_counter()
        value = compute()
        seconds = time.perf_counter() - t0
        if self.ckpt is not None:
            self.ckpt.save(self.index, stage, self.key, pack(value), seconds=seconds)
        return value, seconds
