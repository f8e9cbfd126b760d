#!/usr/bin/env python
"""Does the TV term's curvature, put into the posterior, sharpen the interval?

The linearised posterior (docs/method.md §5) uses the data term's curvature and the
Gaussian weight prior; the TV term of the DIP objective ``‖A x − y‖² + γ TV(x)`` enters
only the fit. This diagnostic conditions the predictive draws on it as well: TV read as
the prior ``exp(−α Σ_j |d_j|)`` with ``α = γ / (2σ²)`` (``d`` the image's horizontal and
vertical differences, ``σ²`` the EM's), bounded by its variational quadratic
``|d| ≤ (d² + u) / (2 √u)``, ``u_j = E[d_j²]`` (exact at ``u = d²``), which is a
Gaussian pseudo-observation ``d_j = 0`` of precision ``α / √u_j``. Those rows are
stacked under the ray transform (``ctuq.recon.tv_curvature.TVCurvatureOperator``) and the predictive
samples drawn again with the EM's prior and noise; ``u`` is the DIP output's squared
differences plus the current samples' variance of them, refreshed ``--vb-iterations``
times. Everything else (the EM, the held-out model error, the scoring) is
``scripts/bench_calibration.py``'s, whose arguments this script takes after ``--``.

Result on the 20 realistic 64² validation scans (docs/real_scans.md, "The TV term's
curvature in the posterior"): the posterior std falls by 7–29 % on every family alike,
and with the held-out model error the worst image falls below 85 %: not adopted.
``--sample-weight 0.05`` (``ξ`` nearly the fit's own ``|d̂|``) on the same scans: LL
+0.10 nats per pixel, ±1σ still 88 %, digits lower; one calibration of the default's
posterior does as well (docs/defaults.md, "The curvature at the fit itself").

Usage::

    python scripts/diag_tv_curvature.py --vb-iterations 2 -- --realistic \\
        --split validation --sizes 64 --cases-from \\
        benchmarks/results/realistic_64_validation_gamma_matheron_cases.jsonl \\
        --predcp off --no-mc-dropout --jobs 2 --threads 1 --partial rows.jsonl > doc.json
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import torch


def tv_conditioned_samples(out: dict, dip, op, ray_variance, k: int, seed: int,
                           iterations: int, sample_weight: float = 1.0) -> torch.Tensor:
    """``k`` zero-mean image samples of the posterior conditioned on the TV bound."""
    from ctuq.posterior.likelihood import LinearGaussianLikelihood
    from ctuq.recon import predictive
    from ctuq.recon.tv_curvature import TVCurvatureOperator, differences

    post, lin = out["posterior"], out["linearization"]
    x = lin.x_hat.detach().double()
    s2 = float(post.noise_var)
    alpha = float(dip.tv_weight) / (2.0 * s2)
    samples = out["image_samples"].double()
    for _ in range(iterations):
        # sample_weight 1: the variational bound's E[d²]; towards 0: the Laplace
        # approximation of TV at the fit (flat regions held by their own d̂ ≈ 0)
        u = differences(x).square() + sample_weight * differences(samples).square().mean(0)
        precision = alpha * u.reshape(-1).rsqrt()
        # rows √(σ² · precision) D under the likelihood's (whitened) ray transform
        stacked = TVCurvatureOperator(post.likelihood.operator, (s2 * precision).sqrt())
        like = LinearGaussianLikelihood(lin, stacked, None, batch_axis="rows")
        res = post.sampler.sample(like, post.prior, post.noise_var, k,
                                  generator=torch.Generator().manual_seed(seed + 11),
                                  stage="predictive")
        samples = predictive.image_samples(lin, res.z).double()
    return samples.to(out["image_samples"].dtype)


def install(iterations: int, sample_weight: float = 1.0) -> None:
    """Replace the Laplace method's predictive draws by the TV-conditioned ones."""
    import ctuq.recon.methods.laplace as laplace

    plain = laplace.laplace_posterior

    def conditioned(dip, op, y, noise_std, settings, *, predictive_samples, learn_noise,
                    seed=0, ray_variance=None, **kwargs):
        out = plain(dip, op, y, noise_std, settings, predictive_samples=predictive_samples,
                    learn_noise=learn_noise, seed=seed, ray_variance=ray_variance, **kwargs)
        smp = tv_conditioned_samples(out, dip, op, ray_variance, int(predictive_samples),
                                     seed, iterations, sample_weight)
        out.update(image_samples=smp, variance=smp.pow(2).mean(0))
        out["std"] = out["variance"].sqrt()
        return out

    laplace.laplace_posterior = conditioned  # the workers are forked: they inherit it


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, bench = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vb-iterations", type=int, default=2,
                    help="refreshes of u = E[d²] (each one predictive draw more)")
    ap.add_argument("--sample-weight", type=float, default=1.0,
                    help="weight of the draws' variance in u (1: the variational bound; "
                         "small: TV's curvature at the fit)")
    args = ap.parse_args(ours)
    install(args.vb_iterations, args.sample_weight)
    script = Path(__file__).with_name("bench_calibration.py")
    sys.argv = [str(script), *bench]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
