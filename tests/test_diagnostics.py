"""Data-consistency diagnostics: right scans pass, wrong models of the scan are flagged.

32² off-grid simulations (4× rendering, ASTRA ``strip``), a field-filling
head phantom, 5 % noise, TV fits (300 iterations) with the right and with
wrong geometries.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from _offgrid import angles_180, offgrid_sinogram
from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.splits import Case
from ctuq.errors import InputError
from ctuq.recon.baselines import tv_reconstruction
from ctuq.recon.diagnostics import (ANGLE_THRESHOLD_FACTOR, MISFIT_THRESHOLD,
                                    check_angle_unit, data_consistency,
                                    misregistration_variance, radians_given_as_degrees,
                                    whitened_residual)

N, N_ANGLES, N_DET, NOISE = 32, 40, 68, 0.05


@functools.lru_cache(maxsize=None)
def _fit(case: str, index: int = 0):
    """Simulate a scan, reconstruct with the (possibly wrong) geometry, return the verdict."""
    angles = angles_180(N_ANGLES)
    truth = Case("validation", "shepp-variant", 60 + index, 4 * N).image()
    data_offset = 5.0 if case == "centre" else 0.0
    data_pixel = 1.5 if case == "pixel" else 1.0
    clean = offgrid_sinogram(truth, N, angles, n_detector=N_DET, center_offset=data_offset,
                             pixel_size=data_pixel)
    sigma = NOISE * np.abs(clean).mean()
    y = clean + sigma * np.random.default_rng(index).standard_normal(clean.shape)
    # the reconstruction's geometry: the file says centre 0, pixel 1 mm, and for "unit"
    # the radian values were read as degrees
    fit_angles = np.deg2rad(angles) if case == "unit" else angles
    op = RayTransform(Geometry.parallel(N, angles=fit_angles, n_detector=N_DET))
    x = tv_reconstruction(torch.from_numpy(y).float(), op, noise_std=sigma, iterations=300)
    with torch.no_grad():
        fwd = op.A(x).numpy()
    return data_consistency(y, fwd, sigma**2), y, fwd, sigma


@pytest.mark.parametrize("index", [0, 1])
def test_right_scan_is_ok(index):
    m, *_ = _fit("right", index)
    assert m.verdict == "ok", m.reason
    assert 0.5 < m.chi2_dof < m.threshold


@pytest.mark.parametrize("case", ["centre", "unit", "pixel"])
def test_wrong_geometry_is_a_misfit(case):
    m, *_ = _fit(case)
    right, *_ = _fit("right")
    assert m.chi2_dof > 2 * right.chi2_dof
    if case == "pixel":
        # a wrong pixel size in parallel beam is mostly a scale change of the image,
        # which explains the data: the check is not required to flag it
        # (docs/consistency.md); only the coarser sampling raises χ² here
        return
    assert m.verdict == "misfit", m.reason
    assert m.chi2_dof > m.threshold and "worst angles" in m.reason


def test_one_corrupt_projection_is_found_by_angle():
    m, y, fwd, sigma = _fit("right")
    y = y.copy()   # _fit's result is cached
    # 1.5× the per-angle threshold's amplitude on one row: its χ² ≈ 2.25 × 4t
    amp = 1.5 * math.sqrt(ANGLE_THRESHOLD_FACTOR * MISFIT_THRESHOLD)
    y[17] += amp * sigma * np.sign(np.random.default_rng(3).standard_normal(N_DET))
    bad = data_consistency(y, fwd, sigma**2)
    assert bad.verdict == "misfit" and bad.worst_angles[0] == 17
    assert bad.chi2_dof < bad.threshold     # the overall χ² alone would have passed it


def test_chi2_of_pure_noise_with_dof_and_per_ray_variance():
    gen = np.random.default_rng(0)
    var = gen.uniform(0.5, 4.0, size=(30, 50))
    y = np.sqrt(var) * gen.standard_normal((30, 50))
    m = data_consistency(y, np.zeros_like(y), var)
    assert m.chi2_dof == pytest.approx(1, abs=0.06) and m.ok
    assert m.per_angle.shape == (30,) and m.per_angle.mean() == pytest.approx(m.chi2_dof)
    # γ̂ effective parameters lower the dof: χ²/dof scales by m / (m − γ̂)
    g = data_consistency(y, np.zeros_like(y), var, effective_parameters=500)
    assert g.chi2_dof == pytest.approx(m.chi2_dof * 1500 / 1000)
    # a wrong (4× too small) variance is a misfit at threshold 2
    assert not data_consistency(y, np.zeros_like(y), var / 4, threshold=2.0).ok
    # scalar and constant array agree; tensors are accepted
    a = whitened_residual(y, np.zeros_like(y), 2.0)
    b = whitened_residual(torch.from_numpy(y), torch.zeros(30, 50), np.full((30, 1), 2.0))
    np.testing.assert_allclose(a, b)


def test_bad_input():
    with pytest.raises(InputError) as err:
        whitened_residual(np.zeros((3, 4)), np.zeros((3, 5)), 1.0)
    assert err.value.field == "forward"
    with pytest.raises(InputError) as err:
        whitened_residual(np.zeros((3, 4)), np.zeros((3, 4)), 0.0)
    assert err.value.field == "noise_variance"
    with pytest.raises(InputError) as err:
        data_consistency(np.zeros((3, 4)), np.zeros((3, 4)), 1.0, effective_parameters=12)
    assert err.value.field == "effective_parameters"


def test_angle_unit_checks():
    rad = angles_180(60)
    assert "look like radians" in check_angle_unit(rad, "deg")
    assert radians_given_as_degrees(rad, "degrees") is not None
    assert check_angle_unit(np.rad2deg(rad), "deg") is None
    assert check_angle_unit(rad, "rad") is None
    assert "look like degrees" in check_angle_unit(np.rad2deg(rad), "rad")
    assert radians_given_as_degrees(np.rad2deg(rad), "rad") is None
    assert check_angle_unit(rad[:3], "deg") is None            # too few to tell
    assert check_angle_unit(np.linspace(0, 2 * math.pi, 10), "deg") is not None
    assert check_angle_unit(np.linspace(0, 10, 10), "deg") is None


def test_misregistration_variance_explains_a_sub_pixel_shift():
    """A sinogram shifted by δ px along the detector differs from the unshifted one by
    ≈ δ·slope: with the variance σ² + (δ·slope)² its χ²/dof is ≈ 1 or less, without it
    far above; a 2-px shift stays far above even with the tolerance."""
    u = np.arange(80, dtype=np.float64)
    rows = np.array([np.exp(-0.5 * ((u - 40 - 3 * np.sin(a)) / 6.0) ** 2)
                     for a in np.linspace(0, np.pi, 30, endpoint=False)])
    sigma = 1e-3
    noise = sigma * np.random.default_rng(0).standard_normal(rows.shape)
    for shift, ok in ((0.25, True), (2.0, False)):
        y = np.array([np.interp(u - shift, u, r) for r in rows]) + noise
        var = sigma ** 2 + misregistration_variance(rows, 0.25)
        with_tol = data_consistency(y, rows, var, threshold=5.0)
        without = data_consistency(y, rows, sigma ** 2, threshold=5.0)
        assert without.chi2_dof > 50
        assert with_tol.ok is ok, with_tol.reason
    # the slope: central differences along the detector; zero tolerance, zero variance
    np.testing.assert_allclose(misregistration_variance(rows, 0.5),
                               (0.5 * np.gradient(rows, axis=1)) ** 2)
    assert not misregistration_variance(rows, 0.0).any()
    with pytest.raises(InputError) as err:
        misregistration_variance(rows, -1.0)
    assert err.value.field == "misregistration"
