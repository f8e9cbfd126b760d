"""Configuration of a reconstruction: dataclasses, presets by image size, TOML.

A :class:`ReconstructionConfig` states what the user asked for: ``preset =
"auto"`` and a few overrides. :meth:`ReconstructionConfig.resolve` turns it,
for one image size, into the effective settings of every stage; those are
what a result file records.

TOML layout (every key optional)::

    preset = "auto"          # or a U-net preset: reference-28, dip-64, dip-128, dip-256, dip-512
    device = "auto"          # auto | cpu | cuda | cuda:1
    seed = 0
    backend = "auto"         # ray transform: auto | matrix | astra
    noise_std = 0.12         # known noise std (else: file metadata, else estimated)
    noise_model = "gaussian" # gaussian (one σ for every ray) | counts (per-ray variance of
                             # raw counts data) | auto (counts when the data carry it)
    counts_scale = "known"   # counts: σ² from the counts (known) or learned by the EM
    normalize = true         # run on the data divided by their scale (any unit; ctuq.recon.scaling)
    threads = 1              # torch CPU threads (default: the cores no other process is busy on, re-read during the run; Dask workers: 1)

    [dip]                    # any DIPConfig field
    iterations = 2000
    tv_weight = 0.5

    [uncertainty]            # UncertaintyConfig: method, predictive, model error
    method = "laplace"       # or "ivon", "mc-dropout" (ctuq.recon.methods)
    predictive_samples = 64
    model_error = "none"

    [uncertainty.laplace]    # the method's own settings (LaplaceSettings)
    n_samples = 16           # (older files: these keys directly in [uncertainty])
    em_steps = 5
    predcp = true

    [uncertainty.ivon]       # IVONDIPSettings (ctuq.recon.methods.ivon)
    iterations = 300

    [uncertainty.mc_dropout] # MCDropoutSettings (ctuq.recon.methods.mc_dropout)
    dropout = 0.05

    [geometry]               # any GeometryOptions field (ctuq.data.io.options)
    image_size = 128
    angle_unit = "rad"

    [read]                   # any ReadOptions field
    dataset = "/exchange/data"

Every value is checked by :mod:`ctuq.fields` (types, finiteness, ranges,
choices, devices that exist); an error names the key (``dip.iterations``)
and, for a file, the file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctuq.data.io.options import GeometryOptions, ReadOptions
from ctuq.errors import InputError
from ctuq.fields import build, setting, specs, validate
from ctuq.models.unet import PRESETS, preset_name_for_size
from ctuq.recon.dip import AUTO, AUTO_NEEDS_HELDOUT, DIPConfig, check_device
from ctuq.recon.methods.laplace import LaplaceMethod, LaplaceSettings
from ctuq.recon.model_error.names import HELDOUT
from ctuq.recon.model_error.terms import (FLOOR_CHOICES, HELDOUT_NOISE_CHOICES,
                                         MODEL_ERROR_TERMS, HeldoutTerm)
from ctuq.recon.presets import UNCERTAINTY_DEFAULTS
from ctuq.recon.problem import NOISE_MODELS

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Largest TOML settings file read (bytes).
MAX_TOML_BYTES = 1024**2
#: The tables of a ReconstructionConfig (merged key by key).
TABLES = ("dip", "uncertainty", "geometry", "read")
#: Settings that change where and how fast a reconstruction runs, not its meaning.
RUNTIME_ONLY = ("device", "threads")
RUNTIME_ONLY_READ = ("isolate", "read_timeout", "max_memory_gib")
#: ``[dip]`` settings that change how a fit runs on a device, not what it computes.
RUNTIME_ONLY_DIP = ("cuda_graph",)
#: The Laplace settings (:class:`~ctuq.recon.methods.laplace.LaplaceSettings`), also
#: read directly in ``[uncertainty]`` (files written before the method sub-tables).
LAPLACE_ONLY = tuple(f.name for f in dataclasses.fields(LaplaceSettings))
#: Their sub-table, and the method of a run that names none.
FLAT_TABLE = DEFAULT_METHOD = LaplaceMethod.name


#: The model-error term of a default run (chosen on the validation split, docs/defaults.md).
DEFAULT_TERM = HeldoutTerm.name


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _floor_choice(value):
    """``heldout_calibration_floor`` as a choice: the bool of files written when it was
    one is read as ``'on'``/``'off'``; anything else is left for validation."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def _known_method(name: str) -> str:
    from ctuq.recon.methods import METHODS

    if name not in METHODS:
        raise ValueError(f"must be one of {', '.join(METHODS)}, got {name!r}")
    return name


