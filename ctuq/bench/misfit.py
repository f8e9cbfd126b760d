"""The misfit check's threshold, chosen on validation scans with injected errors.

Each scan is an off-grid simulation of a validation-split case
(:func:`ctuq.data.realistic.realistic_case`: 4× rendering, ASTRA ``strip``,
a hidden centre offset in ±0.5 px) whose line integrals get white Gaussian
noise of std ``p · mean|y|`` (``p`` drawn in [1 %, 5 %]; the noise level is
not given to ctuq, which estimates it from the air beside the object). The
counts are simulated at ``I0 = 1e9``, so that their own noise is negligible
beside the Gaussian one: a per-ray count model is not used here.

One error is injected into what ctuq is told (:data:`ERRORS`); the data are
always those of the true scan:

- ``right``: nothing (the hidden ±0.5 px centre offset stays);
- ``right0`` (:data:`EXACT`): nothing, and no hidden centre offset either;
- ``centre2`` / ``centre5``: the scan's rotation axis is 2 / 5 detector
  pixels off (sign alternating), ctuq is told 0;
- ``rad_as_deg``: the angles' radian values are given with unit degrees;
- ``pixel1.5``: ctuq is told a pixel size 1.5 times the true one (the
  detector spacing stays the true one);
- ``shuffle``: 10 % of the projection rows are permuted among themselves.

Two tiers (the whole product on every scan does not fit the CPU budget):
``full`` runs :func:`ctuq.reconstruct` (default settings, the size's preset,
``predictive_samples`` lowered for time) and records the verdict, ±2σ
coverage and RMSE; ``fit`` runs the DIP fit of the same problem and the
consistency check on its reconstruction (``γ̂`` unknown: ``dof = m``).
Both record ``chi2_m`` (``‖r‖²/m`` at the problem's noise level), so the
threshold is chosen on one statistic; the product divides by ``m − γ̂``,
which only raises it (it flags at least as often as measured here).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

__all__ = ["ERRORS", "make_scan", "plan", "run_case", "restat", "choose_threshold",
           "summarise"]

ERRORS = ("right", "centre2", "centre5", "rad_as_deg", "pixel1.5", "shuffle")
#: The injected errors (every kind but ``right``).
WRONG = ERRORS[1:]
#: Right scans without even the hidden ±0.5 px centre offset (reported apart:
#: they show how much of the right scans' χ² that offset makes).
EXACT = "right0"
#: Per-angle threshold factor of the product's rule
#: (:data:`ctuq.recon.diagnostics.ANGLE_THRESHOLD_FACTOR`).
SHUFFLE_FRACTION = 0.1


def make_scan(case: dict):
    """The scan of ``case`` as ctuq is given it: ``(sinogram, truth, facts)``.

    ``case``: ``family``, ``index``, ``size``, ``n_angles``, ``error`` (one
    of :data:`ERRORS`), ``noise`` (``p``), ``split``.
    """
    from ctuq.data.io import Sinogram
    from ctuq.data.realistic import realistic_case

    err = case["error"]
    sign = 1.0 if case["index"] % 2 == 0 else -1.0
    opts = {"center_offset": None} if err == EXACT else {}
    if err in ("centre2", "centre5"):
        opts["center_offset"] = sign * float(err[len("centre"):])
    sino, truth, hidden = realistic_case(case["split"], case["family"], case["index"],
                                         case["size"], case["n_angles"], I0=1e9, **opts)
    y = np.asarray(sino.data, dtype=np.float64)
    rng = np.random.default_rng(case["noise_seed"])
    sigma = case["noise"] * float(np.abs(y).mean())
    y = y + sigma * rng.standard_normal(y.shape)
    g = sino.geometry
    if err == "rad_as_deg":
        g = dataclasses.replace(g, angles=np.deg2rad(np.asarray(g.angles, dtype=np.float64)))
    elif err == "pixel1.5":
        g = dataclasses.replace(g, pixel_size=1.5 * g.pixel_size,
                                detector_spacing=g.detector_spacing or g.pixel_size)
    elif err == "shuffle":
        k = max(2, int(round(SHUFFLE_FRACTION * y.shape[0])))
        rows = np.sort(rng.choice(y.shape[0], size=k, replace=False))
        y[rows] = y[np.roll(rows, 1)]  # a cyclic shift: no row stays in place
    # the scan states its geometry (a centre included, wrong where the error says so):
    # not the raw frames' "auto", which would let ctuq estimate the centre error away;
    # and it is line integrals with Gaussian noise, not raw frames
    meta = {k: v for k, v in sino.meta.items()
            if k not in ("noise_std", "center_offset", "flat_dark_corrected", "n_flats",
                         "n_darks")}
    facts = {"sigma_true": sigma, "center_offset_hidden": hidden["center_offset"]}
    return Sinogram(y.astype(np.float32), g, meta, truth), truth, facts


def plan(n_right: int, n_per_error: int, size: int, n_angles: int, *,
         full_right: int, full_errors=("centre5",), full_per_error: int | None = None,
         n_exact: int = 0, split: str = "validation") -> list[dict]:
    """The cases: ``n_right`` right scans and ``n_per_error`` of each error, over the
    split's families in turn; the first ``full_right`` right scans and the first
    ``full_per_error`` (default all) of each error in ``full_errors`` run the
    whole product (``tier='full'``)."""
    full_per_error = n_per_error if full_per_error is None else full_per_error
    from ctuq.data.splits import FAMILIES

    fams = FAMILIES[split]
    out = []
    for err in (*ERRORS, EXACT):
        n = n_right if err == "right" else n_exact if err == EXACT else n_per_error
        for i in range(n):
            fam, idx = fams[i % len(fams)], i // len(fams)
            # a different image per error type: index blocks of 20 per error
            # right0 pairs with right: same image, noise level and draw
            kind = 0 if err == EXACT else ERRORS.index(err)
            index = 20 * kind + idx
            full = (err == "right" and i < full_right) or (err in full_errors
                                                            and i < full_per_error)
            rng = np.random.default_rng([kind, i])
            out.append({"id": f"{split}/{fam}/{index}/{err}", "split": split, "family": fam,
                         "index": index, "size": size, "n_angles": n_angles, "error": err,
                         "noise": float(rng.uniform(0.01, 0.05)),
                         "noise_seed": int(20_000_000 + 1000 * kind + i),
                         "tier": "full" if full else "fit"})
    return out


def run_case(case: dict, *, predictive_samples: int = 32, threads: int = 1,
             arrays=None) -> dict:
    """Reconstruct one scan (its tier) and record the check's statistics.

    ``arrays``: a folder where the data ``y``, the forward projection ``fwd`` of
    the reconstruction and the whitening ``noise_var`` go (``<id>.npz``), so
    that other statistics can be computed afterwards without refitting.
    """
    import torch

    import ctuq
    from ctuq.recon.consistency import check_consistency

    sino, truth, facts = make_scan(case)
    t0 = time.perf_counter()
    row = {k: case[k] for k in ("id", "family", "index", "error", "noise", "tier")}
    row.update(facts)
    if case["tier"] == "full":
        cfg = ctuq.ReconstructionConfig(threads=threads,
                                        uncertainty={"predictive_samples": predictive_samples})
        r = ctuq.reconstruct(sino, cfg)
        d = r.diagnostics
        m = float(np.asarray(r.residual).size)
        rec, std = np.asarray(r.reconstruction, np.float64), np.asarray(r.std, np.float64)
        y = np.asarray(sino.data, np.float64)
        fwd = y - np.asarray(r.residual, np.float64) * math.sqrt(d["noise_var"])
        z = np.abs(rec - truth) / np.maximum(std, 1e-12)
        row.update(chi2_dof=d["chi2_dof"], chi2_m=d["chi2_dof"] * d["dof"] / m,
                   max_angle_m=max(d["chi2_per_angle"]) * d["dof"] / m,
                   verdict=d["verdict"], trustworthy=d.get("trustworthy"),
                   noise_var=d.get("noise_var"), noise_var_method=d.get("noise_var_method"),
                   noise_var_ratio=d.get("noise_var_ratio"),
                   chi2_dof_learned=(d["chi2_dof"] / d["noise_var_ratio"]
                                     if d.get("noise_var_ratio") else None),
                   coverage_2=float((z <= 2).mean()),
                   rmse=float(np.sqrt(np.mean((rec - truth) ** 2))),
                   mean_std=float(std.mean()))
    else:
        from ctuq.recon.dip import fit_dip
        from ctuq.recon.problem import ReconstructionProblem

        torch.set_num_threads(threads)
        cfg = ctuq.ReconstructionConfig(threads=threads)
        p = ReconstructionProblem.from_sinogram(sino, cfg)
        fit = fit_dip(p.y, p.op, p.dip, noise_std=p.noise.std)
        d, _ = check_consistency(p.y, p.op, fit.reconstruction, p.noise.variance, {},
                                 noise=p.noise)
        rec = fit.reconstruction.detach().cpu().double().numpy()
        y = p.y.detach().cpu().double().numpy()
        with torch.no_grad():
            fwd = p.op.A(fit.reconstruction.detach()).cpu().double().numpy()
        row.update(chi2_m=d["chi2_dof"], max_angle_m=max(d["chi2_per_angle"]),
                   verdict=d["verdict"], noise_var=d["noise_var"],
                   rmse=float(np.sqrt(np.mean((rec - truth) ** 2))))
    row["sigma2_ratio_estimate_true"] = row["noise_var"] / facts["sigma_true"] ** 2
    row["seconds"] = time.perf_counter() - t0
    if arrays is not None:
        from pathlib import Path

        Path(arrays).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(Path(arrays) / (case["id"].replace("/", "_") + ".npz"), y=y,
                            fwd=fwd, noise_var=row["noise_var"], truth=truth, rec=rec)
    return row


def restat(rows: list[dict], arrays, misregistration: float) -> list[dict]:
    """The rows with ``chi2_m`` / ``max_angle_m`` (and a full row's ``chi2_dof``)
    recomputed from the stored arrays with the whitening variance
    ``σ² + (δ ∂(A x̂)/∂u)²`` (δ = ``misregistration``); the values as run are
    kept as ``chi2_m_run`` / ``max_angle_m_run``."""
    from pathlib import Path

    from ctuq.recon.diagnostics import misregistration_variance

    out = []
    for r in rows:
        a = np.load(Path(arrays) / (r["id"].replace("/", "_") + ".npz"))
        var = float(a["noise_var"]) + misregistration_variance(a["fwd"], misregistration)
        r2 = (a["y"] - a["fwd"]) ** 2 / var
        new = {**r, "chi2_m_run": r.get("chi2_m_run", r["chi2_m"]),
               "max_angle_m_run": r.get("max_angle_m_run", r["max_angle_m"]),
               "chi2_m": float(r2.mean()), "max_angle_m": float(r2.mean(axis=1).max()),
               "misregistration": float(misregistration)}
        if r["tier"] == "full":   # the product divides by m − γ̂
            scale = r.get("dof_scale", r["chi2_dof"] / r["chi2_m"])
            new.update(dof_scale=scale, chi2_dof=new["chi2_m"] * scale)
        out.append(new)
    return out


def flagged(rows, t: float, factor: float) -> np.ndarray:
    """The product's rule on ``chi2_m``: overall above ``t`` or one angle above ``factor·t``."""
    c = np.array([r["chi2_m"] for r in rows])
    a = np.array([r["max_angle_m"] for r in rows])
    return (c > t) | (a > factor * t)


def choose_threshold(rows: list[dict], factor: float, *, detection: float = 0.95,
                     kinds=WRONG) -> dict:
    """The threshold with the smallest false-positive rate at detection ≥ ``detection``
    of the errors ``kinds`` (default all of :data:`WRONG`).

    Candidates are the scans' own values (``chi2_m`` and ``max_angle_m/factor``);
    among the thresholds with the least false positives that still detect
    enough, the geometric middle of their range is chosen (a margin both ways).
    """
    right = [r for r in rows if r["error"] == "right"]
    wrong = [r for r in rows if r["error"] in kinds]
    vals = sorted({v for r in rows for v in (r["chi2_m"], r["max_angle_m"] / factor)})
    grid = np.unique(np.concatenate([vals, np.geomspace(1, 1e4, 400)]))
    ok = []
    for t in grid:
        det = float(flagged(wrong, t, factor).mean())
        fpr = float(flagged(right, t, factor).mean())
        if det >= detection:
            ok.append((fpr, t, det))
    if not ok:
        # no threshold detects enough: the least balanced error (misses + false flags)
        err = [(1 - float(flagged(wrong, t, factor).mean())
                + float(flagged(right, t, factor).mean()), t) for t in grid]
        e_min = min(e for e, _ in err)
        ts = [t for e, t in err if e == e_min]
        t = float(math.sqrt(min(ts) * max(ts)))
        return {"threshold": t, "range": [float(min(ts)), float(max(ts))],
                "reason": f"no threshold detects {detection:.0%}: least misses + false flags",
                "false_positive_rate": float(flagged(right, t, factor).mean()),
                "detection": float(flagged(wrong, t, factor).mean()), "angle_factor": factor}
    fmin = min(f for f, _, _ in ok)
    ts = [t for f, t, _ in ok if f == fmin]
    lo, hi = min(ts), max(ts)
    t = float(math.sqrt(lo * hi))
    return {"threshold": t, "range": [float(lo), float(hi)], "false_positive_rate": fmin,
            "detection": float(flagged(wrong, t, factor).mean()), "angle_factor": factor,
            "kinds": list(kinds)}


def summarise(rows: list[dict], threshold: float, factor: float) -> dict:
    """Flag rates per error type at ``threshold``, the statistics' ranges, and the
    coverage of the full-tier scans (flagged or not)."""
    out = {}
    for err in (*ERRORS, EXACT):
        rs = [r for r in rows if r["error"] == err]
        if not rs:
            continue
        f = flagged(rs, threshold, factor)
        e = {"n": len(rs), "flag_rate": float(f.mean()),
             "chi2_m": [float(min(r["chi2_m"] for r in rs)), float(max(r["chi2_m"] for r in rs))],
             "max_angle_m": [float(min(r["max_angle_m"] for r in rs)),
                             float(max(r["max_angle_m"] for r in rs))]}
        full = [r for r in rs if r["tier"] == "full"]
        if full:
            ff = flagged(full, threshold, factor)
            cov = [r["coverage_2"] for r in full]
            e["full"] = {"n": len(full),
                         "coverage_2": [float(min(cov)), float(max(cov))],
                         "unflagged_coverage_2": [float(r["coverage_2"])
                                                  for r, x in zip(full, ff) if not x],
                         "noise_var_ratio": [float(min(r["noise_var_ratio"] for r in full)),
                                             float(max(r["noise_var_ratio"] for r in full))],
                         "chi2_dof_learned": [float(min(r["chi2_dof_learned"] for r in full)),
                                              float(max(r["chi2_dof_learned"] for r in full))],
                         "chi2_dof_product": [float(min(r["chi2_dof"] for r in full)),
                                              float(max(r["chi2_dof"] for r in full))],
                         "product_flag_rate_at_threshold": float(np.mean(
                             [r["chi2_dof"] > threshold or r["max_angle_m"] * r["chi2_dof"]
                              / r["chi2_m"] > factor * threshold for r in full]))}
        out[err] = e
    return out
