"""The uncertainty methods of the pipeline, behind one interface (:mod:`.base`).

:data:`METHODS` maps ``[uncertainty] method`` to a class; each reads its own
settings from ``[uncertainty.<table>]`` and returns an
:class:`~ctuq.recon.methods.base.UncertaintyOutcome`. A new method is one
module with a subclass of :class:`~ctuq.recon.methods.base.UncertaintyMethod`
and one :func:`register` line (docs/method.md, "Adding an uncertainty method").
"""

from __future__ import annotations

from ctuq.errors import InputError
from ctuq.recon.methods.base import NoSettings, UncertaintyMethod, UncertaintyOutcome
from ctuq.recon.methods.ivon import IVONDIPSettings, IVONMethod
from ctuq.recon.methods.laplace import LaplaceMethod, LaplaceSettings
from ctuq.recon.methods.mc_dropout import MCDropoutMethod, MCDropoutSettings

__all__ = ["METHODS", "register", "make_method", "method_class", "UncertaintyMethod",
           "UncertaintyOutcome", "NoSettings", "LaplaceSettings", "IVONDIPSettings",
           "MCDropoutSettings", "DEFAULT_METHOD"]

#: The uncertainty methods by name, in the order forms list them.
METHODS: dict[str, type[UncertaintyMethod]] = {}
#: ``[uncertainty] method`` when none is given.
DEFAULT_METHOD = LaplaceMethod.name


def register(cls: type[UncertaintyMethod]) -> type[UncertaintyMethod]:
    """Add a method to :data:`METHODS` (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, UncertaintyMethod) and cls.name):
        raise TypeError(f"{cls!r} is not an UncertaintyMethod with a name")
    METHODS[cls.name] = cls
    return cls


def method_class(name: str) -> type[UncertaintyMethod]:
    """The class of method ``name``; an unknown name is an InputError."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise InputError(f"must be one of {', '.join(METHODS)}, got {name!r}",
                         field="uncertainty.method") from None


def make_method(name: str, settings=None) -> UncertaintyMethod:
    """Method ``name`` with ``settings`` (its settings class, or a dict of it; default: its defaults)."""
    from ctuq.fields import build

    cls = method_class(name)
    if isinstance(settings, dict):
        settings = build(cls.settings_class, settings, prefix=f"uncertainty.{cls.table_name()}")
    return cls(settings)


register(LaplaceMethod)
register(IVONMethod)
register(MCDropoutMethod)