def _method_tables() -> dict[str, type]:
    """``table -> method class`` of the registered methods."""
    from ctuq.recon.methods import METHODS

    return {cls.table_name(): cls for cls in METHODS.values()}


@dataclass(frozen=True, init=False)
class UncertaintyConfig:
    """Settings of the uncertainty method, the predictive and the model error.

    ``method`` picks how the per-pixel std is computed after the DIP+TV fit
    (:data:`ctuq.recon.methods.METHODS`): the linearised Laplace posterior
    with sample-based evidence (``'laplace'``, :mod:`ctuq.recon.methods.laplace`),
    IVON (``'ivon'``: the Adam fit continued by variational learning,
    :mod:`ctuq.recon.methods.ivon`) or MC dropout (``'mc-dropout'``,
    :mod:`ctuq.recon.methods.mc_dropout`). Each method's own settings are a
    sub-table named after it (``[uncertainty.laplace]``, ``[uncertainty.ivon]``,
    ``[uncertainty.mc_dropout]``) and are attributes of the same name here
    (``unc.laplace.n_samples``); :meth:`method_settings` are the chosen
    one's. For files written before the sub-tables, the Laplace settings
    (:data:`LAPLACE_ONLY`) are read directly in ``[uncertainty]`` too, and
    read back as attributes (``unc.n_samples``).

    Parameters
    ----------
    method : str
        The uncertainty method. Default ``'laplace'``.
    predictive_samples : int
        Image-space samples for the std map (IVON: weight samples, MC
        dropout: stochastic passes; both need at least 2). Default 128.
    stored_samples : int
        Posterior image samples kept in the result file. Default 8.
    model_error : str
        The fit's own error beside the posterior: a term of
        :data:`ctuq.recon.model_error.terms.MODEL_ERROR_TERMS` (per scan from
        held-out projections, from coefficients calibrated on simulated
        scans, a conformal scaling of the posterior std, or none; that
        module describes each). Default: the held-out term (chosen on the
        validation split, docs/defaults.md).
    heldout_every : int
        Held-out term: leave out every n-th angle in the second fit. Default 6.
    heldout_min_out : int
        Held-out term: leave out at least this many angles; a scan with few
        angles has every n-th lowered (not below every 3rd) until it does.
        Default 7 (every 4th at 30 angles; chosen on the validation split,
        docs/defaults.md). 0: ``heldout_every`` as given.
    heldout_prior_width : float
        Held-out term: the coefficients are the maximum a posteriori under a
        log-normal prior of this width (natural-log std) centred on the
        calibration (``model_error_file``, or the preset's shipped file; none
        shipped: maximum likelihood). The prior carries the fit where the
        held-out projections cannot see the model error (few angles, much
        noise). 0 turns it off. Default 0.1; ``dip-128``: 0.02 (each chosen on
        the validation split of its size, docs/defaults.md).
    heldout_calibration_floor : str
        Held-out term, with a calibration: when it is also a lower bound. A
        coefficient the calibration found negligible then stays zero (not
        fitted: held-out projections read the data's excess over the noise
        model as a constant pixel error) and each other is at least the
        calibration's, so the held-out fit may widen the calibrated interval,
        never narrow it. ``'auto'``: when the fit leaves more than the noise
        in the data (the mean squared whitened residual of the image shown,
        over all rays, above 1: see :data:`FLOOR_EXCESS`); ``'checked'``: as
        ``'auto'``, but not where the held-out projections reject the floor (their
        log-likelihood at it more than :data:`FLOOR_REJECT_NATS` nats below the
        unfloored fit's); ``'on'``: always; ``'off'``: never. ``True``/``False``
        are read as ``'on'``/``'off'``.
        Default ``'auto'`` (chosen on the validation split: better than
        either on both the realistic and the standard scans); ``dip-64``:
        ``'checked'`` (docs/defaults.md).
    heldout_texture_threshold : float
        Held-out term, with the calibration as a floor: on an image whose
        :func:`~ctuq.recon.model_error.terms.edge_concentration` is below this
        (texture: its gradient spread over every pixel, not carried by a few
        edges), both coefficients are the held-out projections' maximum
        likelihood, the calibration only their lower bound: a coefficient it found
        negligible is fitted rather than held at zero (the fit's error on a
        texture is everywhere, a constant pixel error ``t0``, not only at the
        edges ``s1`` scales) and its centre, fitted on piecewise-constant images,
        does not pull them. 0: never. Default 0; ``dip-64``: 0.35 (chosen on the
        validation split, docs/defaults.md).
    heldout_noise : str
        Held-out term: the noise variance the held-out residuals are read with.
        ``'given'``: the run's ``σ²``. ``'residual'``: ``σ²`` times the fit's
        excess over it (the mean squared whitened residual of the image shown,
        over all rays) where that is above 1 and the consistency check accepts
        the fit: what no image explains on the fitted rays (photon noise heavier
        than its estimate, a scan discretised otherwise) is on the held-out rays
        too, and is then not read as pixel error
        (:func:`~ctuq.recon.model_error.terms.heldout_noise_scale`). A flagged fit
        keeps ``σ²``, so that a wrong geometry still widens the interval.
        Default ``'residual'`` (chosen on the validation split at 64² and 128²,
        docs/defaults.md).
    heldout_correlation_length : float
        Held-out term: the held-out projections are read as sums of pixel
        errors correlated over this many pixels (a Gaussian of this std,
        :func:`ctuq.recon.model_error.heldout.correlated_rows`), not of
        independent ones; the per-pixel variance keeps its form. Default 0
        (independent pixels; docs/real_scans.md has what larger lengths did
        on validation scans).
    heldout_iterations : float
        Held-out term: the second fit's iterations as a fraction of the DIP
        fit's (its learning-rate schedule compressed to them). Default 1.0.
    dip_from_heldout : float
        Held-out term: above 0, the held-out fit runs first and the DIP fit
        on all angles continues from its weights for this fraction of its
        iterations (the held-out fit never sees the held-out rows; the fit
        on all angles reuses its work), on the last part of its learning-rate
        schedule. Default 0 (two separate fits, each from the seeded
        initialisation), except the ``dip-64`` preset's 0.5: 1.5 fits' worth
        instead of 2 and a sharper image (+1.1 dB on validation scans at 1 %
        and 5 % noise, over three DIP seeds; docs/speed.md).
    heldout_beside : bool
        Held-out term, two separate fits (``dip_from_heldout = 0``) and a known
        noise level: the held-out fit runs beside the fit on all angles, one
        torch thread each, where the run has two threads or more, a CPU
        operator held as a matrix and no dropout; the fit on all angles is then
        the one a one-thread run makes. False: after the method, as one fit at
        a time (half the memory of two fits at once). Default True
        (docs/speed.md).
    heldout_input_fallback : bool
        Held-out term, the network's input the TV reconstruction
        (``dip.net_input = 'tv'``, or ``'auto'`` choosing it): where that image
        predicts the left-out angles clearly better than the held-out DIP fit
        made from it (:func:`~ctuq.recon.model_error.terms.input_fallback`), the
        reconstruction shown is the TV image, and the held-out coefficients are
        fitted to its held-out residual; the DIP output stays in the result.
        Default True (on 20 validation runs at 128² it chose the TV image on the
        four ellipse scans, 1.7–7.5 dB better than the fit, and on none of the
        others; docs/dip.md §18).
    model_error_file : str or None
        The calibration of the terms that need one: a file written by
        ``ctuq calibrate``. Default None: the preset's shipped file (only
        for a method whose std the shipped files were fitted with, the
        linearised Laplace one; with another method name a file that
        ``ctuq calibrate`` wrote with that method).
    **tables
        A sub-table per method (``laplace={...}``, ``ivon={...}``,
        ``mc_dropout={...}``: dicts or settings objects) and, for files
        written before them, the Laplace settings by name (``n_samples=8``).
    """

    method: str = setting(DEFAULT_METHOD, kind=str, check=_known_method,
                          doc="Uncertainty method (ctuq.recon.methods): laplace, ivon, "
                              "mc-dropout.")
    predictive_samples: int = setting(128, kind=int, minimum=1, maximum=100_000,
                                      doc="Image samples for the std map.")
    stored_samples: int = setting(8, kind=int, minimum=0, maximum=100_000,
                                  doc="Posterior samples kept in the result file.")
    model_error: str = setting(DEFAULT_TERM, kind=str, choices=tuple(MODEL_ERROR_TERMS),
                               doc="The fit's own error: " + ", ".join(MODEL_ERROR_TERMS) + ".")
    heldout_every: int = setting(6, kind=int, minimum=2, maximum=10_000,
                                 doc="Held-out term: leave out every n-th angle.")
    heldout_min_out: int = setting(7, kind=int, minimum=0, maximum=10_000,
                                   doc="Held-out term: leave out at least this many angles "
                                       "(every n-th lowered, not below 3).")
    heldout_prior_width: float = setting(0.1, kind=float, minimum=0, maximum=100.0,
                                         doc="Held-out term: width (log units) of the "
                                             "calibrated prior on the coefficients; 0: none.")
    heldout_calibration_floor: str = setting(
        "auto", kind=str, choices=FLOOR_CHOICES,
        doc="Held-out term: when the calibration is a lower bound: auto (the fit leaves "
            "more than the noise in the data), checked (auto, unless the held-out "
            "projections reject it), on, off.")
    heldout_texture_threshold: float = setting(
        0.0, kind=float, minimum=0, maximum=1.0,
        doc="Held-out term: below this edge concentration of the image (texture) the "
            "coefficients are the held-out maximum likelihood, the calibration only "
            "their floor; 0: never.")
    heldout_noise: str = setting(
        "residual", kind=str, choices=HELDOUT_NOISE_CHOICES,
        doc="Held-out term: noise variance of the held-out residuals: given (the run's), "
            "residual (times the fit's excess, for a fit the consistency check accepts).")
    heldout_correlation_length: float = setting(
        0.0, kind=float, minimum=0, maximum=64.0,
        doc="Held-out term: pixel errors correlated over this many pixels (a Gaussian's std).")
    heldout_iterations: float = setting(1.0, kind=float, greater_than=0, maximum=1.0,
                                        doc="Held-out term: the second fit's iterations, a "
                                            "fraction of the DIP fit's.")
    dip_from_heldout: float = setting(0.0, kind=float, minimum=0, maximum=1.0,
                                      doc="Held-out term: >0: the DIP fit continues from the "
                                          "held-out fit for this fraction of its iterations.")
    heldout_beside: bool = setting(True, kind=bool,
                                   doc="Held-out term, two separate fits, known noise: the "
                                       "held-out fit beside the fit on all angles.")
    heldout_input_fallback: bool = setting(
        True, kind=bool,
        doc="Held-out term, TV input: show the TV image where it predicts the left-out "
            "angles clearly better than the DIP fit from it.")
    model_error_file: str | None = setting(None, kind=str,
                                           doc="A ctuq calibrate file (terms that need one).")
    #: ``table -> settings object`` of every registered method.
    tables: dict = field(default_factory=dict, compare=True)

    def __init__(self, method: str = DEFAULT_METHOD, predictive_samples: int = 128,
                 stored_samples: int = 8, model_error: str = DEFAULT_TERM,
                 heldout_every: int = 6, heldout_min_out: int = 7,
                 heldout_prior_width: float = 0.1, model_error_file: str | None = None,
                 tables: dict | None = None, heldout_iterations: float = 1.0,
                 dip_from_heldout: float = 0.0, heldout_beside: bool = True,
                 heldout_correlation_length: float = 0.0,
                 heldout_calibration_floor: str | bool = "auto",
                 heldout_noise: str = "residual", heldout_texture_threshold: float = 0.0,
                 heldout_input_fallback: bool = True, **given):
        for name, value in (("method", method), ("predictive_samples", predictive_samples),
                            ("stored_samples", stored_samples), ("model_error", model_error),
                            ("heldout_every", heldout_every), ("heldout_min_out", heldout_min_out),
                            ("heldout_prior_width", heldout_prior_width),
                            ("model_error_file", model_error_file),
                            ("heldout_iterations", heldout_iterations),
                            ("dip_from_heldout", dip_from_heldout),
                            ("heldout_beside", heldout_beside),
                            ("heldout_correlation_length", heldout_correlation_length),
                            ("heldout_calibration_floor",
                             _floor_choice(heldout_calibration_floor)),
                            ("heldout_noise", heldout_noise),
                            ("heldout_texture_threshold", heldout_texture_threshold),
                            ("heldout_input_fallback", heldout_input_fallback)):
            object.__setattr__(self, name, value)
        validate(self, prefix="uncertainty")
        object.__setattr__(self, "tables", _build_tables(tables or {}, given))
        self._check()

    def _check(self):
        cls = self.method_class
        if self.predictive_samples < cls.min_predictive_samples:
            raise InputError(f"method {self.method!r} needs at least "
                             f"{cls.min_predictive_samples} samples for a std, got "
                             f"{self.predictive_samples}", field="uncertainty.predictive_samples")
        need = cls.required_model_error(self.method_settings)
        if need is not None and self.model_error != need:
            raise InputError(f"the settings of method {self.method!r} need model_error = "
                             f"{need!r}, got {self.model_error!r}",
                             field="uncertainty.model_error")
        if MODEL_ERROR_TERMS[self.model_error].needs_calibration \
                and not cls.shipped_calibration and self.model_error_file is None:
            raise InputError(
                f"model_error {self.model_error!r} with method {self.method!r} needs a "
                "model_error_file calibrated for it (ctuq calibrate --config with that "
                "method): the shipped files were fitted with the linearised posterior's std; "
                f"or use model_error {DEFAULT_TERM!r} or 'none'",
                field="uncertainty.model_error_file")

    def __getattr__(self, name: str):
        # only called for names that are not fields: a method's table, or (files
        # written before the tables) a Laplace setting by name
        if name.startswith("__") or name == "tables":
            raise AttributeError(name)
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        if name in LAPLACE_ONLY and FLAT_TABLE in tables:
            return getattr(tables[FLAT_TABLE], name)
        raise AttributeError(f"UncertaintyConfig has no setting {name!r}")

    @property
    def method_class(self) -> type:
        """The chosen method's class (:data:`ctuq.recon.methods.METHODS`)."""
        from ctuq.recon.methods import method_class

        return method_class(self.method)

    @property
    def method_settings(self):
        """The chosen method's settings object."""
        return self.tables[self.method_class.table_name()]

    def make_method(self):
        """The chosen method, with its settings (:func:`ctuq.recon.methods.make_method`)."""
        return self.method_class(self.method_settings)

    def common(self) -> dict[str, Any]:
        """The settings of every method (not in a sub-table), as a plain dict."""
        return {name: _plain(getattr(self, name)) for name in specs(type(self))}

    def effective(self) -> dict[str, Any]:
        """What a result records: :meth:`common` and the chosen method's sub-table."""
        return {**self.common(),
                self.method_class.table_name(): _plain_settings(self.method_settings)}

    @staticmethod
    def canonical(d: dict[str, Any]) -> dict[str, Any]:
        """``d`` (a ``[uncertainty]`` table) with flat Laplace keys moved into ``laplace``.

        Raises
        ------
        InputError
            A key given both directly and in the sub-table.
        """
        out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()
               if k not in LAPLACE_ONLY}
        flat = {k: v for k, v in d.items() if k in LAPLACE_ONLY}
        if flat:
            table = dict(out.get(FLAT_TABLE) or {})
            twice = sorted(set(flat) & set(table))
            if twice:
                raise InputError("given both in [uncertainty] and in [uncertainty.laplace]",
                                 field=f"uncertainty.{twice[0]}")
            out[FLAT_TABLE] = {**table, **flat}
        return out

    @classmethod
    def merge(cls, base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
        """``overrides`` on top of ``base`` (two ``[uncertainty]`` tables), sub-table by
        sub-table; two flat tables stay flat."""
        if not (_nested(base) or _nested(overrides)):
            return {**base, **overrides}
        out = cls.canonical(base)
        for key, value in cls.canonical(overrides).items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            else:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], prefix: str = "uncertainty") -> "UncertaintyConfig":
        """From a ``[uncertainty]`` table; unknown keys and bad values name the key."""
        if not isinstance(d, dict):
            raise InputError(f"must be a table of settings, got {d!r}", field=prefix)
        try:
            return cls(**d)
        except TypeError as err:  # a repeated key reached __init__
            raise InputError(str(err), field=prefix) from None

    def plain(self, given: dict[str, Any]) -> dict[str, Any]:
        """The keys of ``given`` with this config's checked, plain (JSON-able) values."""
        out = {}
        for key, value in given.items():
            if key in self.tables and isinstance(value, dict):
                out[key] = {k: _plain(getattr(self.tables[key], k)) for k in value}
            elif key in self.tables:
                out[key] = _plain_settings(self.tables[key])
            else:
                out[key] = _plain(getattr(self, key))
        return out

    @classmethod
    def form_specs(cls) -> dict[str, tuple]:
        """``name -> (Spec, default)`` for settings forms: the common settings (the
        method's choices from the registry), the Laplace settings by name and
        the other methods' as ``table.name``."""
        from ctuq.recon.methods import METHODS

        out = {}
        for name, (spec, default) in specs(cls).items():
            if name == "method":
                spec = dataclasses.replace(spec, choices=tuple(METHODS), check=None)
            out[name] = (spec, default)
        for table, mcls in _method_tables().items():
            for name, entry in specs(mcls.settings_class).items():
                out[name if table == FLAT_TABLE else f"{table}.{name}"] = entry
        return out


