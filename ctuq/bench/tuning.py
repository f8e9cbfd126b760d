"""Tuning the held-out model error on the validation split: the prior's width and the split.

Both work from the stored arrays of a calibration benchmark run with
``arrays`` (:class:`ctuq.bench.calibration.CalibrationRun`): the truth, the
reconstruction, the posterior variance and the held-out likelihood of each
scan, so that a width costs a refit of two coefficients, not a
reconstruction.

- :func:`tune_prior_width`: refit every stored held-out likelihood under
  the calibrated prior for each width and score the total std; the rule
  :func:`choose_width`.
- :func:`tune_split`: refit the held-out DIP of each stored scan with every
  k-th angle left out, for each k; the rule :func:`choose_split`.
- :func:`tune_correlation_length`: rebuild every stored held-out likelihood
  with pixel errors correlated over each length and refit it; the rule
  :func:`choose_correlation_length`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from ctuq.bench.scores import score, summarise_images
from ctuq.recon.model_error.names import HELDOUT

log = logging.getLogger("ctuq.bench.tuning")

__all__ = ["KEYS", "LL_SLACK", "score_total", "score_variance", "summarise", "choose_width",
           "choose_split", "tune_prior_width", "tune_split", "choose_correlation_length",
           "tune_correlation_length", "kept_case", "kept_cases"]

#: The scores a tuning rule looks at, and ±1σ beside them: a wider interval never passes
#: for a better one unseen (the rules do not read it yet).
KEYS = ("coverage_2", "coverage_2_edges", "pixel_log_likelihood", "spearman", "coverage_1")

#: Nats per pixel a split may lose against every 6th (:func:`choose_split`).
LL_SLACK = 0.1


def score_total(truth, x_hat, var_post, co) -> dict:
    """The :data:`KEYS` scores of the total std with the model error of coefficients ``co``.

    ``truth``, ``x_hat``, ``var_post``: one image's arrays ``(H, W)``;
    ``co``: :class:`~ctuq.recon.model_error.ModelErrorCoefficients` (held-out).
    """
    from ctuq.bench.calibration import total_variance

    return score_variance(truth, x_hat, total_variance(HELDOUT, x_hat, var_post, co))


def score_variance(truth, x_hat, variance) -> dict:
    """The :data:`KEYS` scores and ``std_over_rmse`` of a total variance map ``(H, W)``."""
    s = score(truth, x_hat, torch.as_tensor(variance).sqrt())
    return {**{k: s[k] for k in KEYS}, "std_over_rmse": s["mean_std"] / s["rmse"]}


def summarise(rows: list[dict]) -> dict:
    """Mean and worst image of each of :data:`KEYS` and of ``std_over_rmse``."""
    return summarise_images(rows, KEYS + ("std_over_rmse",))


def choose_width(summary: dict) -> tuple[str, str]:
    """The width to ship, and the rule that chose it.

    Among the widths whose mean ±2σ coverage lies in [90, 99] %, whose worst
    image covers ≥ 85 %, and whose worst image and worst edge coverage are no
    lower than the maximum-likelihood fit's (``'inf'``), the one with the
    highest mean log-likelihood; if none qualifies, the one with the best
    worst-image coverage.
    """
    ml = summary.get("inf")
    ok = {w: s for w, s in summary.items() if 0.90 <= s["coverage_2_mean"] <= 0.99
          and s["coverage_2_worst"] >= 0.85 and (ml is None or (
              s["coverage_2_worst"] >= ml["coverage_2_worst"]
              and s["coverage_2_edges_worst"] >= ml["coverage_2_edges_worst"]))}
    return _highest_ll(summary, ok, "width", "highest mean LL among widths meeting the "
                       "coverage targets without lowering the worst image or worst edge "
                       "coverage of the maximum-likelihood fit")


def _highest_ll(summary: dict, ok: dict, what: str, rule: str) -> tuple[str, str]:
    """The candidate of ``ok`` with the highest mean LL and ``rule``; with none, that of
    ``summary`` with the best worst-image coverage."""
    if ok:
        return max(ok, key=lambda k: ok[k]["pixel_log_likelihood_mean"]), rule
    return max(summary, key=lambda k: summary[k]["coverage_2_worst"]), \
        f"no {what} met the coverage targets: best worst-image coverage"


def choose_split(summary: dict, base: str = "6_prior") -> str:
    """The variant with the best worst-image coverage among those within LL_SLACK of ``base``.

    Only variants with the prior (``'<k>_prior'``) are candidates.
    """
    ll0 = summary[base]["pixel_log_likelihood_mean"]
    ok = [k for k, s in summary.items() if k.endswith("_prior")
          and s["pixel_log_likelihood_mean"] >= ll0 - LL_SLACK]
    return max(ok, key=lambda k: (summary[k]["coverage_2_worst"],
                                  summary[k]["pixel_log_likelihood_mean"]))


def _arrays(folder, case_id: str) -> Path:
    return Path(folder) / (case_id.replace("/", "_") + ".npz")


def kept_case(folder, case_id: str, suffix: str = ""):
    """``(held-out likelihood, truth, x̂, posterior variance)`` a run kept for a case
    (of its variant ``suffix``, e.g. ``'_autoc'``; ``''`` the default reconstruction),
    or None where it kept no arrays; the likelihood is None where the run had no
    held-out term."""
    from ctuq.recon.model_error import HeldoutLikelihood

    npz = _arrays(folder, case_id)
    if not npz.exists():
        return None
    a = np.load(npz)
    prefix = f"heldout{suffix}_"
    lik = HeldoutLikelihood.from_arrays({k[len(prefix):]: a[k] for k in a.files
                                         if k.startswith(prefix)}) \
        if prefix + "r" in a.files else None
    # runs before 2026-11-28 kept one x_hat, the last reconstruction's (a variant's
    # where the run had variants)
    x_hat = a["x_hat" + suffix] if "x_hat" + suffix in a.files else a["x_hat"]
    return lik, a["truth"], torch.as_tensor(x_hat), torch.as_tensor(a["var_post" + suffix])


def kept_cases(rows, arrays, suffix: str = ""):
    """``(row, held-out likelihood, truth, x̂, posterior variance)`` of every row, in the
    order of their ids, whose run kept arrays with a held-out likelihood
    (:func:`kept_case`); the others are skipped."""
    for row in sorted(rows, key=lambda r: r["id"]):
        kept = kept_case(arrays, row["id"], suffix)
        if kept is not None and kept[0] is not None:
            yield (row, *kept)


def row_fit_record(row: dict, x_hat) -> dict:
    """The consistency record (:func:`~ctuq.recon.model_error.terms.fit_record`:
    ``chi2_dof``, the fit's excess, and ``verdict``) of a benchmark row's image ``x_hat``
    ``(H, W)``, measured on the case's scan simulated again (a realistic one on the centre
    that ``center_offset = 'auto'`` estimates, as the benchmark ran it)."""
    from ctuq.bench.cases import simulate, sinogram
    from ctuq.recon.config import ReconstructionConfig
    from ctuq.recon.consistency import auto_center
    from ctuq.recon.model_error.terms import fit_record
    from ctuq.recon.problem import ReconstructionProblem

    scan = simulate(row)
    sino = sinogram(scan, with_truth=False)
    if scan.sinogram is not None:
        sino = auto_center(sino)[0]
    problem = ReconstructionProblem.from_sinogram(sino, ReconstructionConfig())
    return fit_record(problem, torch.as_tensor(np.asarray(x_hat), dtype=torch.float32)
                      / problem.scale)


def row_fit_excess(row: dict, x_hat, record: dict | None = None, suffix: str = "") -> float:
    """The fit's excess (``chi2_dof`` of :func:`~ctuq.recon.model_error.terms.fit_record`)
    of a benchmark row's image ``x_hat`` ``(H, W)``: the row's own record where it has
    one, else that of ``record`` (:func:`row_fit_record`, when already made), else
    measured on the case's scan simulated again (a realistic one on the centre that
    ``center_offset = 'auto'`` estimates, as the benchmark ran it)."""
    stored = ((row.get("coefficients") or {}).get(HELDOUT + suffix) or {}).get("fit_excess")
    if stored is not None:
        return float(stored)
    return float((record or row_fit_record(row, x_hat))["chi2_dof"])


def tune_prior_width(rows: list[dict], arrays, calibration, widths, *,
                     floor: bool = False, calibration_floor: bool = False,
                     excess_thresholds=(), noise_rules=(), checked: bool = False,
                     texture_thresholds=(), suffix: str = "") -> dict:
    """Score every width of the held-out fit's prior on stored scans.

    Parameters
    ----------
    rows : list of dict
        The benchmark's case rows (``id``, ``condition``, ``family``); those
        without arrays, or whose run kept no held-out likelihood, are skipped
        (:func:`kept_cases`).
    arrays : path-like
        The run's arrays folder (with the ``heldout_*`` likelihood arrays).
    calibration : path-like
        The preset's calibration file: the prior's centre.
    widths : list of float
        ``inf`` is the maximum-likelihood fit.
    floor : bool
        Also ``'floor'``: each coefficient the larger of the MLE and the
        calibration.
    calibration_floor : bool
        Also each width with the calibration as a lower bound
        (``'<width> floor'``: ``heldout_calibration_floor``,
        :meth:`~ctuq.recon.model_error.HeldoutLikelihood.fit`); these are
        candidates of the rule beside the widths.
    excess_thresholds : sequence of float
        Also each width floored only where the image's excess
        (:func:`row_fit_excess`) is above the threshold ``T``
        (``'<width> auto <T>'``; ``heldout_calibration_floor = 'auto'`` is
        ``T`` = :data:`~ctuq.recon.model_error.terms.FLOOR_EXCESS`); candidates
        of the rule too. Default none.
    noise_rules : sequence of str
        Also each width (``'<width> <rule>'``) and each width floored by each
        excess threshold (``'<width> auto <T> <rule>'``) with the held-out
        likelihood's noise variance as ``heldout_noise = rule`` sets it
        (:func:`~ctuq.recon.model_error.terms.heldout_noise_scale`, the fit's excess
        and verdict measured by :func:`row_fit_record`; ``'given'``: the run's ``σ²``); the
        other candidates read the residuals as the run did (the kept likelihood's own
        ``noise_scale``). Candidates of the rule too. Default none.
    checked : bool
        Also each width floored as ``heldout_calibration_floor = 'checked'`` does
        (``'<width> checked'``: where the excess is above
        :data:`~ctuq.recon.model_error.terms.FLOOR_EXCESS`, unless the held-out
        projections reject the floor by more than
        :data:`~ctuq.recon.model_error.terms.FLOOR_REJECT_NATS`); candidates of the rule
        too. Default False.
    texture_thresholds : sequence of float
        Also each width floored as ``'checked'`` does, with a coefficient the
        calibration found negligible fitted on images whose edge concentration
        (:func:`~ctuq.recon.model_error.terms.edge_concentration` of the kept ``x_hat``)
        is below ``T`` (``'<width> checked texture <T>'``: the setting
        ``heldout_texture_threshold = T``); candidates of the rule too. Default none.
    suffix : str
        The run's variant to tune (``--variant NAME:...`` of ``bench_calibration.py``
        is ``'_NAME'``). Default ``''``: the default reconstruction.

    Returns
    -------
    dict
        ``prior``, ``widths``, ``rule``, ``chosen``, ``summary`` (per
        candidate), ``cases``, ``seconds``.
    """
    from ctuq.recon.model_error import ModelErrorCoefficients
    from ctuq.recon.model_error.terms import (edge_concentration, fit_rule, floor_applies,
                                              heldout_noise_scale)

    t_start = time.perf_counter()
    prior = ModelErrorCoefficients.load(calibration)
    finite = [w for w in widths if not math.isinf(w)]  # the widths a prior can have
    per_width: dict[str, list] = {}  # candidate -> its scores per image, in order
    per_case = []
    for r, lik, truth, x_hat, var_post in kept_cases(rows, arrays, suffix):
        row = {"id": r["id"], "condition": r["condition"], "family": r["family"]}
        record = row_fit_record(r, x_hat) if noise_rules else None  # the verdict too
        if excess_thresholds or noise_rules or checked or texture_thresholds:
            row["fit_excess"] = row_fit_excess(r, x_hat, record, suffix)
        if record is not None:
            row["verdict"] = record["verdict"]
        mle = lik.fit()
        candidates = {str(w): mle if math.isinf(w) else lik.fit(prior, w, mle=mle)
                      for w in widths}
        if calibration_floor:
            candidates.update({f"{w} floor": lik.fit(prior, w, mle=mle, floor=True)
                               for w in finite})
        for t in excess_thresholds:
            floored = floor_applies("auto", row["fit_excess"], threshold=t)
            candidates.update({f"{w} auto {t:g}": lik.fit(prior, w, mle=mle, floor=floored)
                               for w in finite})
        if checked:  # floored as 'checked' floors, no image a texture
            candidates.update({f"{w} checked": lik.fit(
                prior, w, mle=mle, **fit_rule("checked", row["fit_excess"])) for w in finite})
        if texture_thresholds:
            row["edge_concentration"] = edges = edge_concentration(x_hat.numpy())
        for t in texture_thresholds:
            candidates.update({f"{w} checked texture {t:g}": lik.fit(
                prior, w, mle=mle, **fit_rule("checked", row["fit_excess"], edges, t))
                for w in finite})
        for rule in noise_rules:
            scaled = dataclasses.replace(lik, noise_scale=heldout_noise_scale(
                rule, {"chi2_dof": row["fit_excess"], "verdict": row["verdict"]}))
            candidates.update({f"{w} {rule}": scaled.fit(prior, w) for w in finite})
            candidates.update({f"{w} auto {t:g} {rule}": scaled.fit(
                prior, w, floor=floor_applies("auto", row["fit_excess"], threshold=t))
                for t in excess_thresholds for w in finite})
        candidates["calibrated"] = prior  # the calibration alone, no held-out fit
        if floor:  # the calibration as a floor under the MLE
            candidates["floor"] = ModelErrorCoefficients(max(mle.t0, prior.t0),
                                                         max(mle.s1, prior.s1), HELDOUT)
        for name, co in candidates.items():
            s = score_total(truth, x_hat, var_post, co)
            per_width.setdefault(name, []).append(s)
            row[name] = {"t0": co.t0, "s1": co.s1, **s}
        per_case.append(row)
    summary = {w: summarise(rs) for w, rs in per_width.items() if rs}
    ruled = [str(w) for w in widths] + [f"{w} floor" for w in finite if calibration_floor] \
        + [f"{w} auto {t:g}" for t in excess_thresholds for w in finite] \
        + [f"{w} checked" for w in finite if checked] \
        + [f"{w} checked texture {t:g}" for t in texture_thresholds for w in finite] \
        + [f"{w} {rule}" for rule in noise_rules for w in finite] \
        + [f"{w} auto {t:g} {rule}" for rule in noise_rules for t in excess_thresholds
           for w in finite]
    chosen, rule = choose_width({w: summary[w] for w in ruled if w in summary})
    return {"split": "validation", "calibration": str(calibration),
            "prior": {"t0": prior.t0, "s1": prior.s1, "info": {
                k: prior.info.get(k) for k in ("preset", "split", "n_images", "angles",
                                               "noise_levels")}},
            "widths": [str(w) for w in widths], "candidates": ruled, "rule": rule,
            "chosen": chosen,
            "summary": summary, "cases": per_case, "seconds": time.perf_counter() - t_start}


def tune_split(rows: list[dict], arrays, calibration, everies, *, n_angles: int = 30,
               width: float = 0.1, threads: int = 1) -> dict:
    """Score held-out splits (every k-th angle out) on stored scans of ``n_angles`` angles.

    Each scan is simulated again (:func:`ctuq.bench.cases.simulate`) and its
    held-out DIP refitted per k with the reconstruction's DIP settings; the
    coefficients are fitted by maximum likelihood and under the calibrated
    prior of width ``width``, and scored on the stored truth,
    reconstruction and posterior variance.

    Returns
    -------
    dict
        ``angles``, ``width``, ``every``, ``rule``, ``chosen``
        (:func:`choose_split`), ``summary``, ``cases``, ``seconds``.
    """
    from ctuq.bench.calibration import CalibrationRun, reconstruction_config
    from ctuq.bench.cases import reconstruction_op, simulate
    from ctuq.recon import model_error as me

    torch.set_num_threads(threads)
    prior = me.ModelErrorCoefficients.load(calibration)
    t_start = time.perf_counter()
    cases = []
    for row in rows:
        if row["n_angles"] != n_angles:
            continue
        a = np.load(_arrays(arrays, row["id"]))
        scan = simulate(row)
        op = reconstruction_op(scan)
        dip_cfg, _ = reconstruction_config(row, CalibrationRun(threads=threads)).resolve(
            scan.truth.shape)
        truth, x_hat, var_post = a["truth"], torch.as_tensor(a["x_hat"]), \
            torch.as_tensor(a["var_post"])
        out = {"id": row["id"], "condition": row["condition"], "family": row["family"]}
        for every in everies:
            mask, dip_in = me.heldout_fit(scan.y, op, dip_cfg, every=every,
                                          noise_std=scan.sigma)
            lik = me.heldout_likelihood(op, scan.y, mask,
                                        dip_in.reconstruction.detach().cpu(), var_post,
                                        scan.sigma ** 2)
            mle = lik.fit()
            for name, co in (("mle", mle), ("prior", lik.fit(prior, width, mle=mle))):
                out[f"{every}_{name}"] = {"t0": co.t0, "s1": co.s1, "n_out": int(mask.sum()),
                                          **score_total(truth, x_hat, var_post, co)}
        cases.append(out)
        log.info("%s: %s", row["id"], ", ".join(
            f"{k} {v['coverage_2']:.3f}" for k, v in out.items() if isinstance(v, dict)))
    variants = [f"{e}_{n}" for e in everies for n in ("mle", "prior")]
    summary = {v: summarise([c[v] for c in cases]) for v in variants}
    return {"split": "validation", "angles": n_angles, "width": width,
            "calibration": str(calibration), "every": list(everies),
            "rule": f"with the prior: best worst-image ±2σ coverage among the splits whose "
                    f"mean LL is within {LL_SLACK} nats of every 6th's",
            "chosen": choose_split(summary), "summary": summary, "cases": cases,
            "seconds": time.perf_counter() - t_start}


def choose_correlation_length(summary: dict) -> tuple[str, str]:
    """The correlation length to ship, and the rule that chose it.

    Among the lengths whose mean ±2σ coverage lies in [90, 99] %, whose worst
    image covers ≥ 85 % and whose mean coverage on edges is ≥ 85 % (the
    realistic benchmark's targets for the interval), the one with the highest mean
    log-likelihood; if none qualifies, the one with the best worst-image
    coverage.
    """
    ok = {k: s for k, s in summary.items() if 0.90 <= s["coverage_2_mean"] <= 0.99
          and s["coverage_2_worst"] >= 0.85 and s["coverage_2_edges_mean"] >= 0.85}
    return _highest_ll(summary, ok, "length", "highest mean LL among the lengths with ±2σ "
                       "mean in [90, 99] %, worst image >= 85 % and edges >= 85 %")


def tune_correlation_length(rows: list[dict], arrays, lengths, *, calibration=None,
                            width: float = 0.1) -> dict:
    """Score every pixel correlation length of the held-out likelihood on stored scans.

    Each stored likelihood (kept with its image and left-out angles) is
    rebuilt at each length
    (:meth:`~ctuq.recon.model_error.HeldoutLikelihood.with_correlation_length`,
    on the benchmark's nominal parallel geometry) and
    refitted as the pipeline fits it: under the calibrated prior of width
    ``width`` when ``calibration`` is given, else by maximum likelihood.

    Parameters
    ----------
    rows : list of dict
        The benchmark's case rows; those without arrays, or whose
        likelihood was stored without its image, are skipped.
    arrays : path-like
        The run's arrays folder.
    lengths : list of float
        Pixels (0: independent pixels, the run's own fit when it used 0).
    calibration : path-like, optional
        The preset's calibration file: the prior's centre.
    width : float, optional
        The prior's width. Default 0.1.

    Returns
    -------
    dict
        ``lengths``, ``rule``, ``chosen``, ``summary`` (per length),
        ``cases``, ``skipped``, ``seconds``.
    """
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.recon.model_error import ModelErrorCoefficients

    t_start = time.perf_counter()
    prior = None if calibration is None else ModelErrorCoefficients.load(calibration)
    per_length: dict[str, list] = {}
    per_case, skipped = [], []
    for r in sorted(rows, key=lambda r: r["id"]):
        kept = kept_case(arrays, r["id"])
        if kept is None or kept[0] is None or kept[0].image is None:
            skipped.append(r["id"])
            continue
        lik, truth, x_hat, var_post = kept
        # the geometry the reconstruction used: rows since 2026-11-29 record its centre;
        # older ones get the nominal one (rows before 2026-11-28 record the estimate
        # beside a reconstruction at 0, so the estimate would be wrong for them)
        used = ((r.get("realistic") or {}).get("default") or {}).get("center_offset_used")
        op = RayTransform(Geometry.parallel(r["size"], r["n_angles"],
                                            center_offset=float(used or 0.0)))
        row = {"id": r["id"], "condition": r["condition"], "family": r["family"]}
        for length in lengths:
            co = lik.with_correlation_length(op, length).fit(prior, width)
            s = score_total(truth, x_hat, var_post, co)
            per_length.setdefault(str(length), []).append(s)
            row[str(length)] = {"t0": co.t0, "s1": co.s1, **s}
        per_case.append(row)
        log.info("%s: %s", r["id"], ", ".join(
            f"{k} ±1σ {v['coverage_1']:.3f} std/RMSE {v['std_over_rmse']:.2f}"
            for k, v in row.items() if isinstance(v, dict)))
    summary = {k: summarise(v) for k, v in per_length.items()}
    chosen, rule = choose_correlation_length(summary) if summary else (None, "no cases")
    return {"split": "validation", "calibration": None if calibration is None else str(calibration),
            "width": width if prior is not None else None, "lengths": [str(x) for x in lengths],
            "rule": rule, "chosen": chosen, "summary": summary, "cases": per_case,
            "skipped": skipped, "seconds": time.perf_counter() - t_start}
