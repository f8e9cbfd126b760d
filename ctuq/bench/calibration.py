"""The calibration benchmark: every method's uncertainty scored on images no setting has seen.

Each case's scan (:mod:`ctuq.bench.cases`) is reconstructed by
``ctuq.reconstruct`` with the size's preset and default settings, noise std
known (``model_error = 'heldout'``, the default); the scored methods are the
product's result and what follows from it without another fit
(:func:`result_methods`):

- ``posterior``: the linearised posterior alone (``Result.posterior_std``);
- ``heldout``: the product's total std (``Result.std``): posterior + the
  model error from held-out projections, its coefficients the maximum a
  posteriori under the preset's calibrated prior (maximum likelihood where
  ctuq ships no calibration for the preset);
- ``heldout_mle``: the same held-out fit's maximum-likelihood coefficients
  (recorded in the result's ``config['model_error']['info']['mle']``)
  applied to the same posterior variance;
- ``calibrated`` / ``conformal``: the preset's calibration file applied to
  the posterior variance, as ``model_error = 'calibrated'`` / ``'conformal'``
  would apply it (:func:`total_variance`).

``_predcp``: the same from a second reconstruction with ``predcp = true``.
Baselines beside them (not ctuq methods): ``fbp`` (FBP with
:func:`ctuq.recon.baselines.fbp_variance`) and ``mc_dropout``
(:func:`ctuq.recon.mc_dropout.fit_mc_dropout` with the preset's DIP
settings); with ``ivon``: ``ivon`` / ``ivon_heldout`` from a reconstruction
with ``method = 'ivon'`` (its posterior std, and its total std with the
held-out model error, maximum likelihood).

The runs are deterministic (seeded, CPU): two reconstructions of one scan
that differ only in the uncertainty settings fit the same DIP, so each
variant's DIP is the one the others got.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import time
from pathlib import Path

import numpy as np
import torch

from ctuq.bench.cases import (CASE_FIELDS, auto_center_record, case_spec, realistic_record,
                              reconstruction_op, simulate, sinogram)
from ctuq.bench.runner import (clean, merge_settings, parse_variant, read_case_file,
                               repo_relative)
from ctuq.bench.scores import score
from ctuq.recon.model_error.names import CALIBRATED, CONFORMAL, HELDOUT
from ctuq.recon.pipeline import solver_outcome

log = logging.getLogger("ctuq.bench.calibration")

__all__ = ["CalibrationRun", "LABELS", "reconstruction_config", "result_methods",
           "total_variance", "run_case", "parse_variant", "add_ivon", "rescore", "fbp_scores",
           "refresh_fbp", "summarize",
           "default_method",
           "carry_methods", "carried_note", "read_case_file", "case_spec", "CASE_FIELDS"]

LABELS = {"fbp": "FBP, residual variance", "mc_dropout": "MC-dropout DIP",
          "ivon": "IVON-DIP",
          "ivon_heldout": "IVON-DIP + held-out model error (maximum likelihood)",
          "posterior": "ctuq posterior only",
          "heldout": "ctuq + held-out model error (the default: its coefficients under the "
                     "preset's calibrated prior where ctuq ships one, else maximum likelihood)",
          "heldout_mle": "ctuq + held-out model error, maximum likelihood (no prior)",
          "calibrated": "ctuq + calibrated model error",
          "conformal": "ctuq posterior × conformal factor"}


@dataclasses.dataclass(frozen=True)
class CalibrationRun:
    """The settings of one benchmark run (picklable, for the process pool).

    Attributes
    ----------
    threads : int
        torch CPU threads per case. Default 1.
    quick : bool
        A smoke run: ``quick_iterations`` DIP iterations, 2 EM steps.
    quick_iterations : int
    predcp_variants : tuple of bool
        Which TV-PredCP variants to reconstruct. Default both.
    calibration : str or None
        Folder of ``<preset>.json`` calibration files for ``calibrated`` and
        ``conformal`` (None: those methods are not scored).
    arrays : str or None
        Keep each case's truth, reconstruction, posterior variances and
        held-out likelihoods here (``<id with _>.npz``), for rescoring with a
        later calibration and for tuning the held-out fit.
    ivon, mc_dropout : bool
        Also these methods. Default False, True.
    mc_samples : int
        MC-dropout passes. Default 128.
    uncertainty : dict, optional
        Further ``[uncertainty]`` settings of every reconstruction (e.g.
        fewer samples in a test). Default None.
    variants : tuple of (str, dict)
        Further reconstructions of each scan, ``(suffix, settings)``: the
        settings (a :class:`~ctuq.ReconstructionConfig` dict, e.g.
        ``{"noise_model": "gaussian"}``) change the default reconstruction,
        and its methods are scored as ``posterior<suffix>``,
        ``heldout<suffix>``... (without TV-PredCP). Default none.
    normalize : bool or None
        ``normalize`` of every reconstruction (:mod:`ctuq.recon.scaling`).
        Default None (the product's default).
    settings : dict or None
        Settings of every reconstruction of the run (a
        :class:`~ctuq.ReconstructionConfig` dict, e.g. ``{"uncertainty":
        {"laplace": {"mean": "linear"}}}``), under each variant's own.
        Default None.
    """

    threads: int = 1
    quick: bool = False
    quick_iterations: int = 100
    predcp_variants: tuple = (False, True)
    calibration: str | None = None
    arrays: str | None = None
    ivon: bool = False
    mc_dropout: bool = True
    mc_samples: int = 128
    uncertainty: dict | None = None
    variants: tuple = ()
    normalize: bool | None = None
    settings: dict | None = None


def reconstruction_config(case: dict, run: CalibrationRun, settings: dict | None = None,
                          **uncertainty):
    """The :class:`~ctuq.ReconstructionConfig` of a case: defaults, seed = the image index.

    ``uncertainty`` overrides (e.g. ``predcp=True``, ``method='ivon'``),
    ``settings`` further top-level settings (a variant's); the model error is named (``'heldout'``, today's default) so that the
    methods derived from the result keep their meaning if the default changes.
    """
    from ctuq.recon.config import ReconstructionConfig

    unc = {"model_error": HELDOUT, **({"em_steps": 2} if run.quick else {}),
           **(run.uncertainty or {}), **uncertainty}
    settings = merge_settings(run.settings or {}, settings or {})
    dip = {**({"iterations": run.quick_iterations} if run.quick else {}),
           **settings.pop("dip", {})}
    unc.update(settings.pop("uncertainty", {}))
    if run.normalize is not None:
        settings.setdefault("normalize", run.normalize)
    return ReconstructionConfig.from_dict({"seed": case["index"], "device": "cpu",
                                           "threads": run.threads, "dip": dip,
                                           "uncertainty": unc, **settings})


def total_variance(method: str, x_hat, var_post, coefficients) -> torch.Tensor:
    """The total variance (posterior + model error) of the model-error term
    ``method`` for a posterior variance and fitted coefficients: the term's own
    rule (:meth:`ctuq.recon.model_error.ModelErrorTerm.apply`), as the
    pipeline applies it.

    Parameters
    ----------
    method : str
        A name of :data:`ctuq.recon.model_error.MODEL_ERROR_TERMS`.
    x_hat : array or Tensor, shape (H, W)
        The reconstruction.
    var_post : array or Tensor, shape (H, W)
        The posterior variance.
    coefficients : ModelErrorCoefficients

    Returns
    -------
    Tensor, shape (H, W), float64
    """
    from ctuq.recon.model_error import MODEL_ERROR_TERMS

    x_hat = torch.as_tensor(np.asarray(x_hat))
    var_post = torch.as_tensor(np.asarray(var_post), dtype=torch.float64)
    if method not in MODEL_ERROR_TERMS:
        raise ValueError(f"unknown model-error term {method!r}")
    return var_post + MODEL_ERROR_TERMS[method].apply(coefficients, x_hat, var_post)


def result_methods(result, truth, calibration=None, suffix: str = "") -> dict:
    """The scores of every method that follows from one ``ctuq.reconstruct`` result.

    Parameters
    ----------
    result : ctuq.Result
        Of ``model_error = 'heldout'``, in memory or read back from its file
        (:func:`ctuq.read_result`): only its arrays and ``config`` are read.
    truth : array, shape (H, W)
    calibration : ModelErrorCoefficients, optional
        For ``calibrated`` and ``conformal``.
    suffix : str
        Appended to the method names (``'_predcp'``).

    Returns
    -------
    dict
        ``methods`` (name → :func:`ctuq.bench.scores.score` dict),
        ``coefficients`` (name → ``{'t0', 's1'}``; the held-out fit's also
        ``floor`` and ``fit_excess`` when it had a calibration, and ``noise_scale``)
        and ``times_s`` (name → seconds of the stages that method needs, DIP fit
        included; and ``dip``, ``heldout_fit``).
    """
    from ctuq.recon.model_error import ModelErrorCoefficients

    cfg = result.config
    if cfg["uncertainty"]["model_error"] != HELDOUT:
        raise ValueError(f"the result's model error is not {HELDOUT!r}")
    x_hat = np.asarray(result.reconstruction)
    var_post = torch.as_tensor(np.asarray(result.posterior_std), dtype=torch.float64).square()
    fitted = cfg["model_error"]
    info = fitted.get("info", {})
    mle = info.get("mle") or fitted  # no prior: the fit is the MLE
    co_mle = ModelErrorCoefficients(mle["t0"], mle["s1"], HELDOUT)
    methods = {
        "posterior": {**score(truth, x_hat, result.posterior_std),
                      "g": result.hyperparameters["a_b"][0]},
        "heldout": score(truth, x_hat, result.std),
        "heldout_mle": score(truth, x_hat, total_variance(HELDOUT, x_hat, var_post,
                                                          co_mle).sqrt())}
    prior = info.get("prior") or {}
    coefficients = {"heldout": {"t0": fitted["t0"], "s1": fitted["s1"],
                                # whether the calibration bounded the fit, and what decided it
                                **{k: prior[k] for k in ("floor", "fit_excess") if k in prior},
                                # the factor on σ² the held-out residuals were read with,
                                # the input dip.net_input = 'auto' chose, and whether the
                                # image shown is that input (heldout_input_fallback)
                                **{k: info[k] for k in ("noise_scale", "net_input",
                                                        "input_fallback") if k in info}},
                    "heldout_mle": {"t0": co_mle.t0, "s1": co_mle.s1}}
    if calibration is not None:
        for name in (CALIBRATED, CONFORMAL):
            methods[name] = score(truth, x_hat, total_variance(name, x_hat, var_post,
                                                               calibration).sqrt())
    t = cfg["timings_s"]
    post = t["dip"] + t["em"] + t["predictive"]
    times = {"dip": t["dip"], "heldout_fit": t["model_error"], "posterior": post,
             "heldout": post + t["model_error"], "heldout_mle": post + t["model_error"]}
    if calibration is not None:
        times["calibrated"] = times["conformal"] = post
    return {"methods": {k + suffix: v for k, v in methods.items()},
            "coefficients": {k + suffix: v for k, v in coefficients.items()},
            "times_s": {(k if k in ("dip", "heldout_fit") else k + suffix): v
                        for k, v in times.items()}}


def _calibration(run: CalibrationRun, preset: str):
    from ctuq.recon.model_error import ModelErrorCoefficients

    if not run.calibration:
        return None
    path = Path(run.calibration) / f"{preset}.json"
    return ModelErrorCoefficients.load(path) if path.exists() else None


def _array_file(run: CalibrationRun, case_id: str) -> Path:
    return Path(run.arrays or "") / (case_id.replace("/", "_") + ".npz")


def run_case(case: dict, run: CalibrationRun, previous: dict | None = None) -> dict:
    """Score every method on one case; a ``previous`` row without IVON gets IVON's scores.

    Returns
    -------
    dict
        The case's fields, ``noise_std``, ``preset``, ``methods`` (name →
        scores), ``times_s`` and ``coefficients``.
    """
    import ctuq

    if previous is not None:
        return add_ivon(previous, run)
    torch.set_num_threads(run.threads)
    scan = simulate(case)
    truth, sino = scan.truth, sinogram(scan, with_truth=False)
    base = reconstruction_config(case, run)
    preset = base.preset_for((scan.case.size, scan.case.size))
    out = {**case, "noise_std": scan.sigma, "preset": preset, "methods": {}, "times_s": {},
           "coefficients": {}}
    m, times = out["methods"], out["times_s"]

    t0 = time.perf_counter()
    center = auto_center_record(scan) if scan.hidden is not None else None
    m["fbp"] = fbp_scores(scan, center)
    times["fbp"] = time.perf_counter() - t0
    if center is not None:
        out["fbp_center_offset"] = center["used"]

    calibration = _calibration(run, preset)
    arrays = {"truth": truth}
    variants = [("_predcp" if p else "", None, {"predcp": p}) for p in run.predcp_variants]
    variants += [(suffix, settings, {"predcp": False}) for suffix, settings in run.variants]
    for suffix, settings, unc in variants:
        config = reconstruction_config(case, run, settings, **unc)
        likelihoods = []
        with _kept_heldout_likelihoods(likelihoods) if run.arrays else contextlib.nullcontext():
            result = ctuq.reconstruct(sino, config)
        if scan.hidden is not None:
            out.setdefault("realistic", {})[suffix or "default"] = realistic_record(
                scan, result, center)
        out.setdefault("solver", {})[suffix or "default"] = solver_outcome(result.em_trace or [])
        r = result_methods(result, truth, calibration, suffix)
        for key in ("methods", "coefficients", "times_s"):
            out[key].update(r[key])
        arrays["x_hat" + suffix] = np.asarray(result.reconstruction)  # a variant's own DIP
        arrays["var_post" + suffix] = np.asarray(result.posterior_std, np.float64) ** 2
        if likelihoods:  # the held-out term's likelihood (absent without that term)
            arrays.update({f"heldout{suffix}_{k}": v
                           for k, v in likelihoods[-1].arrays().items()})
        log.info("%s: %s ±2σ %.3f (posterior %.3f), LL %.3f", case["id"], "heldout" + suffix,
                 m["heldout" + suffix]["coverage_2"], m["posterior" + suffix]["coverage_2"],
                 m["heldout" + suffix]["pixel_log_likelihood"])

    if run.arrays:  # for rescoring with a calibration made later, and for tuning
        Path(run.arrays).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(_array_file(run, case["id"]), **arrays)
    if run.ivon:  # IVON continues the same Adam fit
        iv = _ivon(case, run, scan, sino, out)
        iv.pop("_ivon_dip")
        out.update(iv)
    if run.mc_dropout:
        from ctuq.recon.mc_dropout import fit_mc_dropout

        dip_cfg, _ = base.resolve((scan.case.size, scan.case.size))
        mc = fit_mc_dropout(scan.y, reconstruction_op(scan, center),
                            dip_cfg.with_(progress_every=10**6),
                            n_samples=run.mc_samples, noise_std=scan.sigma)
        times["mc_dropout"] = mc.wall_time
        m["mc_dropout"] = score(truth, mc.mean, mc.std)
    return clean(out)


@contextlib.contextmanager
def _kept_heldout_likelihoods(into: list):
    """Keep, in ``into``, the held-out likelihood each reconstruction in the block fits its
    model error with (``fit_heldout(keep=...)``), for tuning the held-out term afterwards.

    The very arrays the run used, so the image they judge is the one the run
    judged: the held-out fit's output, or with a linear step (``mean =
    "linear-heldout"``) that output plus its own step; a refit of the held-out
    DIP could give neither exactly.
    """
    from ctuq.recon.model_error import terms

    real = terms.fit_heldout
    terms.fit_heldout = functools.partial(real, keep=into)
    try:
        yield into
    finally:
        terms.fit_heldout = real


def _ivon(case: dict, run: CalibrationRun, scan, sino, row: dict) -> dict:
    """``ivon`` and ``ivon_heldout`` (scores, times, coefficients) from an IVON reconstruction."""
    import ctuq

    result = ctuq.reconstruct(sino, reconstruction_config(case, run, method="ivon"))
    t = result.config["timings_s"]
    x = np.asarray(result.reconstruction)
    fitted = result.config["model_error"]
    methods = {**row["methods"], "ivon": score(scan.truth, x, result.posterior_std),
               "ivon_heldout": score(scan.truth, x, result.std)}
    times = {**row["times_s"], "ivon": t["total"] - t["model_error"] - t["fbp"],
             "ivon_heldout": t["total"] - t["fbp"]}
    coefficients = {**row["coefficients"], "ivon_heldout": {"t0": fitted["t0"],
                                                            "s1": fitted["s1"]}}
    return {"methods": methods, "times_s": times, "coefficients": coefficients,
            "_ivon_dip": np.asarray(result.dip)}


def fbp_scores(scan, center: dict | None = None) -> dict:
    """The FBP baseline's scores on a scan
    (:func:`ctuq.recon.baselines.fbp_variance`).

    On a realistic scan the FBP uses the centre of rotation that the default
    (``center_offset = 'auto'``) uses, ``center`` (:func:`auto_center_record`;
    estimated here when not given): the FBP a user of the default compares with.
    """
    from ctuq.recon.baselines import fbp_variance

    op = reconstruction_op(scan, center)
    x_fbp, var_fbp, _ = fbp_variance(scan.y, op, scan.sigma, seed=scan.noise_seed)
    return score(scan.truth, x_fbp, var_fbp.sqrt())


def refresh_fbp(rows: list[dict]) -> int:
    """Score again, on the centre the default uses, the FBP of realistic rows that
    scored it at offset 0 (rows made before 2026-11-29, which lack
    ``fbp_center_offset``); the scans are simulated again. Returns how many."""
    n = 0
    for r in rows:
        if "realistic" not in r or "fbp_center_offset" in r:
            continue
        scan = simulate(r)
        center = auto_center_record(scan)
        r["methods"]["fbp"] = clean(fbp_scores(scan, center))
        r["fbp_center_offset"] = center["used"]
        n += 1
    return n


def add_ivon(row: dict, run: CalibrationRun) -> dict:
    """IVON's scores for a case scored without them (the scan and fits are redone).

    ``ivon_refit_max_abs_diff`` records how far this run's Adam DIP fit is
    from the stored reconstruction (with ``arrays``; None without them).
    """
    torch.set_num_threads(run.threads)
    scan = simulate(row)
    out = {**row, **_ivon(row, run, scan, sinogram(scan, with_truth=False), row)}
    npz = _array_file(run, row["id"])
    dip = out.pop("_ivon_dip")
    out["ivon_refit_max_abs_diff"] = float(np.abs(np.load(npz)["x_hat"] - dip).max()) \
        if run.arrays and npz.exists() else None
    return clean(out)


def rescore(results: list[dict], run: CalibrationRun) -> None:
    """Add calibrated/conformal scores to cached cases that lack them (their arrays kept)."""
    for r in results:
        cal = _calibration(run, r["preset"])
        npz = _array_file(run, r["id"])
        if "calibrated" in r["methods"] or cal is None or not run.arrays or not npz.exists():
            continue
        a = np.load(npz)
        for suffix in ("", "_predcp"):
            if "var_post" + suffix not in a.files:
                continue
            for name in ("calibrated", "conformal"):
                std = total_variance(name, a["x_hat"], a["var_post" + suffix], cal).sqrt()
                r["methods"][name + suffix] = clean(score(a["truth"], a["x_hat"], std))
            r["times_s"]["calibrated" + suffix] = r["times_s"]["conformal" + suffix] = \
                r["times_s"]["posterior" + suffix]
        r["rescored_with"] = str(Path(run.calibration) / f"{r['preset']}.json")


# ------------------------------------------------------------------------------
# summaries


def _summary(rows: list[dict], method: str) -> dict:
    ms = [r["methods"][method] for r in rows if method in r["methods"]]
    if not ms:
        return {}
    # a score may be None on some image (an infinite log-likelihood, no edges): the
    # mean is over the images that have it
    keys = sorted({k for x in ms for k, v in x.items()
                   if k != "reliability" and isinstance(v, (int, float))})
    out = {"images": len(ms)}
    for k in keys:
        vals = [x[k] for x in ms if x.get(k) is not None]
        out[k] = float(np.mean(vals)) if vals else None
    for k in ("coverage_2", "coverage_2_edges", "pixel_log_likelihood", "spearman"):
        vals = [x[k] for x in ms if x.get(k) is not None]
        out[f"worst_{k}"] = float(np.min(vals)) if vals else None
    # sharpness beside coverage: a wider interval must not pass for a better one
    ratios = [x["mean_std"] / x["rmse"] for x in ms if x.get("rmse")]
    out["std_over_rmse"] = float(np.mean(ratios)) if ratios else None
    out["reliability"] = np.mean([x["reliability"] for x in ms], 0).tolist()
    times = [r["times_s"].get(method) for r in rows if r["times_s"].get(method) is not None]
    out["time_s"] = float(np.mean(times)) if times else None
    return out


def summarize(results: list[dict], default: str) -> dict:
    """Per size: every method's mean and worst image, per condition and family; the targets."""
    methods = sorted({k for r in results for k in r["methods"]})
    out = {}
    for size in sorted({r["size"] for r in results}):
        rows = [r for r in results if r["size"] == size]
        block = {"images": len(rows), "methods": {k: _summary(rows, k) for k in methods},
                 "conditions": {}}
        for cond in sorted({r["condition"] for r in rows}):
            sub = [r for r in rows if r["condition"] == cond]
            block["conditions"][cond] = {k: _summary(sub, k) for k in methods}
        block["families"] = {fam: {k: _summary([r for r in rows if r["family"] == fam], k)
                                   for k in methods}
                             for fam in sorted({r["family"] for r in rows})}
        # images whose EM solves stopped above tolerance (rows since 2026-11-29 record it)
        solved = [r for r in rows if "solver" in r]
        block["solver"] = {"images": len(solved), "unconverged_images": sum(
            any(v["unconverged"] for v in r["solver"].values()) for r in solved)}
        for key in ("em_steps", "solver_iterations", "em_s"):  # per reconstruction
            vals = [v[key] for r in solved for v in r["solver"].values() if key in v]
            if vals:
                block["solver"][key + "_mean"] = float(np.mean(vals))
        with_ivon = [r for r in rows if "ivon" in r["methods"]]
        if with_ivon and len(with_ivon) < len(rows):  # a like-for-like comparison
            block["ivon_images"] = {"images": len(with_ivon),
                                    "methods": {k: _summary(with_ivon, k) for k in methods}}
        d = block["methods"].get(default, {})
        if d:
            fbp = block["methods"]["fbp"]
            block["targets"] = {
                "coverage_2_mean_in_90_99": 0.90 <= d["coverage_2"] <= 0.99,
                "coverage_2_worst_image_at_least_85": d["worst_coverage_2"] >= 0.85,
                "coverage_2_edges_at_least_85": d["coverage_2_edges"] >= 0.85,
                "ll_above_fbp": d["pixel_log_likelihood"] > fbp["pixel_log_likelihood"],
                "spearman_at_least_0.5": d["spearman"] >= 0.5,
                "coverage_1_in_60_80": 0.60 <= d["coverage_1"] <= 0.80,
                "std_over_rmse_at_most_1.3": (d.get("std_over_rmse") or np.inf) <= 1.3}
            real = [r["realistic"] for r in rows if "realistic" in r]
            if real:
                errs = [v["center_auto_error"] for rec in real for v in rec.values()
                        if v.get("center_auto_error") is not None]
                # the centre's errors in units of its reported std (rows since 2026-11-29)
                z = [v["center_auto_error"] / v["center_auto_std"] for rec in real
                     for v in rec.values() if v.get("center_auto_error") is not None
                     and v.get("center_auto_std")]
                block["realistic"] = {
                    "images": len(real),
                    "center_auto_error_max": float(max(errs)) if errs else None,
                    "center_auto_error_mean": float(np.mean(errs)) if errs else None,
                    "center_auto_error_over_std_rms": (float(np.sqrt(np.mean(np.square(z))))
                                                       if z else None),
                    "center_auto_error_over_std_max": float(max(z)) if z else None,
                    "center_auto_std_images": len(z),  # rows with a std (older rows lack it)
                    "center_auto_undetermined": sum(v.get("center_offset_auto") is None
                                                    for rec in real for v in rec.values()),
                    "misfit_flags": sum(v.get("verdict") == "misfit"
                                        for rec in real for v in rec.values())}
                if errs:
                    block["targets"]["center_auto_within_0.5px"] = max(errs) <= 0.5
        out[str(size)] = block
    return out


