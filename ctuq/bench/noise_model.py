"""The count noise model against the scalar one on realistic scans (VALIDATION split).

Each case is a realistic scan (:func:`ctuq.data.realistic.realistic_case`:
finer grid, strip projector, hidden centre, photon counts with flats and
darks) of the validation split, read as the NXtomo reader reads it: line
integrals with their delta-method variances. It is reconstructed three
times with the same settings and seed, changing only the noise model:

- ``gaussian``: ``noise_model = "gaussian"`` (one ``σ`` for every ray,
  estimated from the data: the default before the count model);
- ``counts``: ``noise_model = "counts"``, ``counts_scale = "known"`` (``σ²``
  the mean delta-method variance, kept fixed);
- ``counts_learned``: the same, ``counts_scale = "learned"`` (the EM learns
  ``σ²``, as for an unknown detector gain).

Scores per run: PSNR, ±1σ/±2σ coverage of the total std, mean std / RMSE
(1 for a std on the scale of the error), the pixel log-likelihood, the noise
std used (known or learned) and the simulation's own root-mean-square ray std.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

__all__ = ["MODELS", "cases", "run_case", "summarise"]

#: The noise models compared: name -> the settings that differ.
MODELS = {"gaussian": {"noise_model": "gaussian"},
          "counts": {"noise_model": "counts", "counts_scale": "known"},
          "counts_learned": {"noise_model": "counts", "counts_scale": "learned"}}


def cases(I0s=(1e3, 1e4, 1e5), families=("shepp-variant", "ellipses"), n_per_family: int = 1,
          *, size: int = 32, n_angles: int = 48) -> list[dict]:
    """The validation cases: every family × index × ``I0``, one dict each (``id`` unique)."""
    out = []
    for family in families:
        for index in range(int(n_per_family)):
            for I0 in I0s:
                out.append({"id": f"{family}/{index}/I0={I0:g}", "family": family,
                            "index": index, "I0": float(I0), "size": int(size),
                            "n_angles": int(n_angles)})
    return out


def run_case(case: dict, settings: dict | None = None, models=tuple(MODELS)) -> dict:
    """Reconstruct one validation case under every noise model of ``models``.

    ``settings``: the other :class:`~ctuq.recon.config.ReconstructionConfig`
    fields (the same for every model). Returns the case with ``models``:
    name -> scores.
    """
    import ctuq
    from ctuq.bench.scores import score
    from ctuq.data.realistic import realistic_case

    sino, truth, hidden = realistic_case("validation", case["family"], case["index"],
                                         case["size"], case["n_angles"], I0=case["I0"])
    out = {**case, "split": "validation", "noise_std_rms_true": hidden["noise_std_rms"],
           "models": {}}
    logging.getLogger("ctuq").setLevel(logging.ERROR)
    for name in models:
        cfg = ctuq.ReconstructionConfig.from_dict({**(settings or {}), **MODELS[name]})
        t0 = time.perf_counter()
        r = ctuq.reconstruct(sino, cfg)
        mean, std = np.asarray(r.reconstruction, np.float64), np.asarray(r.std, np.float64)
        rmse = float(np.sqrt(((mean - truth) ** 2).mean()))
        s = score(truth, mean, std)
        noise_var = r.hyperparameters.get("sigma2") if isinstance(
            r.hyperparameters, dict) else None
        out["models"][name] = {
            "psnr": s["psnr"], "coverage_1sigma": s["coverage_1"],
            "coverage_2sigma": s["coverage_2"], "mean_std": s["mean_std"], "rmse": rmse,
            "std_over_rmse": s["mean_std"] / rmse, "pixel_log_likelihood":
            s["pixel_log_likelihood"], "noise_std_used": r.config["noise_std"],
            "noise_std_final": (math.sqrt(noise_var) if noise_var else None),
            "noise_model": r.config["noise_model"],
            "chi2_dof": r.diagnostics.get("chi2_dof"), "seconds": time.perf_counter() - t0}
    return out


def summarise(rows: list[dict]) -> dict:
    """Mean scores per ``I0`` and noise model, and the counts − gaussian differences."""
    keys = ("psnr", "coverage_1sigma", "coverage_2sigma", "std_over_rmse",
            "pixel_log_likelihood")
    out = {}
    for I0 in sorted({r["I0"] for r in rows}):
        sub = [r for r in rows if r["I0"] == I0]
        names = [m for m in MODELS if all(m in r["models"] for r in sub)]
        per = {m: {k: float(np.mean([r["models"][m][k] for r in sub])) for k in keys}
               for m in names}
        out[f"{I0:g}"] = {"n_cases": len(sub), "means": per,
                          "counts_minus_gaussian": {
                              m: {k: per[m][k] - per["gaussian"][k] for k in keys}
                              for m in names if m != "gaussian" and "gaussian" in per}}
    return out
