"""A scan in physical units: ctuq with ``normalize`` on and off against FBP.

One random-ellipse image of a split (:mod:`ctuq.data.splits`) multiplied by
a physical attenuation (default 0.03 /mm: soft tissue at about 70 keV, pixel
size 1 mm), simulated with :func:`ctuq.data.simulate.simulate_sinogram`
(relative Gaussian noise, noise std known) and reconstructed by
``ctuq.reconstruct`` with ``normalize`` false and true; PSNR of each and of
the FBP against the truth, all in 1/mm.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["run"]


def run(*, split: str = "validation", index: int = 0, size: int = 64, n_angles: int = 60,
        noise: float = 0.05, attenuation: float = 0.03, threads: int = 1,
        model_error: str = "none") -> dict:
    """PSNR of ctuq (normalize off / on) and of the FBP on one scaled ellipse scan.

    Returns
    -------
    dict
        JSON-able: the case, ``data_scale``, and per variant ``psnr``,
        ``psnr_fbp``, ``coverage_2sigma``, ``max_reconstruction``, ``seconds``.
    """
    import ctuq
    from ctuq.bench.cases import _case, simulate
    from ctuq.data.io import Sinogram

    case = _case(split, "ellipses", index, size, n_angles, noise)
    scan = simulate(case)
    c = float(attenuation)
    y = np.asarray(scan.y, np.float64) * c
    truth = np.asarray(scan.truth, np.float64) * c
    sino = Sinogram(y.astype(np.float32), scan.geometry, meta={"noise_std": scan.sigma * c},
                    ground_truth=truth.astype(np.float32))
    out = {"case": case["id"], "attenuation_per_mm": c, "model_error": model_error,
           "variants": {}}
    for normalize in (False, True):
        cfg = ctuq.ReconstructionConfig(seed=index, device="cpu", threads=threads,
                                        normalize=normalize,
                                        uncertainty={"model_error": model_error})
        t0 = time.perf_counter()
        res = ctuq.reconstruct(sino, cfg)
        m = res.metrics
        out["variants"]["on" if normalize else "off"] = {
            "psnr": m["psnr"], "psnr_fbp": m["psnr_fbp"],
            "coverage_2sigma": m.get("coverage_2sigma"),
            "max_reconstruction": float(np.max(res.reconstruction)),
            "data_scale": res.config.get("data_scale"),
            "seconds": time.perf_counter() - t0}
    return out
