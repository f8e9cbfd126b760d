"""Seeded end-to-end runs whose outputs are pinned in ``tests/golden/golden.npz``.

They guard refactors of the posterior engine: a 28² CT reconstruction (DIP mean, std,
learned hyperparameters) with three prior / sampler settings, direct sampler calls
(mini-batched sample-then-optimise, CG), and a digits classification run (sampled LLA
NLL and the EM prior) with the full-batch and a mini-batched sampler.

Regenerate (only for an intended change of the numbers, explained in the commit)::

    .venv/bin/python tests/golden_runs.py --write

Check bit for bit on this machine (``tests/test_golden.py`` compares with rtol 1e-6, so
that another CPU's summation order does not fail it)::

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


def ct_runs() -> dict:
    """The pipeline's defaults (g-prior, CG, TV-PredCP) and two other prior / sampler pairs."""
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
    variants = {"matern": dict(prior="matern", learn_noise=True),
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


def run_all() -> dict:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {k: _np(v) for k, v in {**ct_runs(), **classify_runs()}.items()}
    finally:
        torch.set_num_threads(old)


def compare(new: dict, ref: dict, rtol: float = 0.0, atol: float = 0.0) -> list[str]:
    """Keys whose values differ beyond ``rtol``/``atol`` (exact with the defaults)."""
    bad = [f"missing: {k}" for k in ref if k not in new]
    bad += [f"unexpected: {k}" for k in new if k not in ref]
    for k in ref:
        if k in new:
            a, b = np.asarray(new[k]), np.asarray(ref[k])
            if a.shape != b.shape or not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                err = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300))) \
                    if a.shape == b.shape else float("nan")
                bad.append(f"{k}: max relative difference {err:.3g}")
    return bad


if __name__ == "__main__":
    if "--write" in sys.argv:
        GOLDEN.parent.mkdir(exist_ok=True)
        np.savez_compressed(GOLDEN, **run_all())
        print(f"wrote {GOLDEN}")
    elif "--check" in sys.argv:
        with np.load(GOLDEN) as f:
            ref = dict(f)
        diffs = compare(run_all(), ref)
        print("bit-identical" if not diffs else "\n".join(diffs))
        sys.exit(1 if diffs else 0)
    else:
        print(__doc__)
