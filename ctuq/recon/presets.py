"""Presets: the settings that depend on the image size, in one place.

A preset is a U-net architecture (:data:`ctuq.models.unet.PRESETS`, the
model zoo, chosen by name or by image size with
:func:`ctuq.models.unet.preset_name_for_size`) together with the DIP and
uncertainty defaults measured for it, both here. :class:`~ctuq.recon.dip.DIPConfig`
and :class:`~ctuq.recon.config.ReconstructionConfig` read them; a user's
overrides (TOML, CLI, API, napari) apply on top.
"""

from __future__ import annotations

__all__ = ["DIP_DEFAULTS", "UNCERTAINTY_DEFAULTS", "WARM_START_DEFAULTS"]

#: Measured defaults per U-net preset (docs/dip.md has the measurements):
#: iterations, peak learning rate and the TV weight factor (γ = factor · σ · r).
DIP_DEFAULTS: dict[str, dict] = {
    "reference-28": dict(iterations=700, lr=5e-3, tv_weight_factor=0.3),
    # 1800 iterations of the 16-channel network: the 32-channel network's 1000 in
    # time, +2.9 dB on the standard validation scans (docs/dip.md §11)
    "dip-64": dict(iterations=1800, lr=1e-2, tv_weight_factor=1.0),
    "dip-128": dict(iterations=1500, lr=1e-2, tv_weight_factor=1.0),
    "dip-256": dict(iterations=1500, lr=1e-2, tv_weight_factor=1.0),
    # not tuned at 512² (a fit takes about half an hour on 2 CPU cores): dip-256's
    # learning rate and TV factor, fewer iterations for the CPU budget
    "dip-512": dict(iterations=1200, lr=1e-2, tv_weight_factor=1.0),
    "reference-large": dict(iterations=2000, lr=1e-4, tv_weight_factor=1.0),
}