def default_method() -> str:
    """The method ``ctuq reconstruct`` runs with no settings, in this benchmark's names."""
    from ctuq.recon.config import UncertaintyConfig

    unc = UncertaintyConfig()
    base = "posterior" if unc.model_error == "none" else unc.model_error
    return base + ("_predcp" if unc.predcp else "")


def carried_note(cases: list[dict]) -> str | None:
    """The docs' sentence on carried methods: each with its image count, and the sources."""
    carried = [r for r in cases if r.get("carried")]
    if not carried:
        return None
    counts = collections.Counter(m for r in carried for m in r["carried"]["methods"])
    sources = sorted({r["carried"]["from"] for r in carried})
    return ("Carried, not rerun: " + ", ".join(
        f"`{m}` on {n} images" for m, n in sorted(counts.items()))
        + f", copied from the same images' rows of an earlier run ({', '.join(sources)}); "
        "their fits were made by that run's code, not from this run's DIP fit.")


def carry_methods(results: list[dict], path) -> None:
    """Copy the methods a result lacks from the same case's row in an earlier run.

    For methods this run skipped (no MC dropout, no IVON) whose fits do not
    depend on what changed: the row names them in ``carried``.
    """
    earlier = {r["id"]: r for r in read_case_file(path)}
    for r in results:
        old = earlier.get(r["id"])
        if old is None:
            continue
        names = [k for k in old["methods"] if k not in r["methods"]]
        for k in names:
            r["methods"][k] = old["methods"][k]
            if k in old.get("times_s", {}):
                r["times_s"][k] = old["times_s"][k]
            if k in old.get("coefficients", {}):
                r["coefficients"][k] = old["coefficients"][k]
        if names:
            r["carried"] = {"from": repo_relative(str(path)), "methods": names}


