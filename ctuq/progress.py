"""Progress reporting and cancellation, shared by every long computation.

A long computation takes two optional callables:

- ``progress``: called every few steps, either with keyword arguments
  ``progress(stage=..., step=..., total=..., message=...)`` or, if it takes a
  single positional argument, with one :class:`ProgressEvent`;
- ``cancel``: called without arguments; returning True makes the
  computation raise :class:`ctuq.errors.Cancelled`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from ctuq.errors import Cancelled

__all__ = ["ProgressEvent", "emit_progress", "relay", "check_cancel"]


@dataclass
class ProgressEvent:
    """One progress report.

    Parameters
    ----------
    stage : str
        Which stage reports (``"dip"``, ``"mc_dropout"``, ``"em"``, …).
    step : int
        Steps done so far.
    total : int
        Steps in the stage.
    message : str
        A short human-readable status (e.g. the current loss).
    """

    stage: str
    step: int
    total: int
    message: str = ""


def _wants_keywords(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    names = {p.name for p in params}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return True
    return "stage" in names and "step" in names


def emit_progress(progress: Callable | None, stage: str, step: int, total: int,
                  message: str = "") -> None:
    """Call ``progress`` in whichever of the two styles it accepts (no-op for None)."""
    if progress is None:
        return
    if _wants_keywords(progress):
        progress(stage=stage, step=step, total=total, message=message)
    else:
        progress(ProgressEvent(stage, step, total, message))


def relay(progress: Callable | None, stage: str, step: int, total: int,
          prefix: str = "") -> Callable | None:
    """A progress callable that reports an inner computation as the outer ``stage``.

    The inner events keep the outer stage, step and total (a bar does not
    jump between the counts of two computations) and carry the inner
    event's message, after ``prefix``: e.g. the CG iterations and Nyström
    sketch of an E-step show as ``("em", 1, 4, "E-step 1: CG iteration 10, …")``.
    None when ``progress`` is None.
    """
    if progress is None:
        return None

    def inner(event: ProgressEvent) -> None:  # one positional argument: gets the event
        emit_progress(progress, stage, step, total,
                      prefix + (event.message or f"{event.stage} {event.step}/{event.total}"))

    return inner


def check_cancel(cancel: Callable[[], bool] | None, what: str = "computation") -> None:
    """Raise :class:`~ctuq.errors.Cancelled` if ``cancel()`` returns True."""
    if cancel is not None and cancel():
        raise Cancelled(f"{what} cancelled")