def _nested(d: dict) -> bool:
    return any(isinstance(v, dict) for v in d.values())


def _plain_settings(settings) -> dict[str, Any]:
    return {f.name: _plain(getattr(settings, f.name)) for f in dataclasses.fields(settings)}


def _build_tables(tables: dict, given: dict) -> dict:
    """The settings object of every registered method from ``tables`` (objects or
    dicts, e.g. from :func:`dataclasses.replace`) and the keyword arguments."""
    known = _method_tables()
    flat = {k: v for k, v in given.items() if k in LAPLACE_ONLY}
    unknown = sorted(set(given) - set(flat) - set(known))
    if unknown:
        names = sorted({*specs(UncertaintyConfig), *known, *LAPLACE_ONLY})
        raise InputError(f"unknown setting; known: {', '.join(names)}",
                         field=f"uncertainty.{unknown[0]}")
    out = {}
    for table, mcls in known.items():
        base = tables.get(table)
        over = given.get(table)
        if table == FLAT_TABLE and flat:
            over = UncertaintyConfig.canonical({**flat, table: dict(over or {})})[table]
        if over is not None and not isinstance(over, (dict, mcls.settings_class)):
            raise InputError(f"must be a table of settings, got {over!r}",
                             field=f"uncertainty.{table}")
        if isinstance(over, mcls.settings_class):
            base, over = over, None
        values = _plain_settings(base) if isinstance(base, mcls.settings_class) else dict(
            base or {})
        values.update(over or {})
        try:
            out[table] = build(mcls.settings_class, values, prefix=f"uncertainty.{table}")
        except InputError as err:
            key = (err.field or "").rpartition(".")[2]
            if key in flat:  # a setting given directly in [uncertainty]: name it so
                raise InputError(err.message, file=err.file, field=f"uncertainty.{key}") \
                    from None
            raise
    return out


