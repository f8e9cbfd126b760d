"""CG iterations when the g-prior's g moves: a stale, a rescaled and a rebuilt Nyström sketch.

The CG sampler's preconditioner is sketched at one prior; the EM then moves
``g`` (8.5× over a default 512² run, docs/scaling.md §2). Since ``Φ Σ Φᵀ``
is linear in ``g``, rescaling the sketch's eigenvalues is exact
(``NystromPreconditioner.rescaled``). This measures, on a validation-split
scan, how many CG iterations each choice needs after ``g → c·g₀``: whether
the growth in iterations comes from the stale sketch or from the spectrum's
tail (``λ_{r+1}/σ²`` grows with ``g`` whatever the sketch).

One JSON document on stdout. Example::

    python scripts/bench_precond_rescale.py --size 64 --dip-iters 300
"""

from __future__ import annotations

import argparse
import json
import math
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--angles", type=int, default=60)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--dip-iters", type=int, default=300, help="a shorter fit than the preset's")
    ap.add_argument("--rank", type=int, default=200)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--factors", default="3,8.5,30", help="g / g0 values")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    from ctuq.bench.machine import machine
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.data.splits import Case
    from ctuq.posterior import Linearization
    from ctuq.posterior.sampling_cg import CGOptions, CGSampler
    from ctuq.recon.dip import DIPConfig, fit_dip
    from ctuq.recon.evidence import ct_likelihood, initial_prior

    torch.set_num_threads(args.threads)
    truth = Case("validation", "ellipses", 0, args.size).image()
    op = RayTransform(Geometry.parallel(args.size, args.angles))
    y, sigma = simulate_sinogram(truth, op, args.noise, seed=11)
    dip = fit_dip(y, op, DIPConfig.for_image_size(args.size).with_(iterations=args.dip_iters),
                  noise_std=sigma)
    lik = ct_likelihood(Linearization(dip.model, dip.net_input), op, y)
    prior = initial_prior(lik, "gprior")
    g0 = float(prior.log_g.detach().exp())
    sampler = CGSampler(CGOptions(precond_rank=args.rank, max_iter=1000))

    def solve(**kw):
        post = sampler.sample(lik, prior, sigma**2, args.samples,
                              generator=torch.Generator().manual_seed(3), **kw)
        return post

    t0 = time.perf_counter()
    first = solve()
    out = {"split": "validation", "family": "ellipses", "size": args.size,
           "angles": args.angles, "noise": args.noise, "dip_iterations": args.dip_iters,
           "rank": args.rank, "samples": args.samples, "g0": g0,
           "iterations_at_g0": first.info["iterations"],
           "sketch_and_solve_s": time.perf_counter() - t0,
           "machine": machine("cpu"), "threads": args.threads,
           "rows": []}
    pc0 = first.state.preconditioner
    for c in (float(f) for f in args.factors.split(",")):
        with torch.no_grad():
            prior.log_g.fill_(math.log(c * g0))
        row = {"g_over_g0": c}
        for name, kw in (("stale", {"preconditioner": pc0}),
                         ("rescaled", {"preconditioner": pc0.rescaled(c)}),
                         ("rebuilt", {})):
            post = solve(**kw)
            row[name] = post.info["iterations"]
            row[f"{name}_converged"] = bool(post.info["converged"])
        out["rows"].append(row)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
