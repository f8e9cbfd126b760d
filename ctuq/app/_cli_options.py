"""Command-line options generated from the settings dataclasses.

Every field of :class:`~ctuq.data.io.options.GeometryOptions` and
:class:`~ctuq.data.io.options.ReadOptions` becomes a flag of the same name
(``image_size`` -> ``--image-size``) with its help text and unit, so the CLI,
TOML (``[geometry]``, ``[read]``), the API and sidecar files share one set of
names and one validation (:mod:`ctuq.fields`). A bad value is an
:class:`~ctuq.errors.InputError` naming the flag.
"""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Optional

import typer

from ctuq.errors import InputError
from ctuq.fields import specs


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _groups():
    from ctuq.data.io.options import GeometryOptions, ReadOptions

    return {"geometry": GeometryOptions, "read": ReadOptions}


def _annotation(spec, name: str = ""):
    from ctuq.data.io.options import AUTO_OPTIONS

    if name in AUTO_OPTIONS:
        return Optional[str]  # a number or "auto"
    if spec.kind is bool:
        return Optional[bool]
    if spec.kind is int and not spec.pair:
        return Optional[int]
    if spec.kind is float:
        return Optional[float]
    return Optional[str]  # text, lists ("0,1,2") and pairs ("128" or "128,96")


def _help(spec) -> str:
    text = spec.doc
    if spec.choices:
        text += f" [{' | '.join(map(str, spec.choices))}]"
    if spec.unit:
        text += f" ({spec.unit})"
    if spec.kind is list:
        text += " Comma-separated."
    return text


def _metavar(spec, name: str = "") -> str | None:
    """What the value looks like in ``--help`` (typer would print ``<str>`` for a size)."""
    from ctuq.data.io.options import AUTO_OPTIONS

    if name in AUTO_OPTIONS:
        return "NUMBER|auto"
    if spec.kind is bool:
        return None
    if spec.choices:
        return "|".join(map(str, spec.choices))
    if spec.kind is int:
        return "N[xM]" if spec.pair else "N"
    if spec.kind is float:
        return "NUMBER"
    if spec.kind is list:
        return "A,B,..."
    return "TEXT"


def generated_parameters(groups=("geometry", "read")) -> list[inspect.Parameter]:
    """Keyword-only typer parameters, one per setting of the given groups."""
    params = []
    for group in groups:
        cls = _groups()[group]
        for name, (spec, _default) in specs(cls).items():
            decl = f"{flag(name)}/--no-{name.replace('_', '-')}" if spec.kind is bool \
                else flag(name)
            opt = typer.Option(None, decl, help=_help(spec), metavar=_metavar(spec, name),
                               rich_help_panel=f"{group.capitalize()} options ([{group}])")
            params.append(inspect.Parameter(f"{group}__{name}", inspect.Parameter.KEYWORD_ONLY,
                                            default=opt, annotation=_annotation(spec, name)))
    return params


def with_settings(*groups):
    """Add the generated flags of ``groups`` to a typer command.

    The command receives them in one keyword argument ``settings``:
    ``{"geometry": {...}, "read": {...}}`` holding only the flags given,
    parsed and validated.
    """
    def wrap(func):
        hints = typing.get_type_hints(func)  # resolved in func's module
        sig = inspect.signature(func)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in sig.parameters.values() if p.name != "settings"]
        extra = generated_parameters(groups)

        @functools.wraps(func)
        def command(*args, **kwargs):
            flags = {k: kwargs.pop(k) for k in list(kwargs) if "__" in k}
            return func(*args, settings=parse_settings(flags), **kwargs)

        command.__signature__ = sig.replace(parameters=own + extra)
        command.__annotations__ = {p.name: p.annotation for p in own + extra}
        del command.__wrapped__  # typer must see the new signature, not func's
        return command
    return wrap


def _split(text: str, name: str, item) -> list:
    parts = [p for p in text.replace(";", ",").replace(" ", ",").split(",") if p]
    try:
        return [item(p) for p in parts]
    except ValueError:
        raise InputError(f"must be comma-separated {'integers' if item is int else 'numbers'}, "
                         f"got {text!r}", field=flag(name)) from None


def parse_settings(flags: dict) -> dict:
    """``{"group__name": value}`` from typer -> ``{"geometry": {...}, "read": {...}}``.

    Raises
    ------
    InputError
        A bad value, naming its flag (``--pixel-size: must be > 0, got -1``).
    """
    out: dict = {}
    for key, value in flags.items():
        if value is None:
            continue
        group, name = key.split("__", 1)
        spec = specs(_groups()[group])[name][0]
        if group == "geometry" and isinstance(value, str) and spec.kind is float:
            from ctuq.data.io.options import AUTO, is_auto

            if is_auto(value):
                value = AUTO
            else:
                try:
                    value = float(value)
                except ValueError:
                    raise InputError(f"must be a number or auto, got {value!r}",
                                     field=flag(name)) from None
        if spec.kind is list and isinstance(value, str):
            value = _split(value, name, spec.item or float)
        elif spec.kind is int and spec.pair and isinstance(value, str):
            parts = value.lower().replace("x", ",").split(",")
            if len(parts) > 2 or not all(p.strip() for p in parts):
                raise InputError(f"must be one integer or two (128 or 128x96), got {value!r}",
                                 field=flag(name))
            sizes = _split(",".join(parts), name, int)
            value = sizes[0] if len(sizes) == 1 else sizes
        out.setdefault(group, {})[name] = value
    for group, values in out.items():
        try:
            _groups()[group].from_dict(values, prefix="")
        except InputError as err:
            name = err.field.split(".")[-1].split("[")[0] if err.field else None
            raise InputError(err.message, field=flag(name) if name else None) from None
    return out
