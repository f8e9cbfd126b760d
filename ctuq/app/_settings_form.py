"""Settings forms generated from the settings dataclasses by magicgui.

Every field of a settings dataclass is declared with :func:`ctuq.fields.setting`,
whose :class:`~ctuq.fields.Spec` says its kind, range, choices, unit and help
text. :class:`SettingsForm` turns chosen fields of such a dataclass into
magicgui widgets, one per field:

* choices (the spec's, or an override such as the devices present):
  ``ComboBox``;
* ``bool``: ``CheckBox``;
* ``int``: ``SpinBox`` over ``[minimum, maximum]`` (an int that also takes
  two integers, ``pair``, gets one spin box);
* ``float``: ``FloatSpinBox`` over ``[minimum, maximum]`` (an exclusive
  ``greater_than`` bound becomes the next value shown);
* ``str``: ``LineEdit``;
* optional (None allowed): :class:`AutoOr`, an "auto" tick box beside the
  widget above; ticked means None.

Tables and lists (``dict``, ``list`` settings) are left to TOML files. A class
with sub-tables says which of their fields a form may show by a ``form_specs()``
class method (:func:`form_specs`; ``UncertaintyConfig``: the Laplace settings by
name, the other methods' as ``ivon.lr``, the methods registered at the time as
the choices of ``method``); :meth:`SettingsForm.changed` returns a sub-table's
fields as a table of their own (``{"ivon": {"lr": ...}}``).

The tooltip is the field's key (``dip.iterations``), help text, range and
unit. A number out of range cannot be entered (the spin boxes clamp, and
setting ``widget.value`` out of range raises ``ValueError``); free text (a
device name, a path) is checked by :func:`ctuq.fields.validate` when the
configuration is built, as it is for a TOML file.

A form starts at the field defaults, or at ``defaults`` given to it (the
preset's values for the current image, in the napari widget), and
:meth:`SettingsForm.changed` returns only the values that differ from them: the
overrides a :class:`~ctuq.recon.config.ReconstructionConfig` records.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Iterable

from magicgui.widgets import CheckBox, ComboBox, FloatSpinBox, LineEdit, SpinBox
from magicgui.widgets.bases import ValuedContainerWidget
from qtpy.QtWidgets import QFormLayout, QLabel, QWidget

from ctuq.fields import Spec, specs

__all__ = ["AutoOr", "SettingsForm", "form_fields", "form_specs", "setting_widget"]

log = logging.getLogger(__name__)

#: Field kinds a form can show (dict and list settings are edited in TOML files).
FORM_KINDS = (bool, int, float, str)
#: Bounds of an int field that states none (the range of a 64-bit integer).
_INT_LIMIT = 2**63 - 1
#: Bounds of a float field that states none.
_FLOAT_LIMIT = 1e300


def form_specs(cls) -> dict[str, tuple[Spec, Any]]:
    """``name -> (spec, default)`` of the settings a form of ``cls`` may show.

    :func:`ctuq.fields.specs`, or the class's own ``form_specs()`` where it
    has one: a settings class with sub-tables (``UncertaintyConfig``: each
    method's settings, named ``table.name``) or choices known only at run
    time (the registered uncertainty methods).
    """
    own = getattr(cls, "form_specs", None)
    return own() if callable(own) else specs(cls)


def form_fields(cls) -> list[str]:
    """Names of the declared settings of ``cls`` a form can show, in declaration order."""
    return [name for name, (spec, _) in form_specs(cls).items() if spec.kind in FORM_KINDS]


def label_of(name: str) -> str:
    """A row label from a field name: ``n_samples`` -> ``N samples``."""
    table, _, name = name.rpartition(".")
    text = name.replace("_", " ")
    text = text[:1].upper() + text[1:]
    return f"{text} ({table.replace('_', ' ')})" if table else text


class AutoOr(ValuedContainerWidget):
    """An optional setting: an "auto" tick box (value None) beside the widget of its value.

    Parameters
    ----------
    inner : magicgui ValueWidget
        The widget of the value when "auto" is not ticked (disabled while it is).
    text : str
        Text of the tick box. Default ``'auto'``.
    """

    def __init__(self, inner, *, text: str = "auto", value: Any = None, **kwargs):
        kwargs.setdefault("labels", False)
        kwargs.setdefault("layout", "horizontal")
        super().__init__(nullable=True, **kwargs)
        self.margins = (0, 0, 0, 0)
        self._auto = CheckBox(text=text, value=True, name="auto")
        self._inner = inner
        self._insert_widget(0, self._auto)
        self._insert_widget(1, inner)
        inner.enabled = False
        self._auto.changed.connect(self._on_auto)
        inner.changed.connect(lambda *_: self.changed.emit(self.value))
        self.set_value(value)

    @property
    def auto(self) -> CheckBox:
        """The tick box: ticked means the value is None."""
        return self._auto

    @property
    def inner(self):
        """The widget of the value."""
        return self._inner

    def _on_auto(self, auto: bool) -> None:
        self._inner.enabled = not auto
        self.changed.emit(self.value)

    def get_value(self):
        return None if self._auto.value else self._inner.value

    def set_value(self, value) -> None:
        with self.changed.blocked():
            if value is None:
                self._auto.value = True
            else:
                self._inner.value = value
                self._auto.value = False
        self.changed.emit(self.value)


def _decimals(default, spec: Spec) -> int:
    """Decimals of a float spin box: the default's leading digit and two more."""
    ref = next((abs(float(v)) for v in (default, spec.greater_than, spec.minimum)
                if v is not None and v != 0), None)
    if ref is None:
        return 5
    return int(min(12, max(4, 2 - math.floor(math.log10(ref)))))


def _float_spin(spec: Spec, default, decimals: int | None = None, **kwargs) -> FloatSpinBox:
    box = FloatSpinBox(**kwargs)
    decimals = decimals or _decimals(default, spec)
    box.native.setDecimals(decimals)  # before range and value: Qt rounds them to it
    # a field with no stated bounds still holds only magnitudes the settings accept
    limit = spec.finite_range[1] if spec.finite_range else _FLOAT_LIMIT
    low = spec.minimum if spec.minimum is not None else -limit
    if spec.greater_than is not None:
        low = max(low, spec.greater_than + 10.0**-decimals)
    high = spec.maximum if spec.maximum is not None else limit
    box.min, box.max = low, high
    box.native.setSingleStep(10.0**-(decimals - 2))
    box.value = min(max(float(default), low), high) if default is not None else low
    return box


def _int_spin(spec: Spec, default, **kwargs) -> SpinBox:
    box = SpinBox(**kwargs)
    low = spec.minimum if spec.minimum is not None else -_INT_LIMIT
    if spec.greater_than is not None:
        low = max(low, math.floor(spec.greater_than) + 1)
    high = spec.maximum if spec.maximum is not None else _INT_LIMIT
    box.min, box.max = int(low), int(high)
    box.value = min(max(int(default), box.min), box.max) if default is not None else box.min
    return box


def _tooltip(key: str, spec: Spec, choices) -> str:
    parts = [f"{key}: {spec.doc}".rstrip(": ")]
    if choices is None and spec.kind in (int, float):
        low = (f"> {spec.greater_than:g}" if spec.greater_than is not None else
               f">= {spec.minimum:g}" if spec.minimum is not None else None)
        high = f"<= {spec.maximum:g}" if spec.maximum is not None else None
        bounds = ", ".join(b for b in (low, high) if b)
        if bounds:
            parts.append(f"({bounds}{' ' + spec.unit if spec.unit else ''})")
    elif spec.unit:
        parts.append(f"({spec.unit})")
    if spec.optional:
        parts.append("'auto': not set (the default rule).")
    return " ".join(parts)


def setting_widget(spec: Spec, default, *, name: str, label: str | None = None,
                   key: str | None = None, choices: Iterable | None = None,
                   decimals: int | None = None):
    """The magicgui widget of one setting (see the module docstring for the mapping).

    Parameters
    ----------
    spec : Spec
        The field's spec (:func:`ctuq.fields.specs`).
    default
        The value shown first (None ticks "auto" on an optional field).
    name, label : str
        The widget's name and row label (default: from ``name``).
    key : str, optional
        The setting's key in help texts (``dip.iterations``). Default ``name``.
    choices : iterable, optional
        Choices replacing the spec's (the devices present, for ``device``).
    decimals : int, optional
        Decimals of a float field (default: from the default value).

    An int setting that also takes two integers (``pair``) gets one spin box
    (a single integer is one of its accepted forms).
    """
    if spec.kind not in FORM_KINDS:
        raise TypeError(f"{name}: a form cannot edit a {spec.kind.__name__} setting")
    choices = spec.choices if choices is None else tuple(choices)
    label = label or label_of(name)
    tooltip = _tooltip(key or name, spec, choices)
    common = dict(name=name, label=label, tooltip=tooltip)
    inner_kw = dict(common) if not spec.optional else dict(name=f"{name}_value",
                                                         tooltip=tooltip)
    if choices is not None:
        first = default if default in choices else choices[0]
        widget = ComboBox(choices=list(choices), value=first, **inner_kw)
    elif spec.kind is bool:
        widget = CheckBox(value=bool(default), **inner_kw)
        widget.native.setText("")  # the row label names it (magicgui would repeat it)
    elif spec.kind is int:
        widget = _int_spin(spec, default, **inner_kw)
    elif spec.kind is float:
        widget = _float_spin(spec, default, decimals, **inner_kw)
    else:
        widget = LineEdit(value="" if default is None else str(default), **inner_kw)
    if spec.optional:
        widget = AutoOr(widget, value=default, **common)
    return widget


def shown_value(widget, value):
    """``value`` as ``widget`` would show it (floats rounded to the spin box's decimals)."""
    if isinstance(widget, AutoOr):
        return None if value is None else shown_value(widget.inner, value)
    if isinstance(widget, FloatSpinBox) and value is not None:
        return round(float(value), widget.native.decimals())
    return value


class SettingsForm:
    """A magicgui form of chosen fields of a settings dataclass.

    Parameters
    ----------
    cls : type
        A dataclass whose fields are declared with :func:`ctuq.fields.setting`.
    names : list of str, optional
        The fields, in order. Default: every field a form can show
        (:func:`form_fields`).
    prefix : str
        Key prefix in tooltips (``'dip'`` -> ``dip.iterations``).
    labels : dict, optional
        Row labels by field name (default: from the name).
    choices : dict, optional
        Choices by field name, replacing the spec's.
    defaults : dict, optional
        Starting values by field name, replacing the field defaults.
    decimals : dict, optional
        Decimals of float fields by name (default: from the default value).
    allow_auto : bool
        Give optional fields an "auto" tick box (None). Default True; False
        for a form that always holds a value (the geometry from a file).
    layout : QFormLayout, optional
        Add the rows to this layout (aligned with rows of other forms there)
        instead of a widget of their own.

    Attributes
    ----------
    widgets : dict
        ``name -> magicgui widget``, in order.
    native : QWidget or None
        The rows (a ``QFormLayout``: label, widget); None when ``layout`` was given.
    """

    def __init__(self, cls, names: Iterable[str] | None = None, *, prefix: str = "",
                 labels: dict | None = None, choices: dict | None = None,
                 defaults: dict | None = None, decimals: dict | None = None,
                 allow_auto: bool = True, layout: QFormLayout | None = None):
        declared = form_specs(cls)
        names = form_fields(cls) if names is None else list(names)
        unknown = [n for n in names if n not in declared]
        if unknown:
            raise ValueError(f"{cls.__name__} declares no setting {unknown[0]!r}")
        labels, choices, defaults, decimals = (labels or {}, choices or {}, defaults or {},
                                               decimals or {})
        self.cls = cls
        self.widgets: dict[str, Any] = {}
        for name in names:
            spec, default = declared[name]
            if not allow_auto:
                spec = dataclasses.replace(spec, optional=False)
            self.widgets[name] = setting_widget(
                spec, defaults.get(name, default), name=name, label=labels.get(name),
                key=f"{prefix}.{name}" if prefix else name, choices=choices.get(name),
                decimals=decimals.get(name))
        # a QFormLayout aligns the labels (a magicgui Container lays out each row alone)
        self.native = None if layout is not None else QWidget()
        rows = layout
        if rows is None:
            rows = QFormLayout(self.native)
            rows.setContentsMargins(0, 0, 0, 0)
        for widget in self.widgets.values():
            label = QLabel(widget.label)
            label.setToolTip(widget.tooltip)
            rows.addRow(label, widget.native)
        self._defaults = self.values()

    def values(self) -> dict[str, Any]:
        """Every field's current value."""
        return {name: w.value for name, w in self.widgets.items()}

    def set_values(self, values: dict[str, Any], clip: bool = False) -> None:
        """Set fields by name; a value out of a field's range is a ValueError, or with
        ``clip`` is moved to the nearest bound (with a logged warning)."""
        for name, value in values.items():
            widget = self.widgets[name]
            if clip and isinstance(widget, (SpinBox, FloatSpinBox)) and value is not None:
                inside = min(max(value, widget.min), widget.max)
                if inside != value:
                    log.warning("%s = %s is out of the form's range: %s shown", name, value,
                                inside)
                value = inside
            widget.value = value

    def defaults(self) -> dict[str, Any]:
        """The values the form counts as unchanged (as shown)."""
        return dict(self._defaults)

    def changed(self) -> dict[str, Any]:
        """The fields whose value differs from the defaults: the overrides to record
        (a sub-table's field ``table.name`` as ``{table: {name: value}}``)."""
        out: dict[str, Any] = {}
        for name, value in self.values().items():
            if value == self._defaults[name]:
                continue
            table, _, key = name.rpartition(".")
            if table:
                out.setdefault(table, {})[key] = value
            else:
                out[name] = value
        return out

    def set_defaults(self, defaults: dict[str, Any]) -> None:
        """New defaults (another preset); fields still at their old default follow them."""
        for name, value in defaults.items():
            widget = self.widgets.get(name)
            if widget is None:
                continue
            if widget.value == self._defaults[name]:
                widget.value = value
            self._defaults[name] = shown_value(widget, value)
