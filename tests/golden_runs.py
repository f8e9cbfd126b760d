"""Seeded end-to-end runs whose outputs are pinned in ``tests/golden/golden.npz``.

They guard refactors of the posterior engine: a 28² CT reconstruction (DIP mean, std,
learned hyperparameters), three prior / sampler settings and direct sampler calls
(mini-batched sample-then-optimise, CG) at a *pinned* linearisation point, and a digits
classification run (sampled LLA NLL and the EM prior) with the full-batch and a
mini-batched sampler.

Why a pinned linearisation point: the DIP fit is chaotic in the last bits. Scaling the
sinogram by (1 + 1e-7) moves the fitted image by 1.7 % and the posterior std by 17 %
(measured), so a new numpy / scipy / ODL release that changes one summation order moves
every end-to-end CT number far beyond float level. The posterior engine itself is not:
at fixed weights the same perturbation moves its outputs by at most 9e-4. The golden file
therefore stores the sinogram, the FBP input and the fitted weights, and the engine runs
linearise at those stored values; the end-to-end entries get only a loose check here
(bit-identical with ``--check`` on the machine that wrote them).

Regenerate (only for an intended change of the numbers, explained in the commit)::

    .venv/bin/python tests/golden_runs.py --write

Replace only some entries (prefixes), recomputed at the stored linearisation point, when an
intended change moves those alone; every entry's relative change is printed first::

    .venv/bin/python tests/golden_runs.py --update ct_matern_

Check bit for bit on this machine (``tests/test_golden.py`` compares with the tolerances
of :data:`TOLERANCES`, so that another CPU or library release does not fail it)::

    .venv/bin/python tests/golden_runs.py --check

Every run uses one intra-op thread (the thread count changes float summation order).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

GOLDEN = Path(__file__).resolve().parent / "golden" / "golden.npz"


def _np(x) -> np.ndarray:
    if torch.is_tensor(x):
        x = x.detach().cpu()
        return x.numpy().copy()
    return np.asarray(x)


def _ct_problem():
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import digits
    from ctuq.data.simulate import simulate_sinogram

    g = Geometry.parallel(28, 20)
    truth = digits(1, 28, seed=0)[0]
    y, sigma = simulate_sinogram(truth, RayTransform(g, backend="matrix"), 0.05, seed=1)
    return Sinogram(y.numpy(), g, meta={"noise_std": sigma}, ground_truth=truth), sigma


#: A small U-net (8 channels: 4.6 k linearised weights) keeps every CT run to seconds.
_DIP = {"iterations": 120, "unet": {"scales": 3, "channels": [8, 8, 8],
                                     "skip_channels": [0, 4, 4], "use_sigmoid": True, "use_norm": False}}
# predcp on: the golden run guards the MAP-II path too (the default is off since the
# validation run of docs/defaults.md)
_UNC = {"em_steps": 2, "n_samples": 4, "predictive_samples": 8, "stored_samples": 0,
        "predcp": True}


def ct_runs(pin: dict | None = None) -> dict:
    """The pipeline end to end, then three prior / sampler pairs at the linearisation point.

    ``pin``: the reference's ``ct_y``, ``ct_net_input`` and ``ct_dip_params``; the engine
    runs linearise there instead of at this run's own fit (None: at this run's fit).
    """
    from dataclasses import replace

    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    import ctuq
    from ctuq.data.operators import RayTransform
    from ctuq.recon.config import ReconstructionConfig
    from ctuq.recon.dip import fit_dip
    from ctuq.recon.pipeline import posterior_uncertainty

    sino, sigma = _ct_problem()
    out = {}
    cfg = ReconstructionConfig(preset="reference-28", device="cpu", backend="matrix", seed=0,
                               dip=_DIP, uncertainty=_UNC)
    res = ctuq.reconstruct(sino, cfg)
    h = res.hyperparameters
    out.update({"ct_mean": res.reconstruction, "ct_std": res.posterior_std,
                "ct_total_std": res.std, "ct_a": h["a_b"],
                "ct_sigma2": h["sigma2"], "ct_gamma": h["gamma_hat"],
                "ct_trace_a": [t["a_b"][0] for t in res.em_trace]})

    dip_cfg, _ = cfg.resolve((28, 28))
    op = RayTransform(sino.geometry, backend="matrix")
    y = torch.as_tensor(sino.data, dtype=torch.float32)
    dip = fit_dip(y, op, dip_cfg, noise_std=sigma)
    out.update({"ct_y": y, "ct_net_input": dip.net_input,
                "ct_dip_params": parameters_to_vector(dip.model.parameters())})
    if pin is not None:
        y = torch.as_tensor(pin["ct_y"])
        vector_to_parameters(torch.as_tensor(pin["ct_dip_params"]), dip.model.parameters())
        dip = replace(dip, net_input=torch.as_tensor(pin["ct_net_input"]))
        with torch.no_grad():
            dip.reconstruction = dip.model(dip.net_input).reshape(y.new_empty(28, 28).shape)
    variants = {"gprior": dict(),
                "matern": dict(prior="matern", learn_noise=True),
                "ardsto": dict(prior="ard", sampler="sto", predcp=False)}
    for name, change in variants.items():
        unc = ReconstructionConfig(preset="reference-28", device="cpu", backend="matrix",
                                   dip=_DIP, uncertainty={**_UNC, **change}).resolve((28, 28))[1]
        r = posterior_uncertainty(dip, op, y, sigma, unc, learn_noise=bool(unc.learn_noise),
                                  seed=0)
        hp = r["posterior"].hyperparameters()
        out.update({f"ct_{name}_std": r["std"], f"ct_{name}_a": hp["a_b"],
                    f"ct_{name}_l": hp["l_b"] or [0.0], f"ct_{name}_sigma2": hp["sigma2"]})

    # direct sampler calls on the same linearisation: mini-batched STO, CG with a warm start
    out.update(_sampler_runs(dip, op, y, sigma))
    return out


def _sampler_runs(dip, op, y, sigma) -> dict:
    from ctuq.posterior import BlockPrior, CGSampler, Linearization, STOOptions, STOSampler
    from ctuq.recon.evidence import ct_likelihood

    lin = Linearization(dip.model, dip.net_input)
    lik = ct_likelihood(lin, op, y)
    prior = BlockPrior(lin, variance=0.05)
    out = {}
    gen = torch.Generator().manual_seed(5)
    mb = STOSampler(STOOptions(batch_size=5, iterations=40)).sample(lik, prior, sigma**2, 3,
                                                                    generator=gen)
    out["sto_mb_theta"] = mb.theta_star
    out["sto_mb_z"] = mb.z
    cg = CGSampler().sample(lik, prior, sigma**2, 3, generator=gen)
    prior.set_hyperparameters(variances=0.08)
    cg2 = CGSampler().sample(lik, prior, sigma**2, 3, generator=gen, warm_start=cg)
    out["cg_theta"] = cg2.theta_star
    out["cg_z"] = cg2.z
    return out


def classify_runs() -> dict:
    """Digits, a small MLP: map and the sampled LLA, ARD full batch and g-prior mini-batched."""
    from dataclasses import replace

    from ctuq.classify import bench as B

    out = {}
    base = B.BenchConfig(epochs=15, em_steps=3, em_samples=4, predictive_samples=16,
                         angles=(0.0, 90.0))
    settings = {"ard": base,
                "gmb": replace(base, prior="gprior", sto=replace(base.sto, batch_size=300,
                                                                 iterations=60))}
    for name, cfg in settings.items():
        res = B.run_benchmark("digits", ("map", "lla-sampled"), cfg, seed=0)
        lla = res.methods["lla-sampled"]
        out[f"cls_{name}_nll"] = lla.metrics["nll"]
        out[f"cls_{name}_map_nll"] = res.methods["map"].metrics["nll"]
        out[f"cls_{name}_rot_nll"] = lla.metrics["rotation_nll"]
        out[f"cls_{name}_var"] = lla.extra["variances"]
        out[f"cls_{name}_probs"] = lla.test_probs[:50]
    return out


def run_all(pin: dict | None = None) -> dict:
    """Every entry, on one thread; ``pin`` as in :func:`ct_runs`."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {k: _np(v) for k, v in {**ct_runs(pin), **classify_runs()}.items()}
    finally:
        torch.set_num_threads(old)