# ------------------------------------------------------------------------------
# a whole run


def _worker(case: dict, run: CalibrationRun, previous: dict | None = None) -> dict:
    """:func:`run_case` in a pool worker (its own logging to stderr)."""
    import sys

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    logging.getLogger("ctuq.bench").setLevel(logging.INFO)
    return run_case(case, run, previous)


def benchmark(cases: list[dict], run: CalibrationRun, *, partial=None, jobs: int = 1,
              carry=None, complete_ivon: bool | None = None, cases_planned: int | None = None,
              **doc_fields) -> dict:
    """Run (or read back from ``partial``) every case and summarise them in one document.

    Parameters
    ----------
    cases : list of dict
        From :func:`ctuq.bench.cases.calibration_cases` (or :func:`case_spec`
        of earlier rows).
    run : CalibrationRun
    partial : path-like, optional
        The resumable JSON-lines file (:func:`ctuq.bench.runner.run_resumable`).
    jobs : int
        Cases at a time (processes).
    carry : path-like, optional
        Copy the methods this run skips from the same cases of this earlier
        document or partial file (:func:`carry_methods`).
    complete_ivon : bool, optional
        Give read-back rows without IVON its scores. Default: ``run.ivon``.
    cases_planned : int, optional
        For the document. Default ``len(cases)``.
    **doc_fields
        Added to the document (``split``, ``sizes``, ``script``...).

    Returns
    -------
    dict
        The benchmark document: the fields given, ``default``, ``calibration``,
        ``machine``, ``date``, ``wall_time_s``, ``summary`` and ``cases``.
    """
    import functools

    from ctuq.bench.machine import machine
    from ctuq.bench.runner import run_resumable

    complete_ivon = run.ivon if complete_ivon is None else complete_ivon
    t0 = time.perf_counter()
    results = run_resumable(cases, partial, functools.partial(run_case, run=run), jobs,
                            functools.partial(_worker, run=run),
                            complete=(lambda r: "ivon" in r["methods"]) if complete_ivon
                            else None)
    rescore(results, run)
    if n := refresh_fbp(results):
        log.info("the FBP of %d realistic case(s) scored again on the centre the default uses",
                 n)
    if carry:
        carry_methods(results, carry)
    default = default_method()
    doc = {**doc_fields, "cases_run": len(results),
           "cases_planned": len(cases) if cases_planned is None else cases_planned,
           "predcp_variants": list(run.predcp_variants), "default": default,
           **({} if run.normalize is None else {"normalize": run.normalize}),
           **({"settings": run.settings} if run.settings else {}),
           "calibration": repo_relative(run.calibration) if run.calibration else None,
           "jobs": jobs, "threads": run.threads, "machine": machine("cpu"),
           "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
           "summary": summarize(results, default), "cases": results}
    return clean(doc)