@dataclass(frozen=True)
class ReconstructionConfig:
    """What the user asked for; see the module docstring for the TOML form.

    Parameters
    ----------
    preset : str
        ``'auto'`` (by image size) or a U-net preset name. Default ``'auto'``.
    device : str
        ``'auto'``, ``'cpu'``, ``'cuda'``… Default ``'auto'``.
    seed : int
        Seed of every random draw. Default 0.
    backend : {'auto', 'matrix', 'astra'}
        Ray-transform backend. Default ``'auto'``.
    noise_std : float or None
        Known noise std of the sinogram. Default None (from the file's
        metadata, else estimated from the data).
    noise_model : {'gaussian', 'counts', 'auto'}
        ``'gaussian'`` (default): every ray has the noise variance ``σ²``.
        ``'counts'``: ray ``i`` has ``σ² v_i`` with ``v`` (mean 1) and ``σ²``
        from the delta-method variances of line integrals derived from photon
        counts (raw NXtomo/DXchange data with flat frames,
        :attr:`ctuq.data.io.Sinogram.variance`; an error for other data).
        ``'auto'``: ``'counts'`` when the data carry those variances, else
        ``'gaussian'``. See docs/method.md.
    counts_scale : {'known', 'learned'}
        With the count noise model: ``σ²`` (the mean delta-method variance)
        is known (the counts are photons), or only its shape ``v`` is and the
        Laplace EM learns ``σ²`` (an unknown detector gain scales every
        variance). Default ``'known'``.
    normalize : bool
        Run on the data divided by their scale and give every output back in
        data units (:mod:`ctuq.recon.scaling`), so that the result of ``c·y`` is
        ``c`` times that of ``y`` whatever the unit of the data. Default True
        (False: the data as given; the network's output range is (0, 1)).
    dip : dict
        Overrides of :class:`~ctuq.recon.dip.DIPConfig` fields.
    uncertainty : dict
        Overrides of :class:`UncertaintyConfig` fields.
    """

    preset: str = setting("auto", kind=str, choices=("auto", *sorted(PRESETS)),
                          doc="U-net preset, or auto (by image size).")
    device: str = setting("auto", kind=str, check=check_device,
                          doc="auto, cpu, cuda or cuda:N (must exist on this machine).")
    seed: int = setting(0, kind=int, minimum=0, maximum=2**63 - 1,
                        doc="Seed of every random draw.")
    backend: str = setting("auto", kind=str, choices=("auto", "matrix", "astra"),
                           doc="Ray-transform backend.")
    noise_std: float | None = setting(None, kind=float, greater_than=0, maximum=1e30,
                                      doc="Known noise std of the sinogram.")
    noise_model: str = setting("gaussian", kind=str, choices=NOISE_MODELS,
                               doc="gaussian (one sigma), counts (per-ray variance of raw "
                                   "counts) or auto.")
    counts_scale: str = setting("known", kind=str, choices=("known", "learned"),
                                doc="Count noise: sigma^2 known from the counts, or learned.")
    normalize: bool = setting(True, kind=bool,
                              doc="Reconstruct the data divided by their scale (any unit).")
    threads: int | None = setting(None, kind=int, minimum=1, maximum=4096,
                                  doc="torch CPU threads (default: the free cores, re-read "
                                      "during the run; a Dask worker gets 1). A pinned count "
                                      "gives bit-identical results.")
    dip: dict = setting(default_factory=dict, kind=dict, doc="Overrides of DIPConfig fields.")
    uncertainty: dict = setting(default_factory=dict, kind=dict,
                                doc="Overrides of UncertaintyConfig fields.")
    geometry: dict = setting(default_factory=dict, kind=dict,
                             doc="Geometry options (ctuq.data.io.options.GeometryOptions).")
    read: dict = setting(default_factory=dict, kind=dict,
                         doc="Read options (ctuq.data.io.options.ReadOptions).")

    def __post_init__(self):
        validate(self)
        for name, cls in (("dip", DIPConfig), ("uncertainty", UncertaintyConfig),
                          ("geometry", GeometryOptions), ("read", ReadOptions)):
            given = getattr(self, name)
            if cls is UncertaintyConfig:  # method sub-tables
                # against the defaults of every preset, so that a key given twice is caught
                checked = UncertaintyConfig.from_dict(given)
                object.__setattr__(self, name, checked.plain(given))
                continue
            checked = build(cls, given, prefix=name)  # check the values now
            # keep the overrides as given, in their checked plain form (JSON-able)
            object.__setattr__(self, name, {
                k: (given[k] if k == "unet" else _plain(getattr(checked, k))) for k in given})

    @property
    def geometry_options(self) -> GeometryOptions:
        return GeometryOptions.from_dict(self.geometry)

    @property
    def read_options(self) -> ReadOptions:
        return ReadOptions.from_dict(self.read)

    # -- construction -----------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReconstructionConfig":
        """From a plain dict (a TOML document); unknown keys and bad values name the key."""
        return build(cls, d)

    @classmethod
    def from_toml(cls, path, base: "ReconstructionConfig | None" = None) -> "ReconstructionConfig":
        """Read a TOML file; its keys override ``base`` (default: the defaults)."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_TOML_BYTES + 1)
        except FileNotFoundError:
            raise InputError("no such config file", file=path, field="--config") from None
        except IsADirectoryError:
            raise InputError("is a directory, not a config file", file=path,
                             field="--config") from None
        except OSError as err:
            raise InputError(f"cannot read the config file ({err.strerror or err})", file=path,
                             field="--config") from None
        if len(raw) > MAX_TOML_BYTES:
            raise InputError(f"is larger than {MAX_TOML_BYTES // 1024} KiB: not a settings file",
                             file=path, field="--config")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"not a TOML text file: byte {err.start} is not UTF-8 (binary, or "
                             "UTF-16? save it as UTF-8)", file=path, field="--config") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise InputError(f"not valid TOML: {err}", file=path, field="--config") from None
        try:
            return (base or cls()).merged(data)
        except InputError as err:
            raise InputError(err.message, file=path, field=err.field) from None

    def merged(self, overrides: dict[str, Any]) -> "ReconstructionConfig":
        """A copy with ``overrides`` applied (tables are merged key by key)."""
        d = self.to_dict()
        for key, value in overrides.items():
            if key == "uncertainty" and isinstance(value, dict):
                d[key] = UncertaintyConfig.merge(d[key], value)
            elif key in TABLES and isinstance(value, dict):
                d[key] = {**d[key], **value}
            else:
                d[key] = value
        return ReconstructionConfig.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "device": self.device, "seed": self.seed,
                "backend": self.backend, "noise_std": self.noise_std,
                "noise_model": self.noise_model, "counts_scale": self.counts_scale,
                "threads": self.threads, "normalize": self.normalize,
                "dip": dict(self.dip), "uncertainty": dict(self.uncertainty),
                "geometry": dict(self.geometry), "read": dict(self.read)}

    def result_affecting(self) -> dict[str, Any]:
        """:meth:`to_dict` without the settings that do not change the numbers'
        meaning (device, threads, how a file is read safely): what a resumed
        batch compares with the settings stored in an existing result."""
        d = self.to_dict()
        for key in RUNTIME_ONLY:
            d.pop(key, None)
        # one form for the Laplace settings, whether given in [uncertainty] (older
        # files) or in [uncertainty.laplace]
        d["uncertainty"] = UncertaintyConfig.canonical(d["uncertainty"])
        d["read"] = {k: v for k, v in d["read"].items() if k not in RUNTIME_ONLY_READ}
        d["dip"] = {k: v for k, v in d["dip"].items() if k not in RUNTIME_ONLY_DIP}
        return d

    # -- resolution for one image ------------------------------------------
    def preset_for(self, image_shape) -> str:
        return preset_name_for_size(image_shape) if self.preset == "auto" else self.preset

    def resolve(self, image_shape) -> tuple[DIPConfig, UncertaintyConfig]:
        """The effective stage settings for an image of shape ``image_shape``."""
        name = self.preset_for(image_shape)
        try:
            dip = DIPConfig.preset_defaults(name, **{"seed": self.seed, "device": self.device,
                                                     **self.dip})
            unc = UncertaintyConfig.from_dict(UncertaintyConfig.merge(
                UncertaintyConfig.canonical(UNCERTAINTY_DEFAULTS.get(name, {})),
                self.uncertainty))
        except TypeError as err:  # a value of the wrong type reached a dataclass
            raise InputError(str(err), field="config") from None
        if dip.net_input == AUTO and unc.model_error != HELDOUT:
            raise InputError(f"{AUTO_NEEDS_HELDOUT}, got {unc.model_error!r}",
                             field="dip.net_input")
        return dip, unc
