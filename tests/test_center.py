"""Centre-of-rotation estimates on off-grid simulated parallel-beam scans."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from _offgrid import angles_180, offgrid_sinogram
from ctuq.data.center import center_offset_std, estimate_center_offset
from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.splits import Case

FAMILIES = ("ellipses", "shepp-variant", "rectangles", "digits")
N = 48


def _scan(offset, angles, index, noise=0.02, size=N):
    family = FAMILIES[index % len(FAMILIES)]
    clean = offgrid_sinogram(Case("validation", family, 40 + index, 4 * size).image(), size,
                             angles, center_offset=offset)
    gen = np.random.default_rng(1000 + index)
    return clean + noise * np.abs(clean).mean() * gen.standard_normal(clean.shape)


def _angles(kind, n):
    if kind == "half-turn":          # midpoints over [0, π), ctuq's default
        return angles_180(n)
    if kind == "full-turn":          # 360°: pairs π apart, the mirror method
        return np.linspace(0, 2 * np.pi, 2 * n, endpoint=False)
    if kind == "golden":             # irregular, reduced to a half turn
        return np.sort(np.mod(np.arange(n) * np.pi * (3 - math.sqrt(5)), np.pi))
    raise ValueError(kind)


OFFSETS = [0.0, 0.37, -0.5, 2.5, -3.21, 4.8]


@pytest.mark.parametrize("kind,method", [("half-turn", "vo"), ("full-turn", "mirror"),
                                         ("golden", "vo")])
@pytest.mark.parametrize("index,offset", list(enumerate(OFFSETS)))
def test_center_within_half_a_pixel(kind, method, index, offset):
    angles = _angles(kind, 40)
    est = estimate_center_offset(_scan(offset, angles, index), angles)
    assert est.method == method
    assert abs(est.offset - offset) < 0.5, est
    assert est.confidence > 0.7


def test_random_offsets_at_64_pixels():
    gen = np.random.default_rng(7)
    for i in range(4):
        offset = gen.uniform(-5, 5)
        angles = angles_180(int(gen.choice([30, 60, 90])))
        est = estimate_center_offset(_scan(offset, angles, i, size=64), angles)
        assert abs(est.offset - offset) < 0.5, (offset, est)


def test_sign_follows_ctuq_geometry():
    # ctuq's own projector with Geometry.center_offset, no ASTRA call in the test
    x = torch.from_numpy(Case("validation", "shepp-variant", 3, 32).image())
    for offset in (-2.0, 1.5):
        g = Geometry.parallel(32, 60, center_offset=offset)
        y = RayTransform(g).A(x).numpy()
        est = estimate_center_offset(y, g.angles)
        assert abs(est.offset - offset) < 0.5
        g2 = Geometry.parallel(32, angles=np.linspace(0, 2 * np.pi, 60, endpoint=False),
                               center_offset=offset)
        est = estimate_center_offset(RayTransform(g2).A(x).numpy(), g2.angles)
        assert est.method == "mirror" and abs(est.offset - offset) < 0.5


def test_limited_angle_is_undetermined():
    angles = np.linspace(0, 2 * np.pi / 3, 40, endpoint=False)
    est = estimate_center_offset(_scan(2.0, angles, 0), angles)
    assert math.isnan(est.offset) and est.confidence == 0.0 and "180" in est.info["reason"]
    with_mirror = estimate_center_offset(_scan(2.0, angles, 0), angles, method="mirror")
    assert math.isnan(with_mirror.offset) and with_mirror.confidence == 0.0


def test_too_few_angles_lower_the_confidence():
    many, few = angles_180(40), angles_180(4)
    hi = estimate_center_offset(_scan(1.0, many, 1), many)
    lo = estimate_center_offset(_scan(1.0, few, 1), few)
    assert lo.confidence < 0.5 < hi.confidence


def test_bad_input():
    from ctuq.errors import InputError
    with pytest.raises(InputError):
        estimate_center_offset(np.zeros((3, 10)), np.zeros(4))
    with pytest.raises(InputError):
        estimate_center_offset(np.zeros((3, 10)), np.arange(3.0), method="x")


@pytest.mark.parametrize("kind,method", [("half-turn", "vo"), ("full-turn", "mirror")])
def test_center_std_is_the_spread_of_the_estimate_over_the_noise(kind, method):
    """The bootstrap std of one scan's estimate matches how far the estimates of the
    same object under 12 other noise draws spread (the ratio within 0.6–1.7, about the
    sampling error of two 12–16-draw stds), and grows with the noise."""
    angles = _angles(kind, 30)
    clean = offgrid_sinogram(Case("validation", "ellipses", 41, 4 * 32).image(), 32, angles,
                             center_offset=0.3)
    sigma = 0.2 * np.abs(clean).mean()
    gen = np.random.default_rng(5)
    draws = [clean + sigma * gen.standard_normal(clean.shape) for _ in range(13)]
    ests = [estimate_center_offset(y, angles) for y in draws]
    assert {e.method for e in ests} == {method}
    spread = np.std([e.offset for e in ests[1:]])
    std = center_offset_std(draws[0], angles, ests[0], sigma ** 2)
    assert 0.6 < std / spread < 1.7, (std, spread)
    assert center_offset_std(draws[0], angles, ests[0], (sigma / 4) ** 2) < 0.5 * std


def test_center_std_of_an_undetermined_estimate_is_nan():
    angles = np.linspace(0, 0.6 * np.pi, 20)   # less than a half turn
    y = _scan(0.0, angles, 0, size=24)
    est = estimate_center_offset(y, angles)
    assert math.isnan(est.offset) and math.isnan(center_offset_std(y, angles, est, 1e-4))
    angles = _angles("half-turn", 20)
    y = _scan(0.3, angles, 0, size=24)
    est = estimate_center_offset(y, angles)
    assert math.isfinite(est.offset) and math.isnan(center_offset_std(y, angles, est, np.nan))


@pytest.mark.parametrize("index,offset", [(0, 0.37), (1, -5.3), (2, 11.6)])
def test_binned_coarse_search_finds_the_full_searchs_estimate(monkeypatch, index, offset):
    """A wide detector's coarse search on binned rows (here 96 pixels binned by 3) lands
    where the search of every shift at full resolution does."""
    import ctuq.data.center as center

    angles = angles_180(40)
    y = _scan(offset, angles, index, size=96)
    monkeypatch.setattr(center, "COARSE_WIDTH", 10**6)
    full = estimate_center_offset(y, angles)
    monkeypatch.setattr(center, "COARSE_WIDTH", 32)
    binned = estimate_center_offset(y, angles)
    assert binned.info["shifts"].size < full.info["shifts"].size / 2
    assert binned.offset == pytest.approx(full.offset, abs=0.01)
    assert binned.confidence == pytest.approx(full.confidence, abs=0.03)
    assert abs(binned.offset - offset) < 0.5
