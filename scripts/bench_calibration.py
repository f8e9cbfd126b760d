#!/usr/bin/env python
"""Calibration of ctuq's uncertainty on images no setting has seen (issue 21).

Prints one JSON document on stdout (progress on stderr); with ``--docs DIR``
also writes ``DIR/calibration.md`` (tables) and one reliability plot per size.

**Cases** come from one split of :mod:`ctuq.data.splits` (``--split``; the
README's numbers come from ``test``, defaults were chosen on
``validation``): at 64², 30 and 60 parallel-beam angles × 1 % and 5 % noise;
at 128², 60 angles × 1 % and 5 %; ``--per-family`` images of every family of
the split per condition, each condition with its own images (indices run on
across conditions), each scan with its own noise draw. Noise std known to
every method.

**Methods**, all on the same simulated scan and, where they share it, the
same DIP+TV fit (the size's preset, default settings):

- ``fbp``: FBP with :func:`ctuq.recon.baselines.fbp_variance` (propagated
  noise + an iid term that explains the excess data residual);
- ``mc_dropout``: MC-dropout DIP (p = 0.05, ``--mc-samples`` passes);
- ``posterior`` / ``posterior_predcp``: ctuq's linearised posterior alone,
  without / with TV-PredCP (the EM's MAP-II);
- ``heldout`` / ``heldout_predcp``: + the model error from held-out projections,
  its coefficients the maximum a posteriori under the preset's calibrated prior
  (``uncertainty.heldout_prior_width``; maximum likelihood where ctuq ships no
  calibration for the preset);
- ``heldout_mle`` / ``heldout_mle_predcp``: the same without the prior;
- ``calibrated`` / ``calibrated_predcp``: + the model error from the
  preset's calibration file (``--calibration DIR``: ``<preset>.json``, made by
  ``ctuq calibrate`` on the tuning split);
- ``conformal`` / ``conformal_predcp``: the posterior std × the same file's
  split-conformal multiplier;
- ``ivon`` / ``ivon_heldout`` (with ``--ivon``): IVON from the same Adam
  fit (``[uncertainty] method = "ivon"``, docs/ivon.md), alone and + the
  same held-out model error;
- ``default``: what ``ctuq reconstruct`` does with no settings (one of the
  above, named in the document).

**Scores** per method and image: ±1/2/3σ coverage overall, within one pixel
of an edge of the truth and elsewhere (:func:`ctuq.recon.model_error.edge_mask`),
per-pixel test log-likelihood with no variance floor, Spearman(std, |error|),
PSNR, the reliability curve, wall time; summarised per size and condition by
the mean and the worst image.

Usage::

    python scripts/bench_calibration.py --split test --sizes 64,128 --jobs 2 \\
        --partial bench_calibration_cases.jsonl --docs docs > docs/bench_calibration.json
    python scripts/bench_calibration.py --quick          # minutes: a smoke run

``--partial FILE`` appends every finished case to FILE and reads it back on a
rerun, so an interrupted run resumes where it stopped; with ``--arrays DIR``
the images are kept too, and cases scored before a calibration file existed
get their ``calibrated``/``conformal`` scores on the next run.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: shared helpers
from bench_evidence import _clean, read_cases, run_resumable  # noqa: E402
from bench_sampling import _machine  # noqa: E402

log = logging.getLogger("bench_calibration")

CONDITIONS = {64: [(30, 0.01), (30, 0.05), (60, 0.01), (60, 0.05)],
              128: [(60, 0.01), (60, 0.05)], 28: [(20, 0.05)]}
POSTERIOR_METHODS = ("posterior", "heldout", "heldout_mle", "calibrated", "conformal")
LABELS = {"fbp": "FBP, residual variance", "mc_dropout": "MC-dropout DIP",
          "ivon": "IVON-DIP",
          "ivon_heldout": "IVON-DIP + held-out model error (maximum likelihood)",
          "posterior": "ctuq posterior only",
          "heldout": "ctuq + held-out model error (the default: its coefficients under the "
                     "preset's calibrated prior where ctuq ships one, else maximum likelihood)",
          "heldout_mle": "ctuq + held-out model error, maximum likelihood (no prior)",
          "calibrated": "ctuq + calibrated model error",
          "conformal": "ctuq posterior × conformal factor"}
LEVELS = tuple(np.round(np.linspace(0.05, 0.95, 19), 2))


def case_list(args) -> list[dict]:
    from ctuq.data.splits import FAMILIES

    out = []
    for size in args.sizes:
        conditions = list(enumerate(CONDITIONS[size]))
        if args.conditions:  # a subset; ids and images stay those of the full list
            conditions = [(j, c) for j, c in conditions if c in args.conditions]
        # images first, then conditions, then families: a partial run covers every
        # family and condition before it adds a second image of any
        for i in range(args.per_family):
            for j, (n_angles, noise) in conditions:
                for family in FAMILIES[args.split]:
                    index = j * args.per_family + i
                    out.append({"id": f"{args.split}/{family}/{index}/{size}/{n_angles}/"
                                      f"{round(noise * 100)}",
                                "split": args.split, "family": family, "index": index,
                                "size": size, "n_angles": n_angles, "noise": noise,
                                "condition": f"{n_angles} angles, {noise:.0%} noise"})
    return sorted(out, key=lambda c: -c["size"])  # longest first


def score(truth, mean, std) -> dict:
    """Coverage (overall, edges, off edges), LL without floor, Spearman, reliability."""
    from ctuq.recon import predictive
    from ctuq.recon.model_error import edge_mask

    t, m = np.asarray(truth, np.float64), np.asarray(mean, np.float64)
    s = np.asarray(std, np.float64)
    z = np.abs(t - m) / np.maximum(s, 1e-300)
    edges = edge_mask(t).numpy()
    var = np.maximum(s, 1e-300) ** 2
    ll = -0.5 * ((t - m) ** 2 / var + np.log(var) + math.log(2 * math.pi))
    out = {"psnr": predictive.psnr(t, m), "ssim": predictive.ssim(t, m),
           "pixel_log_likelihood": float(ll.mean()),
           "spearman": predictive.spearman_std_error(s, t - m), "mean_std": float(s.mean()),
           "edge_fraction": float(edges.mean())}
    for k in (1, 2, 3):
        out[f"coverage_{k}"] = float((z <= k).mean())
        out[f"coverage_{k}_edges"] = float((z[edges] <= k).mean()) if edges.any() else None
        out[f"coverage_{k}_off_edges"] = float((z[~edges] <= k).mean()) \
            if (~edges).any() else None
    out["reliability"] = predictive.reliability(t, m, s, LEVELS)["observed"]
    return out


def _scan(case: dict, args):
    """The case's simulated scan, operator, resolved settings and Adam DIP fit."""
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.data.splits import Case
    from ctuq.recon.config import ReconstructionConfig
    from ctuq.recon.dip import fit_dip

    torch.set_num_threads(args.threads)
    c = Case(case["split"], case["family"], case["index"], case["size"])
    truth = c.image()
    op = RayTransform(Geometry.parallel(c.size, case["n_angles"]))
    offset = CONDITIONS[c.size].index((case["n_angles"], case["noise"]))
    y, sigma = simulate_sinogram(truth, op, case["noise"], seed=c.noise_seed(offset))
    rcfg = ReconstructionConfig(seed=c.index, device="cpu", threads=args.threads,
                                dip={"iterations": args.quick_iterations} if args.quick else {},
                                uncertainty={"em_steps": 2} if args.quick else {})
    dip_cfg, unc = rcfg.resolve((c.size, c.size))
    dip = fit_dip(y, op, dip_cfg.with_(progress_every=10**6), noise_std=sigma)
    return dict(c=c, truth=truth, op=op, offset=offset, y=y, sigma=sigma, dip_cfg=dip_cfg,
                unc=unc, preset=rcfg.preset_for((c.size, c.size)), dip=dip)


