"""Counts → line integrals: the delta-method variance against Poisson draws."""

from __future__ import annotations

import numpy as np
import pytest

from ctuq.data.counts import counts_to_line_integrals
from ctuq.errors import InputError


@pytest.mark.parametrize("i0", [1e3, 1e4, 1e5])
def test_predicted_variance_matches_poisson_draws(i0):
    gen = np.random.default_rng(int(i0))
    n_draws, n_det, n_flats, n_darks, dark = 4000, 12, 5, 3, 20.0
    p = np.linspace(0.0, 3.0, n_det)            # line integrals, 5 %–100 % transmission
    rate = i0 * np.exp(-p)
    ys, preds = [], []
    for _ in range(n_draws):
        proj = gen.poisson(rate + dark)[None].astype(float)
        flats = gen.poisson(i0 + dark, size=(n_flats, n_det)).astype(float)
        darks = gen.poisson(dark, size=(n_darks, n_det)).astype(float)
        out = counts_to_line_integrals(proj, flats, darks)
        ys.append(out.y[0])
        preds.append(out.variance[0])
    ys, preds = np.array(ys), np.array(preds)
    # unbiased up to the log's second-order bias ~ 1/(2 I)
    assert np.all(np.abs(ys.mean(0) - p) < 4 * np.sqrt(preds.mean(0) / n_draws) + 1 / rate)
    ratio = preds.mean(0) / ys.var(0, ddof=1)
    # the sampling error of a variance over 4000 draws is 2.2 %
    assert np.all(np.abs(ratio - 1) < 0.10), ratio
    # the flats' term matters: the plain 1/(I − D) misses a sixth at full transmission
    plain = 1 / rate[0]
    assert plain / ys[:, 0].var(ddof=1) < 0.9

def test_photon_starvation_is_clipped_counted_and_warned():
    proj = np.array([[5.0, 10.0, 200.0]])
    darks = np.full((2, 3), 10.0)
    flats = np.full((3, 3), 1010.0)
    with pytest.warns(RuntimeWarning, match="2 of 3 rays"):
        out = counts_to_line_integrals(proj, flats, darks, min_counts=1.0)
    assert out.n_clipped == 2 and out.n_dead == 0
    assert np.all(np.isfinite(out.y)) and np.all(np.isfinite(out.variance))
    assert out.y[0, 0] == pytest.approx(np.log(1000.0))       # clipped to one count
    assert out.variance[0, 0] > 100 * out.variance[0, 2]       # and nearly weightless


def test_dead_flat_pixels_and_gain():
    flats = np.array([[1000.0, 0.0]])
    with pytest.warns(RuntimeWarning, match="dead"):
        out = counts_to_line_integrals(np.array([[100.0, 0.5]]), flats)
    assert out.n_dead == 1
    a = counts_to_line_integrals(np.full((2, 3), 100.0), np.full((4, 3), 1000.0), gain=1.0)
    b = counts_to_line_integrals(np.full((2, 3), 100.0), np.full((4, 3), 1000.0), gain=4.0)
    np.testing.assert_allclose(a.y, b.y)
    np.testing.assert_allclose(b.variance, a.variance / 4)


def test_slices_broadcast_per_slice_flats():
    counts = np.stack([np.full((4, 6), 100.0), np.full((4, 6), 50.0)])   # 2 slices
    flats = np.stack([np.full((2, 6), 1000.0), np.full((2, 6), 500.0)], axis=1)  # (frames, slices, det)
    out = counts_to_line_integrals(counts, flats)
    np.testing.assert_allclose(out.y, np.log(10.0))
    assert out.variance.shape == counts.shape


@pytest.mark.parametrize("kwargs,field", [
    ({"gain": 0.0}, "gain"), ({"min_counts": -1.0}, "min_counts")])
def test_bad_parameters(kwargs, field):
    with pytest.raises(InputError) as err:
        counts_to_line_integrals(np.ones((2, 3)), np.ones((1, 3)), **kwargs)
    assert err.value.field == field


def test_bad_shapes():
    with pytest.raises(InputError) as err:
        counts_to_line_integrals(np.ones((2, 3)), np.ones((1, 4)))
    assert err.value.field == "flats"
    with pytest.raises(InputError) as err:
        counts_to_line_integrals(np.array([1.0, np.nan]).reshape(1, 2), np.ones(2))
    assert err.value.field == "counts"
