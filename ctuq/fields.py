"""Declarative settings: one validation layer for TOML, the CLI, the API and napari.

A settings dataclass declares each field with :func:`setting`, which stores a
:class:`Spec` (kind, range, choices, unit, help text) in the field's
metadata, and calls :func:`validate` in ``__post_init__``. Every value then
passes the same checks whether it came from a TOML file, a command-line flag,
a keyword argument or a napari form: exact types (``True`` is not a number,
``"10"`` is not an integer), finiteness, ranges, known choices, and for every
float a magnitude that single precision can hold once squared
(:data:`FLOAT32_SQUARE_SAFE`: settings end in float32 tensors, and standard
deviations are squared into variances); an error is an
:class:`~ctuq.errors.InputError` naming the key (``dip.iterations``). The
specs are plain data, so CLI options and forms can be generated from them
(:func:`specs`).

Examples
--------
>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Fit:
...     iterations: int = setting(100, kind=int, minimum=1, doc="Adam steps.")
...     def __post_init__(self):
...         validate(self, prefix="fit")
>>> Fit(iterations=True)
Traceback (most recent call last):
...
ctuq.errors.InputError: fit.iterations: must be an integer, got True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ctuq.errors import InputError, did_you_mean

_MISSING = dataclasses.MISSING
_KEY = "ctuq"

_F32 = np.finfo(np.float32)
#: The nonzero magnitudes a float setting may have by default, ``(1.08e-19, 1.84e19)``:
#: the square roots of float32's smallest normal and largest number, so that the
#: value and its square are normal float32 numbers (``noise_std = 1e30`` would
#: overflow as a variance, ``1e-300`` underflow to a variance of 0).
FLOAT32_SQUARE_SAFE = (float(np.sqrt(_F32.tiny)), float(np.sqrt(_F32.max)))


@dataclass(frozen=True)
class Spec:
    """How one setting is checked and described.

    Attributes
    ----------
    kind : type
        ``int``, ``float``, ``bool``, ``str`` or ``list`` (of ``item``).
    doc : str
        One-line help text.
    optional : bool
        None is allowed (meaning "automatic" / "not given").
    minimum, maximum : float, optional
        Inclusive bounds (numbers; list items; the length of a string is not
        checked).
    greater_than : float, optional
        Exclusive lower bound.
    choices : tuple, optional
        Allowed values (strings).
    unit : str, optional
        Physical unit shown in help texts (``"mm"``, ``"s"``, ``"GiB"``).
    item : type, optional
        Kind of the items of a ``list`` setting (``float`` or ``int``).
    pair : bool
        An ``int`` setting that also accepts two integers (an image shape).
    check : callable, optional
        Extra check ``check(value) -> value`` raising ``ValueError`` with a
        message.
    finite_range : (float, float) or None
        Smallest and largest nonzero magnitude of a ``float`` setting (and of
        the float items of a list); zero is governed by the bounds above.
        Default :data:`FLOAT32_SQUARE_SAFE`; None: any finite float64.
    """

    kind: type
    doc: str = ""
    optional: bool = False
    minimum: float | None = None
    maximum: float | None = None
    greater_than: float | None = None
    choices: tuple | None = None
    unit: str | None = None
    item: type | None = None
    pair: bool = False
    check: Callable | None = None
    finite_range: tuple | None = FLOAT32_SQUARE_SAFE


def setting(default=_MISSING, *, kind: type, doc: str = "", optional: bool | None = None,
            minimum=None, maximum=None, greater_than=None, choices=None, unit=None,
            item=None, pair: bool = False, check=None, default_factory=_MISSING,
            finite_range=FLOAT32_SQUARE_SAFE):
    """A dataclass field carrying a :class:`Spec`.

    ``optional`` defaults to True when the default is None.
    """
    if optional is None:
        optional = default is None
    spec = Spec(kind=kind, doc=doc, optional=optional, minimum=minimum, maximum=maximum,
                greater_than=greater_than, choices=None if choices is None else tuple(choices),
                unit=unit, item=item, pair=pair, check=check,
                finite_range=None if finite_range is None else tuple(finite_range))
    kwargs: dict[str, Any] = {"metadata": {_KEY: spec}}
    if default_factory is not _MISSING:
        kwargs["default_factory"] = default_factory
    else:
        kwargs["default"] = default
    return dataclasses.field(**kwargs)


def specs(cls) -> dict[str, tuple[Spec, Any]]:
    """``name -> (spec, default)`` of the declared settings of a dataclass."""
    out = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_KEY)
        if spec is None:
            continue
        default = f.default if f.default is not _MISSING else (
            f.default_factory() if f.default_factory is not _MISSING else None)
        out[f.name] = (spec, default)
    return out


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_)))


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(v, spec: Spec, name: str, *, integer: bool):
    what = "an integer" if integer else "a number"
    if integer and not _is_int(v):
        raise InputError(f"must be {what}, got {_show(v)}", field=name)
    if not integer and not _is_number(v):
        raise InputError(f"must be {what}, got {_show(v)}", field=name)
    v = int(v) if integer else float(v)
    if not integer and not math.isfinite(v):
        raise InputError(f"must be finite, got {_show(v)}", field=name)
    if spec.greater_than is not None and not v > spec.greater_than:
        raise InputError(f"must be > {spec.greater_than:g}, got {_show(v)}", field=name)
    if spec.minimum is not None and v < spec.minimum:
        raise InputError(f"must be >= {spec.minimum:g}, got {_show(v)}", field=name)
    if spec.maximum is not None and v > spec.maximum:
        raise InputError(f"must be <= {spec.maximum:g}, got {_show(v)}", field=name)
    if not integer and spec.finite_range is not None and v != 0:
        lo, hi = spec.finite_range
        if abs(v) > hi:
            raise InputError(f"must be at most {hi:.3g} in magnitude (larger values overflow "
                             f"in single precision once squared), got {_show(v)}", field=name)
        if abs(v) < lo:
            raise InputError(f"must be {'0 or ' if _zero_allowed(spec) else ''}at least "
                             f"{lo:.3g} in magnitude (smaller values underflow to 0 in single "
                             f"precision once squared), got {_show(v)}", field=name)
    return v


def _zero_allowed(spec: Spec) -> bool:
    return (spec.greater_than is None or spec.greater_than < 0) and \
        (spec.minimum is None or spec.minimum <= 0) and (spec.maximum is None or spec.maximum >= 0)


def check_value(value, spec: Spec, name: str):
    """``value`` checked (and normalised: ``np.float64`` -> ``float``, lists) against ``spec``.

    Raises
    ------
    InputError
        Naming ``name``.
    """
    kind = spec.kind
    # TOML has no null: a number, list or flag that may be unset is unset by "none"
    if (spec.optional and kind is not str and isinstance(value, str)
            and value.strip().lower() == "none"):
        value = None
    if value is None:
        if spec.optional:
            return None
        raise InputError("must be given (None is not allowed)", field=name)
    if kind is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise InputError(f"must be true or false, got {_show(value)}", field=name)
        value = bool(value)
    elif kind is int:
        if spec.pair and isinstance(value, (list, tuple, np.ndarray)):
            items = list(np.asarray(value, dtype=object).reshape(-1)) if isinstance(
                value, np.ndarray) else list(value)
            if len(items) != 2:
                raise InputError(f"must be an integer or two integers, got {_show(value)}",
                                 field=name)
            value = tuple(_number(v, spec, name, integer=True) for v in items)
        else:
            value = _number(value, spec, name, integer=True)
    elif kind is float:
        value = _number(value, spec, name, integer=False)
    elif kind is str:
        if not isinstance(value, str):
            raise InputError(f"must be a text value, got {_show(value)}", field=name)
        if spec.choices is not None and value not in spec.choices:
            raise InputError(f"must be one of {', '.join(map(str, spec.choices))}, got "
                             f"{_show(value)}", field=name)
    elif kind is dict:
        if not isinstance(value, dict):
            raise InputError(f"must be a table of settings, got {_show(value)}", field=name)
        value = dict(value)
    elif kind is list:
        if isinstance(value, np.ndarray):
            if value.ndim != 1:
                raise InputError(f"must be a list, got an array of shape {value.shape}",
                                 field=name)
            value = value.tolist()
        if not isinstance(value, (list, tuple)):
            raise InputError(f"must be a list, got {_show(value)}", field=name)
        if not value:
            raise InputError("must not be empty", field=name)
        item_spec = dataclasses.replace(spec, kind=spec.item or float, optional=False,
                                        check=None)
        value = [check_value(v, item_spec, f"{name}[{i}]") for i, v in enumerate(value)]
    else:  # pragma: no cover - a programming error in a Spec
        raise TypeError(f"unsupported setting kind {kind!r}")
    if spec.choices is not None and kind is not str and value not in spec.choices:
        raise InputError(f"must be one of {', '.join(map(str, spec.choices))}, got "
                         f"{_show(value)}", field=name)
    if spec.check is not None:
        try:
            value = spec.check(value)
        except ValueError as exc:
            raise InputError(str(exc), field=name) from None
    return value


def validate(obj, prefix: str = "") -> None:
    """Check every declared setting of the dataclass instance ``obj`` in place.

    Call it from ``__post_init__``; works on frozen dataclasses.
    """
    for f in dataclasses.fields(obj):
        spec = f.metadata.get(_KEY)
        if spec is None:
            continue
        name = f"{prefix}.{f.name}" if prefix else f.name
        value = check_value(getattr(obj, f.name), spec, name)
        object.__setattr__(obj, f.name, value)


def build(cls, values: dict, prefix: str = ""):
    """``cls(**values)`` with unknown keys and wrong types as InputErrors naming the key."""
    if not isinstance(values, dict):
        raise InputError(f"must be a table of settings, got {_show(values)}",
                         field=prefix or cls.__name__)
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(values) - set(known))
    if unknown:
        name = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise InputError(f"unknown setting{did_you_mean(unknown[0], known)}; known: "
                         f"{', '.join(sorted(known))}", field=name)
    try:
        return cls(**values)
    except InputError as err:
        field = err.field or prefix
        if prefix and field and not field.startswith(prefix + "."):
            field = f"{prefix}.{field}"
        raise InputError(err.message, file=err.file, field=field) from None