def run_case(case: dict, args, previous: dict | None = None) -> dict:
    """Score every method on one case; a ``previous`` result without IVON gets IVON's scores."""
    from ctuq.recon import model_error as me
    from ctuq.recon.baselines import fbp_variance
    from ctuq.recon.mc_dropout import fit_mc_dropout
    from ctuq.recon.pipeline import heldout_prior, posterior_uncertainty

    if previous is not None:
        return add_ivon(previous, args)
    s = _scan(case, args)
    c, truth, op, y, sigma, dip, unc = (s[k] for k in ("c", "truth", "op", "y", "sigma",
                                                        "dip", "unc"))
    dip_cfg, preset, offset = s["dip_cfg"], s["preset"], s["offset"]
    out = {**case, "noise_std": sigma, "preset": preset, "methods": {}, "times_s": {},
           "coefficients": {}}
    m, times = out["methods"], out["times_s"]

    t0 = time.perf_counter()
    x_fbp, var_fbp, _ = fbp_variance(y, op, sigma, seed=c.noise_seed(offset))
    times["fbp"] = time.perf_counter() - t0
    m["fbp"] = score(truth, x_fbp, var_fbp.sqrt())

    times["dip"] = dip.wall_time
    x_hat = dip.reconstruction.detach().cpu()
    t0 = time.perf_counter()
    mask, dip_in = me.heldout_fit(y, op, dip.config, every=unc.heldout_every,
                                  min_out=unc.heldout_min_out, noise_std=sigma)
    times["heldout_fit"] = time.perf_counter() - t0
    calibration = None
    if args.calibration:
        path = Path(args.calibration) / f"{preset}.json"
        calibration = me.ModelErrorCoefficients.load(path) if path.exists() else None

    arrays = {"truth": truth, "x_hat": x_hat.numpy()}
    for predcp in args.predcp_variants:
        suffix = "_predcp" if predcp else ""
        u = posterior_uncertainty(dip, op, y, sigma, dataclasses.replace(unc, predcp=predcp),
                                  learn_noise=False, seed=c.index)
        var_post = u["variance"].double().cpu()
        arrays["var_post" + suffix] = var_post.numpy()
        times["posterior" + suffix] = sum(u["timings"].values())
        m["posterior" + suffix] = {**score(truth, x_hat, var_post.sqrt()),
                                   "g": u["posterior"].hyperparameters()["a_b"][0]}
        t0 = time.perf_counter()
        lik = me.heldout_likelihood(op, y, mask, dip_in.reconstruction.detach().cpu(), var_post,
                                    sigma**2)
        arrays.update({f"heldout{suffix}_{k}": v for k, v in lik.arrays().items()})
        mle = lik.fit()
        prior, _ = heldout_prior(unc, preset)  # what ctuq reconstruct does by default
        co = lik.fit(prior, unc.heldout_prior_width) if prior is not None else mle
        times["heldout" + suffix] = times["posterior" + suffix] + times["heldout_fit"] + (
            time.perf_counter() - t0)
        times["heldout_mle" + suffix] = times["heldout" + suffix]
        for name, fitted in (("heldout", co), ("heldout_mle", mle)):
            out["coefficients"][name + suffix] = {"t0": fitted.t0, "s1": fitted.s1}
            m[name + suffix] = score(truth, x_hat, (var_post + fitted.variance(x_hat, var_post))
                                     .sqrt())
        if calibration is not None:
            m.update(calibrated_scores(truth, x_hat, var_post, calibration, suffix))
            times["calibrated" + suffix] = times["conformal" + suffix] = \
                times["posterior" + suffix]
        log.info("%s: %s ±2σ %.3f (posterior %.3f), LL %.3f", case["id"], "heldout" + suffix,
                 m["heldout" + suffix]["coverage_2"], m["posterior" + suffix]["coverage_2"],
                 m["heldout" + suffix]["pixel_log_likelihood"])

    if args.arrays:  # for rescoring with a calibration made later (--calibration)
        Path(args.arrays).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(Path(args.arrays) / (case["id"].replace("/", "_") + ".npz"),
                            **arrays)
    if args.ivon:  # IVON from the same Adam fit, alone and with the same held-out term
        _ivon_scores(out, s, mask, dip_in)
    if not args.no_mc_dropout:
        mc = fit_mc_dropout(y, op, dip_cfg.with_(progress_every=10**6),
                            n_samples=args.mc_samples, noise_std=sigma)
        times["mc_dropout"] = mc.wall_time
        m["mc_dropout"] = score(truth, mc.mean, mc.std)
    for name in m:  # the DIP fit is part of every DIP-based method's time
        if name not in ("fbp", "mc_dropout"):
            times[name] = times.get(name, 0.0) + times["dip"]
    return _clean(out)


