"""The model-error term: coefficients recovered where the true bias variance is known."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import ellipses
from ctuq.errors import InputError
from ctuq.recon import model_error as me

pytestmark = pytest.mark.usefixtures("one_thread")


def _synthetic(n_images, size, t0, s1, seed):
    """Truth = x̂ + δ with δ ~ N(0, var_post + s0² + s1² e(x̂)²), exactly the model."""
    gen = np.random.default_rng(seed)
    out = []
    for i in range(n_images):
        x_hat = ellipses(size, seed=100 + i).astype(np.float64)
        vp = gen.uniform(0.5, 1.5, x_hat.shape) * 1e-4
        var = vp + me.model_error_variance(x_hat, vp, t0, s1).numpy()
        out.append((x_hat + gen.standard_normal(x_hat.shape) * np.sqrt(var), x_hat, vp))
    return out


def test_edge_strength_marks_both_sides_of_an_edge_and_their_neighbours():
    x = np.zeros((9, 9))
    x[:, 5:] = 2.0
    e = me.edge_strength(x).numpy()
    assert np.all(e[:, 3:7] == 2.0) and np.all(e[:, :3] == 0) and np.all(e[:, 7:] == 0)
    mask = me.edge_mask(x).numpy()
    assert np.array_equal(mask, e > 0)


def test_fit_to_truth_recovers_known_coefficients():
    data = _synthetic(6, 48, t0=2.0, s1=0.3, seed=0)
    c = me.fit_to_truth(*zip(*data))
    assert c.method == "calibrated"
    assert c.t0 == pytest.approx(2.0, rel=0.05) and c.s1 == pytest.approx(0.3, rel=0.05)


def test_fit_to_truth_finds_no_model_error_when_there_is_none():
    data = _synthetic(4, 48, t0=0.0, s1=0.0, seed=1)
    c = me.fit_to_truth(*zip(*data))
    assert c.t0 < 0.2 and c.s1 < 0.01


HELDOUT_T0, HELDOUT_S1 = 3.0, 0.25


def _heldout_likelihoods(sigma, reps, max_rows=700):
    """Held-out likelihoods of truths that differ from the fit x̂_in by the modelled δ.

    x̂_in is the "fit"; the held-out projections of the truth (noise ``sigma``)
    are all the fit sees.
    """
    size = 32
    gen = np.random.default_rng(3)
    x_in = ellipses(size, seed=7).astype(np.float64)
    vp = np.full(x_in.shape, 1e-4)
    var = vp + me.model_error_variance(x_in, vp, HELDOUT_T0, HELDOUT_S1).numpy()
    op = RayTransform(Geometry.parallel(size, n_angles=90), backend="matrix")
    out = me.heldout_split(90, 3)
    for rep in range(reps):
        truth = x_in + gen.standard_normal(x_in.shape) * np.sqrt(var)
        y = op(torch.as_tensor(truth, dtype=torch.float32)).double()
        y = y + sigma * torch.as_tensor(gen.standard_normal(tuple(y.shape)))
        yield me.heldout_likelihood(op, y, out, x_in, vp, sigma**2, max_rows=max_rows, seed=rep)


def test_fit_heldout_recovers_known_coefficients_from_projections_alone():
    estimates = []
    for lik in _heldout_likelihoods(1e-3, 4):
        c = lik.fit()
        estimates.append((c.t0, c.s1))
        assert c.info["nll_per_measurement"] < c.info["nll_without_model_error"]
    t0_hat, s1_hat = np.mean(estimates, 0)
    assert t0_hat == pytest.approx(HELDOUT_T0, rel=0.15)
    assert s1_hat == pytest.approx(HELDOUT_S1, rel=0.15)


def _dense_blur(shape, length):
    """The convolution of :func:`me.correlated_rows` as a dense matrix (zero padding)."""
    H, W = shape
    yy, xx = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    d2 = (yy.reshape(-1, 1) - yy.reshape(1, -1)) ** 2 + (xx.reshape(-1, 1) - xx.reshape(1, -1)) ** 2
    G = np.exp(-0.5 * d2 / length**2)
    G[d2 > (4 * length) ** 2 * 2] = 0  # outside the kernel's square support
    radius = int(math.ceil(4 * length))
    u = np.arange(-radius, radius + 1)
    return G / math.sqrt((np.exp(-0.5 * u**2 / length**2) ** 2).sum() ** 2)


def test_correlated_rows_are_the_rows_convolved_with_a_unit_energy_gaussian():
    import scipy.sparse as sp

    shape, length = (12, 10), 1.5
    B = sp.random(7, 120, density=0.2, random_state=0, format="csr")
    G = _dense_blur(shape, length)
    G[np.abs(np.subtract.outer(*(2 * [np.arange(12).repeat(10)]))) > 6] = 0  # |dy| <= radius
    G[np.abs(np.subtract.outer(*(2 * [np.tile(np.arange(10), 12)]))) > 6] = 0  # |dx| <= radius
    got = me.correlated_rows(B, shape, length).toarray()
    assert np.allclose(got, B.toarray() @ G, atol=1e-5 * np.abs(got).max())
    # unit energy: white pixel noise keeps its variance in the image's interior
    assert (G @ G.T)[5 * 10 + 5, 5 * 10 + 5] == pytest.approx(1.0, rel=1e-3)
    # below a tenth of a pixel the kernel is one pixel: the rows unchanged
    assert (me.correlated_rows(B, shape, 0.0) != B).nnz == 0


def test_correlated_model_recovers_the_variance_of_errors_correlated_along_rays():
    # pixel errors G·(t·z): per-pixel std t·rms(std_post) in the interior, correlated over 2 px
    size, length, t0 = 32, 2.0, 3.0
    gen = np.random.default_rng(5)
    x_in = ellipses(size, seed=7).astype(np.float64)
    vp = np.full(x_in.shape, 1e-4)
    G = _dense_blur((size, size), length)
    op = RayTransform(Geometry.parallel(size, n_angles=90), backend="matrix")
    out = me.heldout_split(90, 3)
    fits = {0.0: [], length: []}
    for rep in range(3):
        delta = (G @ gen.standard_normal(size * size)).reshape(size, size) * t0 * 1e-2
        y = op(torch.as_tensor(x_in + delta, dtype=torch.float32)).double()
        y = y + 1e-3 * torch.as_tensor(gen.standard_normal(tuple(y.shape)))
        for ell in fits:
            lik = me.heldout_likelihood(op, y, out, x_in, vp, 1e-6, max_rows=600, seed=rep,
                                        correlation_length=ell)
            assert lik.correlation_length == ell
            c = lik.fit()
            fits[ell].append((c.t0, c.info["nll_per_measurement"]))
    (t_corr, nll_corr), (_, nll_indep) = np.mean(fits[length], 0), np.mean(fits[0.0], 0)
    assert t_corr == pytest.approx(t0, rel=0.2)
    # the held-out residuals tell correlated errors from independent ones
    assert all(a[1] < b[1] - 0.05 for a, b in zip(fits[length], fits[0.0]))
    assert nll_corr < nll_indep


def test_a_stored_likelihood_is_rebuilt_at_another_correlation_length():
    size = 24
    gen = np.random.default_rng(2)
    x_in = ellipses(size, seed=3).astype(np.float64)
    vp = gen.uniform(0.5, 1.5, x_in.shape) * 1e-4
    op = RayTransform(Geometry.parallel(size, n_angles=30), backend="matrix")
    out = me.heldout_split(30, 3)
    y = op(torch.as_tensor(x_in + 0.02 * gen.standard_normal(x_in.shape), dtype=torch.float32))
    made = {ell: me.heldout_likelihood(op, y, out, x_in, vp, 1e-4, correlation_length=ell)
            for ell in (0.0, 1.5)}
    for a, b in ((0.0, 1.5), (1.5, 0.0), (0.0, 0.0)):
        got = made[a].with_correlation_length(op, b)
        assert got.correlation_length == b
        for key in ("M_post", "M_const", "M_edge", "r"):
            assert np.allclose(getattr(got, key), getattr(made[b], key), rtol=1e-4,
                               atol=1e-6 * np.abs(getattr(made[b], key)).max()), key
    bare = dataclasses.replace(made[0.0], image=None)
    with pytest.raises(InputError, match="cannot be rebuilt"):
        bare.with_correlation_length(op, 1.0)
    with pytest.raises(InputError, match="held-out measurements"):
        made[0.0].with_correlation_length(op, 1.0, max_rows=20)


def test_heldout_prior_fades_where_the_projections_see_the_model_error():
    # a prior centred 3x off on both coefficients barely moves an informative fit
    prior = me.ModelErrorCoefficients(HELDOUT_T0 / 3, HELDOUT_S1 * 3, "calibrated")
    estimates = []
    for lik in _heldout_likelihoods(1e-3, 4):
        c = lik.fit(prior, prior_width=1.0)
        assert c.info["prior"] == {"t0": prior.t0, "s1": prior.s1, "width": 1.0,
                                   "floor": False, "floor_rejection_nats": None,
                                   "floor_rejected": False, "texture": False}
        assert c.info["mle"]["t0"] == pytest.approx(lik.fit().t0)
        estimates.append((c.t0, c.s1))
    t0_hat, s1_hat = np.mean(estimates, 0)
    assert t0_hat == pytest.approx(HELDOUT_T0, rel=0.2)
    assert s1_hat == pytest.approx(HELDOUT_S1, rel=0.2)


def test_heldout_prior_carries_the_fit_where_the_projections_cannot_see_it():
    # noise 3000x larger: the model error is a vanishing part of the held-out variance
    lik = next(_heldout_likelihoods(3.0, 1, max_rows=300))
    prior = me.ModelErrorCoefficients(1.5, 0.1, "calibrated")
    assert lik.nll(math.log(1.5), math.log(0.1)) == pytest.approx(
        lik.nll(math.log(1e-8), math.log(1e-8)), abs=2e-3)  # flat: the data cannot tell
    c = lik.fit(prior, prior_width=0.5)
    assert abs(math.log(c.t0 / prior.t0)) < 0.25 and abs(math.log(c.s1 / prior.s1)) < 0.25
    # a narrower prior holds the coefficients closer to its centre
    tight = lik.fit(prior, prior_width=0.05)
    assert abs(math.log(tight.t0 / prior.t0)) <= abs(math.log(c.t0 / prior.t0)) + 1e-3
    # a zero (or negligible) coefficient in the calibration puts no prior on it
    for s1 in (0.0, 1e-6):
        free = lik.fit(me.ModelErrorCoefficients(1.5, s1, "calibrated"), prior_width=0.5)
        assert free.s1 == pytest.approx(free.info["mle"]["s1"], rel=0.05, abs=1e-6)


def test_calibration_floor_holds_a_negligible_coefficient_at_zero_and_bounds_the_other():
    # informative held-out data (true t0 = 3, s1 = 0.25); a calibration without t0
    lik = next(_heldout_likelihoods(1e-3, 1))
    mle = lik.fit()
    assert mle.t0 > 1.0  # the data alone put a constant term there
    high = me.ModelErrorCoefficients(0.0, 3 * HELDOUT_S1, "calibrated")
    c = lik.fit(high, prior_width=0.1, floor=True)
    assert c.t0 == 0.0  # held at the calibration's zero, not fitted
    assert c.s1 == high.s1  # the fit wants less: the calibration is the bound
    assert c.info["prior"]["floor"] is True
    assert c.info["mle"] == {"t0": mle.t0, "s1": mle.s1}
    # a calibration below what the data show: the fit with t0 held at zero, above the bound
    low = me.ModelErrorCoefficients(0.0, HELDOUT_S1 / 10, "calibrated")
    c = lik.fit(low, prior_width=20.0, floor=True)
    assert c.t0 == 0.0 and c.s1 > low.s1
    # ... at the one-dimensional optimum of s1 (a prior this wide hardly pulls)
    at = {f: lik.nll(math.log(1e-9), math.log(c.s1 * f)) for f in (0.9, 1.0, 1.1)}
    assert at[1.0] <= min(at[0.9], at[1.1])
    # without the floor, the same calibration leaves t0 free
    assert lik.fit(low, prior_width=20.0).t0 > 1.0
    # both coefficients calibrated: each the larger of its fit and the calibration
    both = me.ModelErrorCoefficients(10 * HELDOUT_T0, HELDOUT_S1 / 10, "calibrated")
    c = lik.fit(both, prior_width=20.0, floor=True)
    plain = lik.fit(both, prior_width=20.0)
    assert c.t0 == both.t0 and c.s1 == pytest.approx(max(plain.s1, both.s1))
    # no calibration, no bound: the maximum likelihood
    assert (lik.fit(None, floor=True).t0, lik.fit(None, floor=True).s1) == (mle.t0, mle.s1)


def test_texture_fits_the_coefficient_the_floor_holds_at_zero_without_the_prior():
    # informative held-out data (true t0 = 3, s1 = 0.25); a calibration without t0
    lik = next(_heldout_likelihoods(1e-3, 1))
    low = me.ModelErrorCoefficients(0.0, HELDOUT_S1 / 10, "calibrated")
    held = lik.fit(low, prior_width=20.0, floor=True)
    freed = lik.fit(low, prior_width=20.0, floor=True, texture=True)
    assert held.t0 == 0.0 and freed.t0 > 1.0
    assert freed.info["prior"]["texture"] and not held.info["prior"]["texture"]
    # the floor below the data does not bind: the maximum likelihood, t0 and all
    mle = lik.fit()
    assert (freed.t0, freed.s1) == pytest.approx((mle.t0, mle.s1), rel=1e-4)
    # a tight prior far below the data pulls s1 down; a texture's s1 is not pulled
    tight = lik.fit(low, prior_width=0.1)
    assert tight.s1 < 0.5 * mle.s1
    assert lik.fit(low, prior_width=0.1, floor=True, texture=True).s1 == pytest.approx(
        mle.s1, rel=1e-4)
    # a floor above the data still binds s1
    high = me.ModelErrorCoefficients(0.0, 3 * HELDOUT_S1, "calibrated")
    c = lik.fit(high, prior_width=0.1, floor=True, texture=True)
    assert c.t0 > 0.0 and c.s1 == high.s1
    # without the floor, a texture is the maximum likelihood
    assert (lik.fit(low, prior_width=0.1, texture=True).s1 == pytest.approx(mle.s1, rel=1e-4))


def test_a_degenerate_heldout_likelihood_is_not_passed_off_as_a_fit(caplog):
    """A noise variance near zero leaves the covariance singular (more held-out rows than
    pixels): the search has no gradient and stops at its start. The fit says so, warns,
    and falls back to the calibration (or to no model error), never to the start point."""
    import dataclasses

    lik = next(_heldout_likelihoods(1e-3, 1))
    assert lik.fit().info["fit_ok"]
    bad = dataclasses.replace(lik, noise_var=1e-20)
    prior = me.ModelErrorCoefficients(0.5, 0.2, "calibrated")
    with caplog.at_level("WARNING", logger="ctuq.recon.model_error.heldout"):
        c = bad.fit(prior, prior_width=0.1, floor=True)
    assert not c.info["fit_ok"] and "not positive definite" in caplog.text
    assert (c.t0, c.s1) == (prior.t0, prior.s1)
    assert c.info["nll_per_measurement"] is None  # no inf in a result file
    none = bad.fit()
    assert (none.t0, none.s1) == (0.0, 0.0) and not none.info["fit_ok"]


def test_edge_concentration_tells_edges_from_texture():
    from ctuq.recon.model_error.terms import EDGE_SHARE, edge_concentration

    yy, xx = np.mgrid[:64, :64]
    blocks = ((abs(xx - 30) < 12) & (abs(yy - 34) < 9)).astype(float) + 0.5 * (xx > 50)
    texture = np.random.default_rng(0).normal(size=(64, 64))
    assert edge_concentration(blocks) > 0.9  # all of the gradient on the edges
    assert edge_concentration(texture) < 0.35  # spread over every pixel
    # a uniform gradient: the strongest tenth carries a tenth
    assert edge_concentration(xx.astype(float)) == pytest.approx(EDGE_SHARE, rel=0.02)
    # scale and offset do not matter; a constant image has no texture
    assert edge_concentration(1e-6 * texture + 3.0) == pytest.approx(
        edge_concentration(texture), rel=1e-9)
    assert edge_concentration(np.full((8, 8), 2.0)) == 1.0
    assert edge_concentration(texture, share=1.0) == pytest.approx(1.0)


def test_heldout_likelihood_round_trips_through_its_arrays(tmp_path):
    lik = next(_heldout_likelihoods(1e-3, 1, max_rows=200))
    np.savez(tmp_path / "lik.npz", **lik.arrays())
    back = me.HeldoutLikelihood.from_arrays(np.load(tmp_path / "lik.npz"))
    assert back.heldout_angles == lik.heldout_angles == 30
    # the image the residuals are of and the left-out angles travel with it
    assert np.array_equal(back.image, lik.image) and back.image.shape == (32, 32)
    assert np.array_equal(back.out_mask, me.heldout_split(90, 3))
    old = {k: v for k, v in lik.arrays().items()
           if k not in ("image", "out_mask", "correlation_length")}
    assert me.HeldoutLikelihood.from_arrays(old).image is None  # a file from before them
    assert me.HeldoutLikelihood.from_arrays(old).correlation_length == 0.0
    for p in ((0.0, -1.0), (1.0, -2.0)):
        assert back.nll(*p) == lik.nll(*p)
    with pytest.raises(InputError, match="heldout_prior_width"):
        lik.fit(me.ModelErrorCoefficients(1.0, 0.1), prior_width=0.0)


def test_conformal_scale_gives_its_coverage_on_exchangeable_data():
    gen = np.random.default_rng(4)
    def draw(n):
        std = gen.uniform(0.5, 2.0, (n, 32, 32))
        err = gen.standard_t(4, (n, 32, 32)) * std * 1.7  # heavier tails, wrong scale
        return list(err), [np.zeros((32, 32))] * n, list(std)
    q = me.conformal_scale(*draw(20))
    t, m, s = draw(20)
    z = np.abs(np.array(t)) / np.array(s)
    covered = float((z <= 2 * q).mean())
    assert 0.945 <= covered <= 0.965
    assert float((z <= 2).mean()) < 0.9  # the raw std was overconfident


def test_coefficients_file_round_trip_and_errors(tmp_path):
    c = me.ModelErrorCoefficients(1.5, 0.2, "calibrated", info={"preset": "dip-64"})
    path = c.save(tmp_path / "me.json")
    assert me.ModelErrorCoefficients.load(path) == c
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="format"):
        me.ModelErrorCoefficients.load(tmp_path / "bad.json")
    (tmp_path / "neg.json").write_text(json.dumps({**c.to_dict(), "s1": -1}))
    with pytest.raises(InputError, match="s1"):
        me.ModelErrorCoefficients.load(tmp_path / "neg.json")
    (tmp_path / "nan.json").write_text('{"format": "ctuq-model-error", "t0": NaN}')
    with pytest.raises(InputError, match="t0"):
        me.ModelErrorCoefficients.load(tmp_path / "nan.json")
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(InputError, match="JSON"):
        me.ModelErrorCoefficients.load(tmp_path / "text.json")
    with pytest.raises(InputError, match="no such"):
        me.ModelErrorCoefficients.load(tmp_path / "missing.json")


@pytest.mark.parametrize("n, every", [(6, 6), (10, 1), (5, 2)])
def test_heldout_split_refuses_too_few_angles(n, every):
    with pytest.raises(InputError, match="heldout_every"):
        me.heldout_split(n, every)


def test_too_few_angles_name_the_fraction_left_out_and_the_other_terms():
    with pytest.raises(InputError) as err:
        me.heldout_split(5, 3)
    message = err.value.message
    assert "every 3rd angle" in message and "-th" not in message
    assert all(name in message for name in ("calibrated", "conformal", "none"))


@pytest.mark.parametrize("n, text", [(2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"),
                                     (12, "12th"), (13, "13th"), (21, "21st"), (22, "22nd"),
                                     (111, "111th")])
def test_ordinals_of_the_left_out_angle(n, text):
    from ctuq.recon.model_error.heldout import _ordinal

    assert _ordinal(n) == text


def test_heldout_split_leaves_out_every_kth_angle():
    m = me.heldout_split(60, 6)
    assert m.sum() == 10 and np.all(np.flatnonzero(m) % 6 == 3)


@pytest.mark.parametrize("n, expect_every", [(30, 4), (60, 6), (45, 6), (12, 3), (9, 3)])
def test_heldout_split_lowers_every_until_enough_angles_are_out(n, expect_every):
    m = me.heldout_split(n, 6, min_out=7)
    assert np.all(np.flatnonzero(m) % expect_every == expect_every // 2)
    assert m.sum() == len(range(expect_every // 2, n, expect_every))
    # enough out, or already every 3rd (two thirds stay in the fit)
    assert m.sum() >= 7 or expect_every == 3
    if n >= 12:  # min_out 0 is every 6th as given (9 angles: too few for it, refused)
        assert np.array_equal(me.heldout_split(n, 6, min_out=0), me.heldout_split(n, 6))


@pytest.mark.parametrize("net_input", ["fbp", "tv"])
def test_heldout_fit_never_sees_the_left_out_projections(net_input):
    from ctuq.recon.dip import DIPConfig

    op = RayTransform(Geometry.parallel(16, n_angles=12), backend="matrix")
    x = ellipses(16, seed=3)
    y = op(torch.as_tensor(x)).detach()
    cfg = DIPConfig.for_image_size(16, iterations=20, progress_every=10**6, device="cpu",
                                   net_input=net_input)
    mask, dip = me.heldout_fit(y, op, cfg, every=4, noise_std=0.05)
    assert mask.sum() == 3 and dip.reconstruction.shape == (16, 16)
    assert dip.net_input.shape == (1, 1, 16, 16) and torch.isfinite(dip.net_input).all()
    y2 = y.clone()
    y2[torch.as_tensor(mask)] += 10.0  # change only what is left out
    _, dip2 = me.heldout_fit(y2, op, cfg, every=4, noise_std=0.05)
    assert torch.equal(dip.reconstruction, dip2.reconstruction)


def test_shipped_calibrations_load_and_say_what_they_were_fitted_on():
    files = sorted(me.DEFAULTS_DIR.glob("*.json"))
    for path in files:
        c = me.shipped_coefficients(path.stem)
        assert c == me.ModelErrorCoefficients.load(path) and c.method == "calibrated"
        assert c.info["preset"] == path.stem and c.info["split"] == "tuning"
        assert c.t0 > 0 and c.conformal >= 1.0
    assert me.shipped_coefficients("no-such-preset") is None
    with pytest.raises(InputError, match="ctuq calibrate --size"):
        me.coefficients_for("no-such-preset")


def test_heldout_gradient_matches_finite_differences_and_the_search_finds_the_optimum():
    from scipy.optimize import minimize

    lik = next(_heldout_likelihoods(3e-3, 1, max_rows=250))
    v = np.array([4.0, 0.05])
    _, grad = lik._total_nll_and_grad(v)
    h = 1e-6
    fd = [(lik._total_nll_and_grad(v + h * e)[0] - lik._total_nll_and_grad(v - h * e)[0])
          / (2 * h) for e in np.eye(2)]
    np.testing.assert_allclose(grad, fd, rtol=1e-4)
    # the gradient search reaches the optimum of an independent derivative-free search
    c = lik.fit()
    nm = minimize(lambda p: lik.nll(*p), np.array([0.0, math.log(0.3)]), method="Nelder-Mead",
                  options={"xatol": 1e-4, "fatol": 1e-12, "maxiter": 1000})
    m = len(lik.r)
    assert lik.nll(math.log(c.t0), math.log(c.s1)) * m <= nm.fun * m + 1e-4


@pytest.mark.parametrize("name", list(me.MODEL_ERROR_TERMS))
def test_makes_fit_first_says_which_terms_make_a_fit_first(name):
    # ctuq calibrate and the shared DIP fit both read the flag instead of naming a term:
    # it must be set exactly where fit_first is overridden (the term has a fit to share)
    cls = me.MODEL_ERROR_TERMS[name]
    overrides = cls.fit_first is not me.ModelErrorTerm.fit_first
    assert cls.makes_fit_first == overrides


def test_calibration_floor_is_dropped_where_the_projections_reject_it():
    """``floor_reject``: the floor is kept unless the held-out log-likelihood at the floored
    coefficients is more than that many nats below the fit's own (negligible coefficients
    still held at zero); the rejection is the summed log-likelihood difference."""
    lik = next(_heldout_likelihoods(1e-3, 1))
    m = len(lik.r)
    high = me.ModelErrorCoefficients(0.0, 3 * HELDOUT_S1, "calibrated")
    kept = lik.fit(high, prior_width=0.1, floor=True)  # default: never dropped
    nats = kept.info["prior"]["floor_rejection_nats"]
    assert kept.s1 == high.s1 and not kept.info["prior"]["floor_rejected"]
    dropped = lik.fit(high, prior_width=0.1, floor=True, floor_reject=0.0)
    assert dropped.t0 == 0.0 and dropped.s1 < high.s1 and dropped.info["prior"]["floor_rejected"]
    held = math.log(1e-9)  # t0 at zero
    assert nats == pytest.approx(m * (lik.nll(held, math.log(high.s1))
                                      - lik.nll(held, math.log(dropped.s1))), rel=1e-4)
    assert nats > 10.0  # 3x the true s1: these projections reject it clearly
    # the threshold decides, nothing else
    assert lik.fit(high, prior_width=0.1, floor=True, floor_reject=0.999 * nats).s1 == \
        dropped.s1
    assert lik.fit(high, prior_width=0.1, floor=True, floor_reject=1.001 * nats).s1 == high.s1
    # a floor below what the data show does not bind: nothing to reject
    low = me.ModelErrorCoefficients(0.0, HELDOUT_S1 / 10, "calibrated")
    c0 = lik.fit(low, prior_width=20.0, floor=True, floor_reject=0.0)
    assert c0.info["prior"]["floor_rejection_nats"] == 0.0
    assert not c0.info["prior"]["floor_rejected"]
    assert c0.s1 == lik.fit(low, prior_width=20.0, floor=True).s1


def test_heldout_misfit_is_the_weighted_mean_square_on_the_left_out_rows_only():
    from ctuq.recon.model_error.heldout import heldout_misfit

    op = RayTransform(Geometry.parallel(16, n_angles=12), backend="matrix")
    x = torch.as_tensor(ellipses(16, seed=5))
    y = op(x).detach().double()
    mask = me.heldout_split(12, 4)
    gen = torch.Generator().manual_seed(0)
    e = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    v = 0.5 + torch.rand(y.shape, generator=gen, dtype=torch.float64)
    assert heldout_misfit(op, y, mask, x) == pytest.approx(0.0, abs=1e-9)  # exact data
    rows = torch.as_tensor(mask)
    want = float((e[rows] ** 2 / v[rows]).mean())  # dense, by hand
    assert heldout_misfit(op, y + e, mask, x, v) == pytest.approx(want, rel=1e-5)
    assert heldout_misfit(op, y + e, mask, x) == pytest.approx(float((e[rows] ** 2).mean()),
                                                               rel=1e-5)
    kept_changed = y + e
    kept_changed[~rows] += 3.0  # the kept rows do not count
    assert heldout_misfit(op, kept_changed, mask, x, v) == pytest.approx(want, rel=1e-5)
    per = heldout_misfit(op, y + e, mask, x, v, per_angle=True)
    assert per.shape == (int(mask.sum()),)
    np.testing.assert_allclose(per, (e[rows] ** 2 / v[rows]).mean(dim=1).numpy(), rtol=1e-5)


def test_preferred_input_needs_a_lead_on_the_left_out_angles_not_only_on_average():
    from ctuq.recon.model_error.heldout import preferred_input

    ref = np.array([1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8])
    steady = ref - 0.05  # better on every angle by a little
    lucky = ref.copy()
    lucky[0] -= 0.7  # better on average, by one angle
    chosen, t = preferred_input({"fbp": ref, "tv": steady, "lucky": lucky}, "fbp", 2.0)
    assert chosen == "tv" and t["tv"] == 1e9  # the differences do not vary
    d = ref - lucky
    assert t["lucky"] == pytest.approx(d.mean() / (d.std(ddof=1) / math.sqrt(7)))
    assert lucky.mean() < steady.mean() and t["lucky"] < 2.0
    assert preferred_input({"fbp": ref, "lucky": lucky}, "fbp", 2.0)[0] == "fbp"
    noisy = ref + np.array([-0.3, 0.2, -0.25, 0.3, -0.2, 0.1, -0.2])  # no clear lead
    assert preferred_input({"fbp": ref, "tv": noisy}, "fbp", 2.0)[0] == "fbp"
    worse = ref + 0.1
    chosen, t = preferred_input({"fbp": ref, "tv": worse}, "fbp", 2.0)
    assert chosen == "fbp" and t["tv"] == -1e9


def test_input_fallback_prefers_the_image_that_predicts_the_left_out_angles():
    """The network's input image is shown only where it predicts the left-out rows
    clearly better than the fit from it; a fit that is better keeps its place."""
    from ctuq.data.phantoms import digits
    from ctuq.recon.model_error.heldout import heldout_misfit, heldout_split
    from ctuq.recon.model_error.terms import AUTO_INPUT_T, input_fallback

    op = RayTransform(Geometry.parallel(28, 24))
    truth = torch.as_tensor(digits(1)[0], dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    y = op(truth) + 0.01 * torch.randn(op.range_shape, generator=gen)
    mask = heldout_split(24, every=4)
    rough = truth + 0.2 * torch.randn(truth.shape, generator=gen)  # a worse image
    worse_fit = input_fallback(op, y, mask, rough, truth)
    assert worse_fit["used"] and worse_fit["t"] > AUTO_INPUT_T == worse_fit["t_min"]
    assert worse_fit["heldout_misfit"]["fit"] == pytest.approx(
        heldout_misfit(op, y, mask, rough))
    better_fit = input_fallback(op, y, mask, truth, rough)
    assert not better_fit["used"] and better_fit["t"] < 0
    # a lead too small for the threshold keeps the fit
    assert not input_fallback(op, y, mask, rough, truth, t_min=1e9)["used"]