#: Relative tolerance in norm, ‖new − ref‖ / ‖ref‖, per entry (prefix match, first wins).
#: The end-to-end CT entries follow the chaotic DIP fit: their bound is ≈ 3× the change
#: that a 1e-7 perturbation of the sinogram causes (ct_mean 1.7 %, total std 4 %,
#: hyperparameters ≤ 2 %), so it catches a broken pipeline, not a changed draw; the
#: posterior std of that run (17 %) and the fitted weights are not compared. The engine
#: runs at the pinned point and the classifier are held to ≈ 10× their float-level
#: spread (9e-4 and 1.3e-7 measured); a changed draw, step or default moves them by
#: whole percent.
TOLERANCES = {
    "ct_y": 1e-5, "ct_net_input": 1e-4,
    "ct_dip_params": None, "ct_std": None,
    "ct_mean": 0.05, "ct_total_std": 0.15, "ct_a": 0.06, "ct_sigma2": 0.06,
    "ct_gamma": 0.06, "ct_trace_a": 0.06,
    "ct_": 1e-2, "sto_": 1e-2, "cg_": 1e-2,
    "cls_": 1e-5,
}


def tolerance(key: str) -> float | None:
    """The entry's tolerance from :data:`TOLERANCES` (None: not compared)."""
    for prefix, tol in TOLERANCES.items():
        if key == prefix or (prefix.endswith("_") and key.startswith(prefix)):
            return tol
    raise KeyError(f"no tolerance for golden entry {key!r}")