def _ivon_scores(out: dict, s: dict, mask, dip_in) -> None:
    """Add ``ivon`` and ``ivon_heldout`` (scores, times without the DIP fit) to ``out``."""
    from ctuq.recon import model_error as me
    from ctuq.recon.ivon_dip import ivon_uncertainty

    m, times = out["methods"], out["times_s"]
    iv = ivon_uncertainty(s["dip"], s["op"], s["y"], s["sigma"],
                          dataclasses.replace(s["unc"], method="ivon"), seed=s["c"].index)
    x_iv, var_iv = iv["reconstruction"].detach().double().cpu(), iv["variance"].double()
    times["ivon"] = sum(iv["timings"].values())
    m["ivon"] = score(s["truth"], x_iv, var_iv.sqrt())
    t0 = time.perf_counter()
    co = me.fit_heldout(s["op"], s["y"], mask, dip_in.reconstruction.detach().cpu(), var_iv,
                        s["sigma"] ** 2)
    times["ivon_heldout"] = times["ivon"] + times["heldout_fit"] + (time.perf_counter() - t0)
    out["coefficients"]["ivon_heldout"] = {"t0": co.t0, "s1": co.s1}
    m["ivon_heldout"] = score(s["truth"], x_iv, (var_iv + co.variance(x_iv, var_iv)).sqrt())


