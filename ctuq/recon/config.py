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
    threads = 1              # torch CPU threads (default: all cores; Dask workers: 1)

    [dip]                    # any DIPConfig field
    iterations = 2000
    tv_weight = 0.5

    [uncertainty]            # any UncertaintyConfig field
    method = "laplace"       # or "ivon" (variational, ctuq.recon.ivon_dip)
    n_samples = 16
    em_steps = 5
    predcp = true

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctuq.data.io.options import GeometryOptions, ReadOptions
from ctuq.errors import InputError
from ctuq.fields import build, setting, validate
from ctuq.models.unet import PRESETS, preset_name_for_size
from ctuq.recon.dip import DIPConfig, check_device
from ctuq.recon.presets import UNCERTAINTY_DEFAULTS

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
#: UncertaintyConfig fields that only the linearised Laplace method reads
#: (ignored with ``method = 'ivon'``).
LAPLACE_ONLY = ("prior", "sampler", "n_samples", "em_steps", "em_tol", "update", "learn_noise",
                "predcp", "predcp_scale", "predcp_samples", "cg_tol", "cg_max_iter",
                "preconditioner_rank", "sto_batch_size", "sto_iterations")


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class UncertaintyConfig:
    """Settings of the uncertainty method, its hyperparameters and the predictive.

    ``method`` picks how the per-pixel std is computed after the DIP+TV fit:
    the linearised Laplace posterior with sample-based evidence (``'laplace'``,
    every field below applies), or IVON (``'ivon'``): the Adam fit continued
    by variational learning, the std from samples of its weight posterior
    (:mod:`ctuq.recon.ivon_dip`, settings chosen on validation data,
    ``docs/ivon.md``). With ``'ivon'`` only ``predictive_samples`` (weight
    samples for the std map, at least 2), ``stored_samples`` and the
    model-error fields apply; the Laplace-only fields (:data:`LAPLACE_ONLY`:
    prior, sampler, EM, PredCP, CG and sample-then-optimise settings) are
    ignored, and the result's effective config lists them as unused.

    Parameters
    ----------
    method : {'laplace', 'ivon'}
        The uncertainty method. Default ``'laplace'``.
    prior : {'matern', 'ard', 'gprior'}
        Block prior: Matérn-½ filter covariance per 3×3 block (reference),
        isotropic per-block ARD, or the g-prior. Default ``'gprior'`` (better
        calibrated in every measurement, see ``docs/evidence.md``).
    sampler : {'cg', 'sto'}
        Matheron samples with preconditioned CG in observation space, or
        sample-then-optimise in parameter space. Default ``'cg'``.
    n_samples : int
        Posterior samples per EM step (k). Default 16.
    em_steps : int
        Maximum EM steps. Default 6.
    em_tol : float
        Stop when every log-hyperparameter moves less than this. Default 0.02.
    update : {'mackay', 'em'}
        M-step of the per-block variances. Default ``'mackay'``.
    learn_noise : bool
        Update σ² in the M-step; when False σ² stays at the known noise
        variance. Default False when the noise level is known, else True
        (``None``: decide by that rule).
    predcp : bool
        TV-PredCP hyperprior (the EM then maximises evidence + its
        log-density, a MAP-II). Default False: chosen on the validation
        split, where it narrowed the posterior, lowered the log-likelihood and
        doubled the posterior time without changing the coverage once the
        model error is added (docs/defaults.md).
    predcp_scale : float
        Hyperprior weight ``predcp_scale · d_y · γ_ref`` (reference: 1 at 28²). Default 1.
    predcp_samples : int
        Samples of the reparameterised κ estimator. Default 32.
    predictive_samples : int
        Image-space samples for the std map (``'ivon'``: weight samples).
        Default 128.
    stored_samples : int
        Posterior image samples kept in the result file. Default 8.
    cg_tol : float
        Relative residual of the CG solves. Default 1e-3.
    cg_max_iter : int
        CG iteration cap. Default 200.
    preconditioner_rank : int
        Rank of the Nyström preconditioner. Default 100 (the presets for
        64² and larger raise it, see :mod:`ctuq.recon.presets`).
    sto_batch_size : int or None
        ``sampler = 'sto'``: projection angles per sample-then-optimise step
        (mini-batched; the data term is rescaled so the gradient is
        unbiased, and every step of ``sto_iterations`` runs). Default None:
        all angles (full batch, stopping early at its tolerance).
    sto_iterations : int
        ``sampler = 'sto'``: most steps per solve. Default 1000.
    model_error : {'heldout', 'calibrated', 'conformal', 'none'}
        The fit's own error beside the posterior (:mod:`ctuq.recon.model_error`):
        per scan from held-out projections, from coefficients calibrated on
        simulated scans (``model_error_file``, or the preset's shipped file),
        a conformal scaling of the posterior std from the same file, or none.
        Default ``'heldout'`` (chosen on the validation split,
        docs/defaults.md).
    heldout_every : int
        ``'heldout'``: leave out every n-th angle in the second fit. Default 6.
    heldout_min_out : int
        ``'heldout'``: leave out at least this many angles; a scan with few
        angles has every n-th lowered (not below every 3rd) until it does.
        Default 7 (every 4th at 30 angles; chosen on the validation split,
        docs/defaults.md). 0: ``heldout_every`` as given.
    heldout_prior_width : float
        ``'heldout'``: the coefficients are the maximum a posteriori under a
        log-normal prior of this width (natural-log std) centred on the
        calibration (``model_error_file``, or the preset's shipped file; none
        shipped: maximum likelihood). The prior carries the fit where the
        held-out projections cannot see the model error (few angles, much
        noise). 0 turns it off. Default 0.1 (chosen on the validation split,
        docs/defaults.md).
    model_error_file : str or None
        ``'calibrated'``/``'conformal'``: a file written by ``ctuq calibrate``.
        Default None: the preset's shipped file (``'laplace'`` only: the
        shipped files were fitted with the linearised posterior's std; with
        ``'ivon'`` name a file that ``ctuq calibrate`` wrote with
        ``method = 'ivon'``).
    """

    method: str = setting("laplace", kind=str, choices=("laplace", "ivon"),
                          doc="Uncertainty method: laplace (linearised) or ivon (variational).")
    prior: str = setting("gprior", kind=str, choices=("matern", "ard", "gprior"),
                         doc="Block prior: matern, ard or gprior.")
    sampler: str = setting("cg", kind=str, choices=("cg", "sto"),
                           doc="Posterior sampler: cg (Matheron) or sto.")
    n_samples: int = setting(16, kind=int, minimum=1, maximum=10_000,
                             doc="Posterior samples per EM step.")
    em_steps: int = setting(6, kind=int, minimum=1, maximum=1000, doc="Maximum EM steps.")
    em_tol: float = setting(0.02, kind=float, minimum=0, maximum=1e6,
                            doc="Stop when every log-hyperparameter moves less.")
    update: str = setting("mackay", kind=str, choices=("mackay", "em"),
                          doc="M-step of the per-block variances.")
    learn_noise: bool | None = setting(None, kind=bool,
                                       doc="Update the noise variance (default: when unknown).")
    predcp: bool = setting(False, kind=bool, doc="TV-PredCP hyperprior (MAP-II).")
    predcp_scale: float = setting(1.0, kind=float, minimum=0, maximum=1e6,
                                  doc="Weight of the TV-PredCP hyperprior.")
    predcp_samples: int = setting(32, kind=int, minimum=1, maximum=10_000,
                                  doc="Samples of the PredCP estimator.")
    predictive_samples: int = setting(128, kind=int, minimum=1, maximum=100_000,
                                      doc="Image samples for the std map.")
    stored_samples: int = setting(8, kind=int, minimum=0, maximum=100_000,
                                  doc="Posterior samples kept in the result file.")
    cg_tol: float = setting(1e-3, kind=float, minimum=0, maximum=1.0,
                            doc="Relative residual of the CG solves.")
    cg_max_iter: int = setting(200, kind=int, minimum=1, maximum=100_000,
                               doc="CG iteration cap.")
    preconditioner_rank: int = setting(100, kind=int, minimum=1, maximum=100_000,
                                       doc="Rank of the Nystrom preconditioner.")
    sto_batch_size: int | None = setting(None, kind=int, minimum=1, maximum=10**7,
                                         doc="sto: projection angles per step (default: all).")
    sto_iterations: int = setting(1000, kind=int, minimum=1, maximum=10**7,
                                  doc="sto: most steps per solve.")
    model_error: str = setting("heldout", kind=str,
                               choices=("heldout", "calibrated", "conformal", "none"),
                               doc="The fit's own error: heldout, calibrated, conformal, none.")
    heldout_every: int = setting(6, kind=int, minimum=2, maximum=10_000,
                                 doc="heldout: leave out every n-th angle.")
    heldout_min_out: int = setting(7, kind=int, minimum=0, maximum=10_000,
                                   doc="heldout: leave out at least this many angles "
                                       "(every n-th lowered, not below 3).")
    heldout_prior_width: float = setting(0.1, kind=float, minimum=0, maximum=100.0,
                                         doc="heldout: width (log units) of the calibrated "
                                             "prior on the coefficients; 0: none.")
    model_error_file: str | None = setting(None, kind=str,
                                           doc="calibrated/conformal: a ctuq calibrate file.")

    def __post_init__(self):
        validate(self, prefix="uncertainty")
        if self.method == "ivon":
            if self.predictive_samples < 2:
                raise InputError("method 'ivon' needs at least 2 weight samples for a std, got "
                                 f"{self.predictive_samples}",
                                 field="uncertainty.predictive_samples")
            if self.model_error in ("calibrated", "conformal") and self.model_error_file is None:
                raise InputError(
                    f"model_error {self.model_error!r} with method 'ivon' needs a "
                    "model_error_file calibrated for IVON (ctuq calibrate --config with "
                    "method = 'ivon'): the shipped files were fitted with the linearised "
                    "posterior's std; or use model_error 'heldout' or 'none'",
                    field="uncertainty.model_error_file")


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
    threads: int | None = setting(None, kind=int, minimum=1, maximum=4096,
                                  doc="torch CPU threads (default: all cores; a Dask worker "
                                      "gets 1). Equal counts give bit-identical results.")
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
            if key in TABLES and isinstance(value, dict):
                d[key] = {**d[key], **value}
            else:
                d[key] = value
        return ReconstructionConfig.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "device": self.device, "seed": self.seed,
                "backend": self.backend, "noise_std": self.noise_std, "threads": self.threads,
                "dip": dict(self.dip), "uncertainty": dict(self.uncertainty),
                "geometry": dict(self.geometry), "read": dict(self.read)}

    def result_affecting(self) -> dict[str, Any]:
        """:meth:`to_dict` without the settings that do not change the numbers'
        meaning (device, threads, how a file is read safely): what a resumed
        batch compares with the settings stored in an existing result."""
        d = self.to_dict()
        for key in RUNTIME_ONLY:
            d.pop(key, None)
        d["read"] = {k: v for k, v in d["read"].items() if k not in RUNTIME_ONLY_READ}
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
            unc = UncertaintyConfig(**{**UNCERTAINTY_DEFAULTS.get(name, {}), **self.uncertainty})
        except TypeError as err:  # a value of the wrong type reached a dataclass
            raise InputError(str(err), field="config") from None
        return dip, unc