def relative_difference(new, ref) -> float:
    """``‖new − ref‖ / ‖ref‖`` in float64."""
    a, b = np.asarray(new, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), 1e-300))


def compare(new: dict, ref: dict, exact: bool = False) -> list[str]:
    """Entries that differ: bit for bit if ``exact``, else beyond :func:`tolerance`."""
    bad = [f"missing: {k}" for k in ref if k not in new]
    bad += [f"unexpected: {k}" for k in new if k not in ref]
    for k in ref:
        if k not in new:
            continue
        a, b = np.asarray(new[k], dtype=np.float64), np.asarray(ref[k], dtype=np.float64)
        if a.shape != b.shape:
            bad.append(f"{k}: shape {a.shape} != {b.shape}")
            continue
        if exact:
            if not np.array_equal(a, b, equal_nan=True):
                bad.append(f"{k}: not bit-identical")
            continue
        tol = tolerance(k)
        if tol is None:
            continue
        rel = relative_difference(a, b)
        if not rel <= tol:
            bad.append(f"{k}: relative difference {rel:.3g} in norm > {tol:g}")
    return bad


def load() -> dict:
    with np.load(GOLDEN) as f:
        return dict(f)


if __name__ == "__main__":
    if "--write" in sys.argv:
        GOLDEN.parent.mkdir(exist_ok=True)
        np.savez_compressed(GOLDEN, **run_all())
        print(f"wrote {GOLDEN}")
    elif "--update" in sys.argv:
        prefixes = tuple(sys.argv[sys.argv.index("--update") + 1].split(","))
        ref = load()
        new = run_all(ref)
        for k in ref:
            print(f"{k}: relative change {relative_difference(new[k], ref[k]):.3g} "
                  f"(tolerance {tolerance(k)})"
                  + ("  -> replaced" if k.startswith(prefixes) else ""))
        np.savez_compressed(GOLDEN, **{k: new[k] if k.startswith(prefixes) else v
                                       for k, v in ref.items()})
        print(f"wrote {GOLDEN}")
    elif "--check" in sys.argv:
        ref = load()
        diffs = compare(run_all(ref), ref, exact=True)
        print("bit-identical" if not diffs else "\n".join(diffs))
        sys.exit(1 if diffs else 0)
    else:
        print(__doc__)