def add_ivon(row: dict, args) -> dict:
    """IVON's scores for a case scored without ``--ivon``, from the same fits, refitted.

    The Adam DIP fit and the held-out fit are deterministic (seeded, CPU): they are
    refitted, not stored. ``ivon_refit_max_abs_diff`` records how far the refitted
    reconstruction is from the stored one (``--arrays``; ``None`` without it); the
    times of the original run are kept for the shared stages.
    """
    from ctuq.recon import model_error as me

    s = _scan(row, args)
    out = {**row, "methods": dict(row["methods"]), "times_s": dict(row["times_s"]),
           "coefficients": dict(row["coefficients"])}
    npz = Path(args.arrays or "") / (row["id"].replace("/", "_") + ".npz")
    out["ivon_refit_max_abs_diff"] = float(np.abs(
        np.load(npz)["x_hat"] - s["dip"].reconstruction.detach().cpu().numpy()).max()) \
        if args.arrays and npz.exists() else None
    mask, dip_in = me.heldout_fit(s["y"], s["op"], s["dip"].config,
                                  every=s["unc"].heldout_every,
                                  min_out=s["unc"].heldout_min_out, noise_std=s["sigma"])
    _ivon_scores(out, s, mask, dip_in)
    for name in ("ivon", "ivon_heldout"):
        out["times_s"][name] += out["times_s"]["dip"]
    return _clean(out)


def calibrated_scores(truth, x_hat, var_post, calibration, suffix: str) -> dict:
    """Scores of the ``calibrated`` and ``conformal`` methods for one posterior variance."""
    x_hat, var_post = torch.as_tensor(x_hat), torch.as_tensor(var_post, dtype=torch.float64)
    return {"calibrated" + suffix: score(truth, x_hat,
                                         (var_post + calibration.variance(x_hat, var_post))
                                         .sqrt()),
            "conformal" + suffix: score(truth, x_hat,
                                        max(calibration.conformal, 1.0) * var_post.sqrt())}


