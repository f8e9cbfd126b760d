"""The benchmarks' cases: which images, which scans, and the simulation of a case's scan.

A case is a dict (JSON-able, with a unique ``"id"``) naming an image of a
split of :mod:`ctuq.data.splits` (``split``, ``family``, ``index``,
``size``) and the scan's condition (``n_angles`` parallel-beam angles,
relative Gaussian ``noise``). :func:`simulate` makes its scan with
:func:`ctuq.data.simulate.simulate_sinogram` and the case's own noise seed;
:func:`sinogram` wraps it as the :class:`ctuq.data.io.Sinogram` that
``ctuq.reconstruct`` takes (noise std known, truth attached).

A *realistic* case (an ``I0`` key, :func:`realistic_cases`) is simulated
without the inverse crime instead (:func:`ctuq.data.realistic.realistic_case`:
the phantom rendered 4× finer and projected by another projector, Poisson
counts with flat and dark frames, a hidden centre offset within ±0.5 px);
its sinogram carries no noise level and the nominal geometry only, as a
user's scan would.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["CONDITIONS", "REALISTIC_CONDITIONS", "realistic_cases", "case_id",
           "calibration_cases", "fit_cases", "case_spec", "Scan", "simulate", "sinogram",
           "realistic_record", "auto_center_record", "reconstruction_op", "CASE_FIELDS"]

#: The calibration benchmark's conditions per image size: (angles, relative noise).
CONDITIONS = {64: [(30, 0.01), (30, 0.05), (60, 0.01), (60, 0.05)],
              128: [(60, 0.01), (60, 0.05)], 28: [(20, 0.05)]}

#: The realistic condition per image size: (angles, open-beam counts I0 per detector pixel).
REALISTIC_CONDITIONS = {64: [(60, 1e3), (60, 1e4), (60, 1e5)],
                        128: [(60, 1e3), (60, 1e4), (60, 1e5)],
                        32: [(30, 1e4)], 28: [(20, 1e4)]}

#: The planning fields of a case (what the case lists make); a realistic case adds ``I0``.
CASE_FIELDS = ("id", "split", "family", "index", "size", "n_angles", "noise", "condition")


def case_id(split: str, family: str, index: int, size: int, n_angles: int,
            noise: float) -> str:
    """``split/family/index/size/angles/noise-percent``, e.g. ``test/digits/0/64/30/5``."""
    return f"{split}/{family}/{index}/{size}/{n_angles}/{round(noise * 100)}"


def _case(split, family, index, size, n_angles, noise) -> dict:
    return {"id": case_id(split, family, index, size, n_angles, noise), "split": split,
            "family": family, "index": index, "size": size, "n_angles": n_angles,
            "noise": noise, "condition": f"{n_angles} angles, {noise:.0%} noise"}


def _realistic_case(split, family, index, size, n_angles, I0) -> dict:
    i0 = f"{I0:.0e}".replace("e+0", "e")  # 1e4
    return {"id": f"{split}/{family}/{index}/{size}/{n_angles}/I{i0}", "split": split,
            "family": family, "index": index, "size": size, "n_angles": n_angles,
            "noise": None, "I0": float(I0), "condition": f"realistic, {n_angles} angles, I0 {i0}"}


def realistic_cases(split: str, sizes, per_family: int, conditions=None) -> list[dict]:
    """The realistic condition's cases (:data:`REALISTIC_CONDITIONS`), largest images first.

    As :func:`calibration_cases`: ``per_family`` images of every family per
    ``(n_angles, I0)`` condition (or the subset ``conditions``), each
    condition with its own images. The image indices start at 50, past those
    of the Gaussian-noise conditions, so that the two conditions never share
    an image.
    """
    from ctuq.data.splits import FAMILIES

    out = []
    for size in sizes:
        conds = list(enumerate(REALISTIC_CONDITIONS[size]))
        if conditions:
            conds = [(j, c) for j, c in conds if c in conditions]
        for i in range(per_family):
            for j, (n_angles, I0) in conds:
                for family in FAMILIES[split]:
                    out.append(_realistic_case(split, family, 50 + j * per_family + i, size,
                                               n_angles, I0))
    return sorted(out, key=lambda c: -c["size"])


def calibration_cases(split: str, sizes, per_family: int, conditions=None) -> list[dict]:
    """The calibration benchmark's cases, largest images first.

    Per size, every condition of :data:`CONDITIONS` (or the subset
    ``conditions``, a list of ``(n_angles, noise)``; ids and images stay those
    of the full list) and ``per_family`` images of every family of the
    split; each condition has its own images (indices run on across
    conditions). Images first, then conditions, then families: a partial run
    covers every family and condition before it adds a second image of any.
    """
    from ctuq.data.splits import FAMILIES

    out = []
    for size in sizes:
        conds = list(enumerate(CONDITIONS[size]))
        if conditions:
            conds = [(j, c) for j, c in conds if c in conditions]
        for i in range(per_family):
            for j, (n_angles, noise) in conds:
                for family in FAMILIES[split]:
                    out.append(_case(split, family, j * per_family + i, size, n_angles, noise))
    return sorted(out, key=lambda c: -c["size"])  # longest first


def fit_cases(sizes, per_family: int, n_angles: int, noise: float,
              split: str = "test") -> list[dict]:
    """``per_family`` images of every family of ``split`` per size, one condition.

    Images first, then families.
    """
    from ctuq.data.splits import FAMILIES

    return [_case(split, family, i, size, n_angles, noise)
            for size in sizes for i in range(per_family) for family in FAMILIES[split]]


def case_spec(row: dict) -> dict:
    """The planning fields of a result row (:data:`CASE_FIELDS`, and ``I0`` if it has one)."""
    return {k: row[k] for k in CASE_FIELDS + (("I0",) if "I0" in row else ())}


@dataclass
class Scan:
    """A case's simulated scan.

    Attributes
    ----------
    case : ctuq.data.splits.Case
    truth : ndarray, shape (size, size), float32
    op : RayTransform
        Parallel beam, ``n_angles`` over 180°, the size's detector.
    y : Tensor, shape (n_angles, n_detector), float32
    sigma : float
        The noise std (known to every method); for a realistic case the
        estimate from the data (:func:`ctuq.recon.baselines.estimate_noise_std`),
        the noise level being unknown.
    noise_seed : int
    sinogram : Sinogram, optional
        A realistic case's scan as ctuq reads it (no noise level, nominal geometry).
    hidden : dict, optional
        What a realistic case's reconstruction is not told (centre offset, I0...).
    """

    case: object
    truth: np.ndarray
    op: object
    y: object
    sigma: float
    noise_seed: int
    sinogram: object = None
    hidden: dict | None = None

    @property
    def geometry(self):
        return self.op.geometry


def simulate(case: dict, offset: int | None = None) -> Scan:
    """The scan of ``case`` (a dict of a case list).

    Parameters
    ----------
    case : dict
        ``split``, ``family``, ``index``, ``size``, ``n_angles``, ``noise``.
    offset : int, optional
        Which noise draw of the image (:meth:`ctuq.data.splits.Case.noise_seed`).
        Default: the condition's position in :data:`CONDITIONS` (0 for a
        condition not listed there).
    """
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.data.splits import Case

    c = Case(case["split"], case["family"], case["index"], case["size"])
    if case.get("I0") is not None:
        return _simulate_realistic(case, c)
    truth = c.image()
    op = RayTransform(Geometry.parallel(c.size, case["n_angles"]))
    if offset is None:
        cond = (case["n_angles"], case["noise"])
        offset = CONDITIONS[c.size].index(cond) if cond in CONDITIONS.get(c.size, []) else 0
    seed = c.noise_seed(offset)
    y, sigma = simulate_sinogram(truth, op, case["noise"], seed=seed)
    return Scan(c, truth, op, y, sigma, seed)


def _simulate_realistic(case: dict, c) -> Scan:
    from ctuq.data.operators import RayTransform
    from ctuq.data.realistic import realistic_case
    from ctuq.recon.baselines import estimate_noise_std

    sino, truth, hidden = realistic_case(c.split, c.family, c.index, c.size, case["n_angles"],
                                         I0=case["I0"])
    op = RayTransform(sino.geometry)
    y = torch.as_tensor(np.asarray(sino.data), dtype=torch.float32)
    return Scan(c, np.asarray(truth, np.float32), op, y, float(estimate_noise_std(y)),
                int(hidden.get("noise_seed", c.noise_seed(0))), sinogram=sino, hidden=hidden)


def sinogram(scan: Scan, with_truth: bool = True):
    """The scan as a :class:`ctuq.data.io.Sinogram`, its noise std known.

    ``with_truth``: attach the truth (``ctuq.reconstruct`` then adds its
    metrics to the result). Default True.
    """
    from ctuq.data.io import Sinogram

    if scan.sinogram is not None:  # realistic: as read, without its truth unless asked
        return dataclasses.replace(scan.sinogram, meta=dict(scan.sinogram.meta),
                                   ground_truth=scan.truth if with_truth else None)
    return Sinogram(scan.y.detach().cpu().numpy(), scan.geometry,
                    meta={"noise_std": scan.sigma},
                    ground_truth=scan.truth if with_truth else None)


def auto_center_record(scan) -> dict:
    """The centre that ``center_offset = 'auto'`` estimates from a realistic scan
    (:func:`ctuq.recon.consistency.auto_center`'s record): one per scan."""
    from ctuq.recon.consistency import auto_center

    return auto_center(scan.sinogram)[1]


def reconstruction_op(scan, center: dict | None = None):
    """The operator a default reconstruction of ``scan`` uses: ``scan.op`` for a scan
    made the way ctuq models one, and for a realistic scan (whose ``op`` is the nominal
    geometry, offset 0) the geometry on the centre that ``center_offset = 'auto'``
    estimates (``center``, :func:`auto_center_record`; estimated here when not given).
    Baselines and refits of realistic rows use it, so that they see the geometry the
    default saw, not a centre a user's scan would not tell them."""
    if scan.hidden is None:
        return scan.op
    from ctuq.data.operators import RayTransform

    used = (center or auto_center_record(scan))["used"]
    return RayTransform(dataclasses.replace(scan.sinogram.geometry, center_offset=float(used)))


def realistic_record(scan, result, center: dict) -> dict:
    """What a realistic case hid and what ctuq made of it: the noise level it used
    against the scan's true per-ray std, the consistency verdict, and the centre
    that ``center_offset = 'auto'`` estimated (``center``, :func:`auto_center_record`)
    against the hidden one."""
    diag = result.diagnostics or {}
    true_offset = float(scan.hidden.get("center_offset", 0.0))
    return {"noise_std_used": float(result.config["noise_std"]),
            "noise_std_known": bool(result.config.get("noise_std_known", False)),
            "noise_std_rms_true": scan.hidden.get("noise_std_rms"),
            "center_offset_true": true_offset, "center_offset_auto": center["estimate"],
            "center_auto_error": (None if center["estimate"] is None
                                  else abs(center["estimate"] - true_offset)),
            "center_auto_std": center.get("std"),
            # the centre the reconstruction used (the estimate where 'auto' applied)
            "center_offset_used": float((diag.get("center") or {}).get(
                "used", scan.sinogram.geometry.center_offset)),
            "chi2_dof": diag.get("chi2_dof"), "verdict": diag.get("verdict")}
