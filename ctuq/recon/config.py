"""Configuration of a reconstruction: dataclasses, presets by image size, TOML.

A :class:`ReconstructionConfig` states what the user asked for: ``preset =
"auto"`` and a few overrides. :meth:`ReconstructionConfig.resolve` turns it,
for one image size, into the effective settings of every stage; those are
what a result file records.

TOML layout (every key optional)::

    preset = "auto"          # or a U-net preset: reference-28, dip-64, dip-128, dip-256
    device = "auto"          # auto | cpu | cuda | cuda:1
    seed = 0
    backend = "auto"         # ray transform: auto | matrix | astra
    noise_std = 0.12         # known noise std (else: file metadata, else estimated)

    [dip]                    # any DIPConfig field
    iterations = 2000
    tv_weight = 0.5

    [uncertainty]            # any UncertaintyConfig field
    n_samples = 16
    em_steps = 5
    predcp = true
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctuq.errors import InputError
from ctuq.models.unet import PRESETS, preset_name_for_size
from ctuq.recon.dip import DIPConfig

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class UncertaintyConfig:
    """Settings of the linearised posterior, its hyperparameters and the predictive.

    Parameters
    ----------
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
        TV-PredCP hyperprior. Default True.
    predcp_scale : float
        Hyperprior weight ``predcp_scale · d_y · γ_ref`` (reference: 1 at 28²). Default 1.
    predcp_samples : int
        Samples of the reparameterised κ estimator. Default 32.
    predictive_samples : int
        Image-space samples for the std map. Default 128.
    stored_samples : int
        Posterior image samples kept in the result file. Default 8.
    cg_tol : float
        Relative residual of the CG solves. Default 1e-3.
    cg_max_iter : int
        CG iteration cap. Default 200.
    preconditioner_rank : int
        Rank of the Nyström preconditioner. Default 100 (the presets for
        64² and larger raise it, see :data:`UNCERTAINTY_DEFAULTS`).
    """

    prior: str = "gprior"
    sampler: str = "cg"
    n_samples: int = 16
    em_steps: int = 6
    em_tol: float = 0.02
    update: str = "mackay"
    learn_noise: bool | None = None
    predcp: bool = True
    predcp_scale: float = 1.0
    predcp_samples: int = 32
    predictive_samples: int = 128
    stored_samples: int = 8
    cg_tol: float = 1e-3
    cg_max_iter: int = 200
    preconditioner_rank: int = 100

    def __post_init__(self):
        choices = {"prior": ("matern", "ard", "gprior"), "sampler": ("cg", "sto"),
                   "update": ("mackay", "em")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise InputError(f"must be one of {', '.join(allowed)}, got "
                                 f"{getattr(self, name)!r}", field=f"uncertainty.{name}")
        for name in ("n_samples", "em_steps", "predcp_samples", "predictive_samples",
                     "cg_max_iter", "preconditioner_rank"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"must be an integer >= 1, got {v!r}",
                                 field=f"uncertainty.{name}")
        if not isinstance(self.stored_samples, int) or self.stored_samples < 0:
            raise InputError(f"must be an integer >= 0, got {self.stored_samples!r}",
                             field="uncertainty.stored_samples")
        for name in ("em_tol", "predcp_scale", "cg_tol"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"must be a number >= 0, got {v!r}",
                                 field=f"uncertainty.{name}")


#: Uncertainty defaults per U-net preset (sizes grow, samples shrink). The
#: PredCP refresh costs ``blocks × predcp_samples`` JVP+VJP pairs per EM step
#: (11 × 32 = 352 at 64², more than the CG solve): the reference itself
#: drops from 500 draws at 28² to 20 at 501², so larger presets use 16.
#:
#: The Nyström rank grows with the image: the number of eigenvalues of
#: ``ΦΣΦᵀ`` above ``σ²`` does (ellipses, 60 angles, 5 % noise, initial
#: g-prior: ``λ_100/σ²`` = 13 at 64², 55 at 256²), and CG needs about
#: ``√(λ_r/σ²)`` times more iterations. Measured CG iterations of one solve
#: (4 samples) for rank 100 / 200 / 400: 17 / 5 / – at 64², 26 / 9 / 4 at
#: 128², 36 / 13 / 5 at 256²; the sketch costs ``2 (r + 10)`` products (6 /
#: 13 s at 64², 21 / 41 / 82 s at 128², 82 / 164 / 336 s at 256², 2-core
#: CPU). The ranks below give the least sketch + sampling time of a
#: pipeline run (its E-steps and predictive draw).
UNCERTAINTY_DEFAULTS: dict[str, dict] = {
    "reference-28": dict(n_samples=16, predictive_samples=256),
    "dip-64": dict(n_samples=8, predictive_samples=64, predcp_samples=16, em_steps=5,
                   preconditioner_rank=200),
    "dip-128": dict(n_samples=8, predictive_samples=64, predcp_samples=16,
                    preconditioner_rank=200),
    "dip-256": dict(n_samples=4, predictive_samples=32, predcp_samples=16, em_steps=4,
                    preconditioner_rank=400),
}


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

    preset: str = "auto"
    device: str = "auto"
    seed: int = 0
    backend: str = "auto"
    noise_std: float | None = None
    dip: dict = field(default_factory=dict)
    uncertainty: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.preset != "auto" and self.preset not in PRESETS:
            raise InputError(f"unknown preset {self.preset!r}; choose auto or one of "
                             f"{', '.join(sorted(PRESETS))}", field="preset")
        if self.backend not in ("auto", "matrix", "astra"):
            raise InputError(f"must be auto, matrix or astra, got {self.backend!r}",
                             field="backend")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise InputError(f"must be an integer, got {self.seed!r}", field="seed")
        if self.noise_std is not None and not (
                isinstance(self.noise_std, (int, float)) and self.noise_std > 0):
            raise InputError(f"must be > 0, got {self.noise_std!r}", field="noise_std")
        for name, cls in (("dip", DIPConfig), ("uncertainty", UncertaintyConfig)):
            overrides = getattr(self, name)
            if not isinstance(overrides, dict):
                raise InputError("must be a table of settings", field=name)
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise InputError(f"unknown setting; known: {', '.join(sorted(known))}",
                                 field=f"{name}.{unknown[0]}")
            try:  # check the values now, so that errors name the config file
                cls(**overrides)
            except TypeError as err:
                raise InputError(str(err), field=name) from None
            except InputError as err:
                field_name = err.field if "." in str(err.field) else f"{name}.{err.field}"
                raise InputError(err.message, field=field_name) from None

    # -- construction -----------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReconstructionConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"unknown setting; known: {', '.join(sorted(known))}",
                             field=unknown[0])
        return cls(**d)

    @classmethod
    def from_toml(cls, path, base: "ReconstructionConfig | None" = None) -> "ReconstructionConfig":
        """Read a TOML file; its keys override ``base`` (default: the defaults)."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise InputError("no such config file", file=path, field="--config") from None
        except IsADirectoryError:
            raise InputError("is a directory, not a config file", file=path,
                             field="--config") from None
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
            if key in ("dip", "uncertainty") and isinstance(value, dict):
                d[key] = {**d[key], **value}
            else:
                d[key] = value
        return ReconstructionConfig.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "device": self.device, "seed": self.seed,
                "backend": self.backend, "noise_std": self.noise_std,
                "dip": dict(self.dip), "uncertainty": dict(self.uncertainty)}

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