def rescore(results: list[dict], args) -> None:
    """Add calibrated/conformal scores to cached cases that lack them (their arrays kept)."""
    from ctuq.recon.model_error import ModelErrorCoefficients

    for r in results:
        path = Path(args.calibration) / f"{r['preset']}.json"
        npz = Path(args.arrays or "") / (r["id"].replace("/", "_") + ".npz")
        if "calibrated" in r["methods"] or not path.exists() or not npz.exists():
            continue
        cal = ModelErrorCoefficients.load(path)
        arrays = np.load(npz)
        for suffix in ("", "_predcp"):
            r["methods"].update(_clean(calibrated_scores(
                arrays["truth"], arrays["x_hat"], arrays["var_post" + suffix], cal, suffix)))
            r["times_s"]["calibrated" + suffix] = r["times_s"]["conformal" + suffix] = \
                r["times_s"]["posterior" + suffix]
        r["rescored_with"] = str(path)


def _worker(case, args, previous=None):
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    for name in ("ctuq",):
        logging.getLogger(name).setLevel(logging.WARNING)
    return run_case(case, args, previous)


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
    out["reliability"] = np.mean([x["reliability"] for x in ms], 0).tolist()
    times = [r["times_s"].get(method) for r in rows if r["times_s"].get(method) is not None]
    out["time_s"] = float(np.mean(times)) if times else None
    return out


def summarize(results: list[dict], default: str) -> dict:
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
                "spearman_at_least_0.5": d["spearman"] >= 0.5}
        out[str(size)] = block
    return out


def default_method() -> str:
    """The method ``ctuq reconstruct`` runs with no settings, in this script's names."""
    from ctuq.recon.config import UncertaintyConfig

    unc = UncertaintyConfig()
    base = "posterior" if unc.model_error == "none" else unc.model_error
    return base + ("_predcp" if unc.predcp else "")