#: Uncertainty defaults per U-net preset (sizes grow, samples shrink). The
#: PredCP refresh costs ``blocks × predcp_samples`` JVP+VJP pairs per EM step
#: (11 × 32 = 352 at 64², more than the CG solve): the reference itself
#: drops from 500 draws at 28² to 20 at 501², so larger presets use 16.
#:
#: The Nyström rank grows with the image: the number of eigenvalues of
#: ``ΦΣΦᵀ`` above ``σ²`` does (ellipses, 60 angles, 5 % noise, initial
#: g-prior: ``λ_100/σ²`` = 13 at 64², 55 at 256²), and CG needs about
#: ``√(λ_r/σ²)`` times more iterations. Measured CG iterations of one solve
#: (4 samples) for rank 100 / 200 / 400: 17 / 5 / – at 64², 26 / 9 / 4 at
#: 128², 36 / 13 / 5 at 256²; the sketch costs ``2 (r + 10)`` products (6 /
#: 13 s at 64², 21 / 41 / 82 s at 128², 82 / 164 / 336 s at 256², 2-core
#: CPU). The ranks below give the least sketch + sampling time of a
#: pipeline run (its E-steps and predictive draw).
UNCERTAINTY_DEFAULTS: dict[str, dict] = {
    "reference-28": dict(n_samples=16, predictive_samples=256),
    # 32 predictive samples, not 64: the mean std moved by 0.02-0.06 % (within its
    # Monte-Carlo error) and ±2σ coverage by <= 0.05 point on validation scans
    # (docs/speed.md), for half the predictive stage's time
    # dip_from_heldout 0.5: the fit on all angles continues from the held-out fit for
    # half its iterations (1.5 fits' worth instead of 2). On 10 validation scans x 3
    # DIP seeds (30 angles 1 % and 60 angles 5 %) +1.12 dB mean, better on 25 of 30
    # fits, against a seed spread of 0.76 dB; the test split agreed (+0.86 dB, 20
    # images; 10 paired calibration runs: +0.62 dB, ±2σ 97.4 -> 98.0 %, LL equal
    # within 0.004; docs/speed.md)
    # rank 400, not 200: at 1 % noise rank 200 left CG at its 200-iteration cap
    # (residual up to 480× the tolerance) and the std off by up to 4× on validation
    # scans; rank 400 converged on them in less time, and at 5 % noise changed
    # nothing (the same std, the same time within noise; docs/speed.md)
    # a fixed rank: the adaptive rank (preconditioner_max_rank) changed no validation
    # scan at ratio 100 and made a 0.3 %-noise scan worse (docs/speed.md, "An adaptive
    # preconditioner rank")
    # the calibration floor dropped where the held-out projections reject it (by > 10
    # nats): on 8 of 20 realistic 64² validation scans they did (44–167 nats), LL +0.05,
    # std/RMSE 1.50 → 1.18 at the same worst image (docs/defaults.md)
    # the texture threshold: the 16-channel network's calibration (s1 0.19) is narrower
    # than a photo crop's own error, which the held-out projections read as a constant
    # pixel error t0; below edge concentration 0.35 (the photo crops 0.26-0.29, every
    # piecewise-constant validation image >= 0.42) t0 is fitted, not held at zero:
    # photos' worst image 88.0 -> 95.3 %, the other 36 validation scans unchanged
    # (docs/dip.md §11); since 2026-12-01 without the prior's pull on s1 either (17 photo
    # crops: LL 4.187 -> 4.231, worst 88.0 -> 88.8 %; docs/defaults.md)
    # the rank grows (to 1600 at most) where a solve is still above tolerance after 100
    # iterations: the 16-channel network's first E-step on textured high-count scans made
    # no progress at rank 400 (relative residual 1.0), and the EM took its zero mode
    # at its word (the prior precision 3423 -> 0.006 in one step, still moving at the step
    # cap); solves that converge are untouched (docs/dip.md §11)
    # the predictive draws' solves refined in float64 (cg_refine 2, the EM's left in
    # float32): at 1 % noise the float32 draws missed the data by up to 4 noise norms and
    # made one validation ellipse's posterior std 30 % too wide; on the 60 64² test scans
    # (35 Gaussian, 25 realistic) the interval and LL did not move. Not yet dip-128's: on
    # a realistic 128² test scan at I0 1e5 it lowered the LL by 0.02 (docs/defaults.md)
    "dip-64": dict(n_samples=8, predictive_samples=32, predcp_samples=16, em_steps=5,
                   preconditioner_rank=400, preconditioner_max_rank=1600,
                   preconditioner_max_ratio=None, preconditioner_grow_after=100,
                   dip_from_heldout=0.5, cg_refine=2, cg_refine_stages="predictive",
                   heldout_calibration_floor="checked", heldout_texture_threshold=0.35),
    # held-out prior width 0.02, not 0.1: on 10 realistic 128² validation scans the
    # held-out fit (1,640 left-out rays) reads s1 at 2-3x the calibration's and every
    # width >= 0.1 left ±2σ above 99 % (std/RMSE 1.5-1.7); 0.02 met the interval
    # targets with the highest LL (docs/defaults.md)
    # the floor checked as at 64²: on the same 10 scans 2 floors rejected, LL +0.004,
    # std/RMSE 1.23 → 1.19 at the same worst image (docs/defaults.md)
    # two separate DIP fits, not dip-64's shared one (dip_from_heldout 0): it passed the
    # realistic validation scans, but on the 20 realistic test scans it widened the
    # interval past the sharpness target (std/RMSE above 1.3, ±1σ 81 -> 86 %) and
    # lowered the LL, for 19 % less time; the held-out floor is still the calibration of
    # separate fits (docs/speed.md)
    "dip-128": dict(n_samples=8, predictive_samples=32, predcp_samples=16,
                    preconditioner_rank=200, heldout_prior_width=0.02,
                    heldout_calibration_floor="checked"),
    "dip-256": dict(n_samples=4, predictive_samples=32, predcp_samples=16, em_steps=4,
                    preconditioner_rank=400),
    # the sampling paper: few samples suffice for large models (γ̂'s relative error
    # is √(2/(kγ)), γ in the thousands here). Rank 200, not 400: on 2 CPU cores a
    # Jacobian pair takes ≈ 4 s at 512², so the rank-400 sketch alone (820 pairs)
    # took longer than the whole DIP fit (docs/scaling.md §2)
    "dip-512": dict(n_samples=2, predictive_samples=16, predcp_samples=8, em_steps=3,
                    preconditioner_rank=200),
}


#: Learning rate and iterations of a DIP fit from a warm start (``dip.warm_start``
#: other than ``'none'``), per preset; they replace :data:`DIP_DEFAULTS`' unless the
#: user sets them. A pretrained start needs a lower peak learning rate (a high
#: one undoes the pretraining) and fewer iterations (docs/dip.md §6).
WARM_START_DEFAULTS: dict[str, dict] = {
    # validation split: with lr 2e-3 two images ended 1.7 and 3.2 dB below the
    # pretrained network's own output after 300 iterations; lr 3e-4 after 20 warm-up
    # steps ended 0.2 dB above it on both
    "dip-64": dict(iterations=300, lr=3e-4, warmup=20),
}
