"""Centre-of-rotation estimates on off-grid simulated parallel-beam scans."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from _offgrid import angles_180, offgrid_sinogram
from ctuq.data.center import estimate_center_offset
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