def _repo_relative(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (portable documents)."""
    repo = Path(__file__).resolve().parents[1]
    p = Path(path).resolve()
    return str(p.relative_to(repo)) if p.is_relative_to(repo) else str(path)


def write_docs(doc: dict, folder: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"# Calibration benchmark ({doc['split']} split)", "",
             f"Generated by `scripts/bench_calibration.py`; {doc['machine']['cpu']}, "
             f"{doc['threads']} thread(s) per case, {doc['jobs']} case(s) at a time, "
             f"{doc['date']}. Default method: `{doc['default']}`.", "",
             f"Cases: {doc.get('cases_run', '?')} run of {doc.get('cases_planned', '?')} "
             f"planned; conditions {doc.get('conditions') or 'all of the size'}; TV-PredCP "
             f"variants {doc.get('predcp_variants')}. Coverage and log-likelihood (nats per "
             f"pixel, no variance floor) are means over images; 'worst' is the worst image. "
             f"Split: **{doc['split']}** (docs/data_splits.md).", "",
             "Methods (`_predcp`: the same with the TV-PredCP hyperprior in the EM):", ""]
    lines += [f"- `{k}`: {v}" for k, v in LABELS.items()] + [
        "", "The scan is simulated from the case's phantom with its own noise draw; "
        "every DIP-based method shares one DIP+TV fit; the time per image includes it "
        "(MC dropout fits its own network).", ""]
    note = carried_note(doc["cases"])
    if note:
        lines += [note, ""]
    def method_table(methods: dict) -> list[str]:
        out = ["| method | images | ±1σ | ±2σ | ±3σ | ±2σ edges | ±2σ off edges | worst ±2σ "
               "| LL | worst LL | Spearman | PSNR | s / image |",
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        pct = lambda v: "–" if v is None else f"{100 * v:.1f}"  # noqa: E731
        num = lambda v, f=".2f": "–" if v is None else format(v, f)  # noqa: E731
        for name, s in methods.items():
            if not s:
                continue
            label = f"**{name}** (default)" if name == doc["default"] else name
            out.append(f"| {label} | {s.get('images')} | {pct(s.get('coverage_1'))} | "
                       f"{pct(s.get('coverage_2'))} | {pct(s.get('coverage_3'))} | "
                       f"{pct(s.get('coverage_2_edges'))} | {pct(s.get('coverage_2_off_edges'))} | "
                       f"{pct(s.get('worst_coverage_2'))} | {num(s.get('pixel_log_likelihood'))} | "
                       f"{num(s.get('worst_pixel_log_likelihood'))} | {num(s.get('spearman'))} | "
                       f"{num(s.get('psnr'))} | {num(s.get('time_s'), '.0f')} |")
        return out

    for size, block in doc["summary"].items():
        lines += [f"## {size}² ({block['images']} images)", ""] + method_table(block["methods"])
        if "ivon_images" in block:
            lines += ["", f"The {block['ivon_images']['images']} images of {size}² that have "
                      "the IVON methods, every method on them (a like-for-like comparison):",
                      ""] + method_table(block["ivon_images"]["methods"])
        lines += ["", f"Default method per condition, {size}²:", "",
                  "| condition | images | ±2σ | worst ±2σ | ±2σ edges | LL | Spearman | PSNR |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for cond, methods in block["conditions"].items():
            s = methods.get(doc["default"])
            if s:
                lines.append(f"| {cond} | {s.get('images', '')} | {100 * s['coverage_2']:.1f} | "
                             f"{100 * s['worst_coverage_2']:.1f} | "
                             f"{100 * s['coverage_2_edges']:.1f} | "
                             f"{s['pixel_log_likelihood']:.2f} | {s['spearman']:.2f} | "
                             f"{s['psnr']:.2f} |")
        lines += ["", f"Per family, {size}² (default method / posterior only):", "",
                  "| family | images | ±2σ | worst ±2σ | ±2σ edges | LL | posterior-only ±2σ |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for fam, methods in block.get("families", {}).items():
            s, p = methods.get(doc["default"]), methods.get("posterior")
            if s:
                lines.append(f"| {fam} | {s['images']} | {100 * s['coverage_2']:.1f} | "
                             f"{100 * s['worst_coverage_2']:.1f} | "
                             f"{100 * s['coverage_2_edges']:.1f} | "
                             f"{s['pixel_log_likelihood']:.2f} | "
                             f"{100 * p['coverage_2']:.1f} |" if p else "")
        if block.get("targets"):
            lines += ["", "Targets of the default method (issue 21): " + ", ".join(
                f"{k} {'met' if v else '**not met**'}" for k, v in block["targets"].items())]
        lines.append("")
        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        ax.plot([0, 1], [0, 1], "k:", lw=1)
        for name, s in block["methods"].items():
            if s and (name in ("fbp", "mc_dropout", "ivon_heldout", doc["default"]) or
                      name.replace("_predcp", "") == "posterior"):
                ax.plot(LEVELS, s["reliability"], marker=".", label=name)
        ax.set_xlabel("nominal coverage")
        ax.set_ylabel("observed coverage")
        ax.set_title(f"{size}², {doc['split']} split")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / f"bench_calibration_{size}.png", dpi=110)
        plt.close(fig)
        lines += [f"![reliability {size}²](bench_calibration_{size}.png)", ""]
    (folder / "calibration.md").write_text("\n".join(lines) + "\n")


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

    For methods this run skipped (``--no-mc-dropout``, no ``--ivon``) whose
    fits do not depend on what changed: the row names them in ``carried``.
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
            r["carried"] = {"from": _repo_relative(str(path)), "methods": names}


def _case_spec(row: dict) -> dict:
    """The planning fields of a result row (what :func:`case_list` makes)."""
    return {k: row[k] for k in ("id", "split", "family", "index", "size", "n_angles", "noise",
                                "condition")}


def read_case_file(path) -> list[dict]:
    """The result rows of a benchmark document (``"cases"``) or of a ``--partial`` file."""
    text = Path(path).read_text()
    try:
        return json.loads(text)["cases"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return list(read_cases(path, "id").values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test", choices=("tuning", "validation", "test"))
    ap.add_argument("--sizes", default="64,128")
    ap.add_argument("--per-family", type=int, default=1)
    ap.add_argument("--calibration", default=None,
                    help="folder of <preset>.json calibration files (default: the shipped ones)")
    ap.add_argument("--mc-samples", type=int, default=128)
    ap.add_argument("--no-mc-dropout", action="store_true")
    ap.add_argument("--conditions", default=None,
                    help="a subset of the size's conditions, e.g. 30:0.01,60:0.05")
    ap.add_argument("--ivon", action="store_true",
                    help="also IVON from the same Adam fit (methods ivon, ivon_heldout); "
                         "cases of --partial scored without it get it (fits redone)")
    ap.add_argument("--limit", type=int, default=None,
                    help="run at most this many cases now, in the list's order (every "
                         "family and condition before a second image); the rest stay "
                         "planned and are summarised where done")
    ap.add_argument("--only-done", action="store_true",
                    help="run nothing: summarise the cases already in --partial")
    ap.add_argument("--all-done", action="store_true",
                    help="run nothing: summarise every case in --partial, whichever "
                         "--per-family or --conditions made it")
    ap.add_argument("--cases-from", default=None,
                    help="run exactly the cases of this benchmark document or --partial "
                         "file (rerun a published benchmark's images with new code), of "
                         "the sizes in --sizes and the --conditions, if given")
    ap.add_argument("--carry", default=None,
                    help="copy the methods this run skips (e.g. mc_dropout, ivon) from the "
                         "same cases of this earlier document or --partial file")
    ap.add_argument("--predcp", default="both", choices=("both", "off", "on"),
                    help="which TV-PredCP variants of the posterior methods to run")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--partial", default=None)
    ap.add_argument("--arrays", default=None,
                    help="keep each case's truth, reconstruction and posterior variances "
                         "here, so that a later --calibration can rescore them")
    ap.add_argument("--docs", default=None)
    ap.add_argument("--quick", action="store_true", help="28², 2 families, few iterations")
    ap.add_argument("--quick-iterations", type=int, default=100)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("ctuq").setLevel(logging.WARNING)
    if args.calibration is None:
        from ctuq.recon.model_error import DEFAULTS_DIR
        args.calibration = str(DEFAULTS_DIR)
    args.sizes = [28] if args.quick else [int(s) for s in args.sizes.split(",")]
    args.conditions = [(int(a), float(n)) for a, n in
                       (c.split(":") for c in args.conditions.split(","))] \
        if args.conditions else None
    args.predcp_variants = {"both": (False, True), "off": (False,), "on": (True,)}[args.predcp]
    cases = case_list(args)
    if args.quick:
        cases = [c for c in cases if c["family"] in ("ellipses", "digits")][:2]
    if args.only_done:  # summarise an interrupted run as it stands
        done = read_cases(args.partial, "id")
        cases = [c for c in cases if c["id"] in done]
    if args.all_done:  # runs made with other plans: every case they finished
        cases = [_case_spec(r) for r in read_cases(args.partial, "id").values()]
    if args.cases_from:  # the cases of an earlier run, whichever plans made them
        cases = [_case_spec(r) for r in read_case_file(args.cases_from)
                 if r["size"] in args.sizes and (not args.conditions or (
                     r["n_angles"], r["noise"]) in args.conditions)]
    if args.limit is not None:  # in the list's order, sizes as given
        order = {s: k for k, s in enumerate(args.sizes)}
        cases = sorted(cases, key=lambda c: order[c["size"]])[:args.limit]
    t0 = time.perf_counter()
    results = run_resumable(cases, args.partial, functools.partial(run_case, args=args),
                            args.jobs, functools.partial(_worker, args=args),
                            complete=(lambda r: "ivon" in r["methods"])
                            if args.ivon and not (args.only_done or args.all_done) else None)
    rescore(results, args)
    if args.carry:
        carry_methods(results, args.carry)
    default = default_method()
    doc = {"split": args.split, "sizes": args.sizes, "per_family": args.per_family,
           "cases_run": len(results),
           "cases_planned": len(results) if args.all_done or args.cases_from
           else len(case_list(args)),
           "conditions": args.conditions, "predcp_variants": list(args.predcp_variants),
           "default": default, "calibration": _repo_relative(args.calibration),
           "jobs": args.jobs,
           "threads": args.threads, "machine": _machine(torch.device("cpu")),
           "date": time.strftime("%Y-%m-%d"), "wall_time_s": time.perf_counter() - t0,
           "summary": summarize(results, default), "cases": results}
    if args.docs:
        write_docs(doc, Path(args.docs))
    json.dump(_clean(doc), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
