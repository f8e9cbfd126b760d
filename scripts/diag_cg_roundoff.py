"""How the float32 round-off of the observation kernel's product grows with the network.

The CG sampler certifies a float32 solve without a float64 product where its float32
residual plus ``0.05 ε λ_max(K) ‖x‖`` is within the bound (docs/dip.md §21); the factor
0.05 rests on round-off measured at the solves' iterates of the 28² toy and of ``dip-64``
(at most 0.014). This script measures, per (size, preset), the round-off of one product
``‖K₃₂ x − K₆₄ x‖ / (ε λ_max(K) ‖x‖)`` for rows of three kinds: Gaussian random rows
(like a solution ``K⁻¹ b`` of a Matheron right-hand side ``b ~ N(0, K)``, whose
components along the noise's directions dominate), rows ``K g`` (smooth, along the top
directions) and the top eigenvector, at the toy problem's noise level ×1 and ×0.01, with
``λ_max`` by 25 power iterations in float64. The ratio between sizes tells how far the
measured 0.014 carries to another network. One JSON document on stdout.

    python scripts/diag_cg_roundoff.py --cases 28:reference-28,64:dip-64,128:dip-128
"""

from __future__ import annotations

import argparse
import json

import torch

from ctuq.bench.machine import machine
from ctuq.bench.toy import toy_problem
from ctuq.posterior import BlockPrior
from ctuq.posterior.sampling_cg import ObservationKernel
from ctuq.recon.evidence import ct_likelihood


def roundoff(size: int, preset: str, rows: int = 6, power_steps: int = 25) -> dict:
    torch.manual_seed(0)
    p = toy_problem(size, 60, unet=preset, channels=None, fit_steps=5)
    lin = p.linearization()
    likelihood, prior = ct_likelihood(lin, p.op, p.y), BlockPrior(lin)
    eps = torch.finfo(torch.float32).eps
    out = {"size": size, "preset": preset}
    for factor in (1.0, 0.01):
        noise_var = (factor * p.noise_std) ** 2
        kern = ObservationKernel(likelihood, prior, noise_var)
        out["d_y"] = kern.d_y
        with torch.no_grad():
            v = torch.randn(1, kern.d_y, dtype=torch.float64)
            for _ in range(power_steps):
                w = kern(v)
                lam, v = float(w.norm() / v.norm()), w / w.norm()
            g = torch.randn(rows, kern.d_y, dtype=torch.float64)
            smooth = kern(g)
            kinds = {"random": g, "K_random": smooth / smooth.norm(dim=1, keepdim=True),
                     "top": v}
            ratios = {name: float(((kern(x.float()).double() - kern(x)).norm(dim=1)
                                   / (eps * lam * x.norm(dim=1))).max())
                      for name, x in kinds.items()}
        out[f"noise_x{factor:g}"] = {"lambda_max_over_noise_var": lam / noise_var, **ratios}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="28:reference-28,64:dip-64,128:dip-128",
                    help="size:preset pairs, comma-separated")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = [(int(c.split(":")[0]), c.split(":")[1]) for c in args.cases.split(",")]
    print(json.dumps({"script": "scripts/diag_cg_roundoff.py", "machine": machine(),
                      "cases": [roundoff(s, p) for s, p in cases]}, indent=1))


if __name__ == "__main__":
    main()
