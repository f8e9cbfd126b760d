"""Errors that ctuq raises on purpose.

Every error a user can cause (a bad file, a bad argument, an impossible
geometry) is an :class:`InputError` naming the offending file and field, so
the CLI and the napari plugin can show one clear line instead of a traceback.
"""

from __future__ import annotations


class CtuqError(Exception):
    """Base class of every error ctuq raises deliberately."""


class InputError(CtuqError, ValueError):
    """A user-supplied file, field or argument is invalid.

    Parameters
    ----------
    message : str
        What is wrong, in words a user understands.
    file : str or path-like, optional
        The file the problem was found in.
    field : str, optional
        The dataset, attribute, option or argument at fault.

    Examples
    --------
    >>> err = InputError("must be positive", field="pixel_size")
    >>> str(err)
    'pixel_size: must be positive'
    """

    def __init__(self, message: str, *, file=None, field: str | None = None):
        self.message = message
        self.file = None if file is None else str(file)
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.file is not None:
            where += f"{self.file}"
        if self.field is not None:
            where += f"{':' if where else ''}{self.field}"
        return f"{where}: {self.message}" if where else self.message


def did_you_mean(name, choices) -> str:
    """``" (did you mean 'iterations'?)"`` for the choice closest to a mistyped
    ``name``, or ``""`` when none is close (difflib's similarity >= 0.6).

    Examples
    --------
    >>> did_you_mean("itrations", ["iterations", "lr", "seed"])
    " (did you mean 'iterations'?)"
    >>> did_you_mean("colour", ["iterations", "lr"])
    ''
    """
    import difflib

    text = str(name)
    options = [str(c) for c in choices]
    # case and '-' vs '_' are the commonest slips: compare without them first
    folded = {c.lower().replace("-", "_"): c for c in options}
    key = text.lower().replace("-", "_")
    if key in folded and folded[key] != text:
        return f" (did you mean {folded[key]!r}?)"
    close = difflib.get_close_matches(key, list(folded), n=1, cutoff=0.6)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""


class Cancelled(CtuqError):
    """Raised inside a long computation when its cancel check returns True."""
