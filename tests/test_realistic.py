"""The realistic simulation condition: finer grid, other projector, hidden centre of
rotation, photon counts with flats and darks (ctuq.data.realistic.simulate_realistic)."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from ctuq.data import phantoms
from ctuq.data.operators import RayTransform, system_matrix
from ctuq.data.realistic import (downsample, incident_counts, line_integral_variance,
                                 line_integrals_from_counts, photon_counts, project_fine,
                                 realistic_case, simulate_realistic)
from ctuq.data.splits import NOISE_BASE, SEED_BASE, SEEDS_PER_SPLIT, Case
from ctuq.errors import InputError


# -- photon counts ---------------------------------------------------------------------
@pytest.mark.parametrize("I0", [1e3, 1e4, 1e5])
def test_counts_are_poisson_at_each_dose(I0):
    """Flats, darks and projections of a scan have Poisson means and variances."""
    d = 5.0
    scan = simulate_realistic("ellipses", 16, 60, I0=I0, seed=int(I0), n_flats=4000,
                              n_darks=4000, dark_counts=d, read_noise=0.0, phantom_seed=2)
    flat_rate = incident_counts(I0, scan.geometry.n_detector, 0.1) + d
    k = len(scan.flats)
    # per detector pixel: mean within 4 standard errors, variance/mean within 4 sd (~9 %)
    z = (scan.flats.mean(0) - flat_rate) / np.sqrt(flat_rate / k)
    assert np.abs(z).max() < 4.5
    np.testing.assert_allclose(scan.flats.var(0, ddof=1) / flat_rate, 1, atol=4 * np.sqrt(2 / k))
    assert scan.darks.mean() == pytest.approx(d, rel=0.01)
    assert scan.darks.var(ddof=1) == pytest.approx(d, rel=0.03)
    # projections: one count per ray; standardised by the exact rate they are N(0, 1)
    rate = incident_counts(I0, scan.geometry.n_detector, 0.1) * np.exp(-scan.clean) + d
    z = (scan.projections - rate) / np.sqrt(rate)
    assert abs(z.mean()) < 4 / np.sqrt(z.size)
    assert z.var() == pytest.approx(1.0, abs=4 * np.sqrt(2 / z.size))
    assert scan.hidden["n_clamped"] == 0


def test_dark_current_and_read_noise_add_their_variance():
    rng = np.random.default_rng(3)
    p = np.linspace(0, 2.5, 8)
    proj, flats, darks = photon_counts(np.broadcast_to(p, (5000, 8)), 2e3, n_flats=5000,
                                       n_darks=5000, dark_counts=10, read_noise=3,
                                       beam_profile=0.0, rng=rng)
    lam = 2e3 * np.exp(-p) + 10
    np.testing.assert_allclose(proj.mean(0), lam, rtol=0.01)
    # Poisson + Poisson + Gaussian, rounded: var = lam + 9 + 1/12
    np.testing.assert_allclose(proj.var(0), lam + 9 + 1 / 12, rtol=0.1)
    assert darks.var() == pytest.approx(10 + 9 + 1 / 12, rel=0.05)
    assert np.all(proj == np.rint(proj)) and proj.min() >= 0


def test_line_integral_noise_is_larger_on_dense_rays():
    """Var y ≈ 1/counts (delta method), checked by 800 repeated scans of one object."""
    scan = simulate_realistic("shepp", 16, 12, I0=1e4, seed=5, max_line_integral=2.5)
    rng = np.random.default_rng(11)
    ys = np.stack([line_integrals_from_counts(*photon_counts(scan.clean, 1e4, rng=rng))
                   for _ in range(800)])
    emp = ys.var(0, ddof=1)
    counts = incident_counts(1e4, scan.geometry.n_detector, 0.1) * np.exp(-scan.clean)
    pred = line_integral_variance(scan.clean, 1e4)
    # bins of rays by expected counts, lightest attenuation last
    edges = np.quantile(counts, [0, 0.25, 0.5, 0.75, 1])
    ratios_counts, ratios_delta, means = [], [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (counts >= lo) & (counts <= hi)
        ratios_counts.append(emp[sel].mean() / (1 / counts[sel]).mean())
        ratios_delta.append(emp[sel].mean() / pred[sel].mean())
        means.append(emp[sel].mean())
    np.testing.assert_allclose(ratios_counts, 1, atol=0.15)     # var ∝ 1/counts
    np.testing.assert_allclose(ratios_delta, 1, atol=0.06)      # the full delta method
    assert means[0] > 5 * means[-1]                             # dense rays: far noisier
    assert scan.hidden["noise_std_rms"] == pytest.approx(np.sqrt(emp.mean()), rel=0.06)


# -- off-grid projection ---------------------------------------------------------------
@pytest.mark.parametrize("family", ["shepp", "ellipses", "rectangles", "digits"])
def test_discretisation_error_is_small_but_not_zero(family):
    """Strip projector on the 4× grid vs ctuq's linear projector of the coarse truth.

    Measured (32², 40 angles, seed 4): 1–5 % relative error in the L2 norm.
    """
    scan = simulate_realistic(family, 32, 40, center_offset=None, phantom_seed=4, seed=4)
    ours = RayTransform(scan.geometry).A(torch.from_numpy(scan.truth)).double().numpy()
    rel = np.linalg.norm(scan.clean - ours) / np.linalg.norm(ours)
    assert 1e-3 < rel < 0.1, rel
    # the same object on the coarse grid with the same strip projector: the grid
    # alone accounts for part of the difference
    coarse, _ = project_fine(scan.truth, scan.geometry, projector="strip")
    assert np.linalg.norm(coarse - scan.clean) > 1e-3 * np.linalg.norm(ours)


@pytest.mark.parametrize("pixel_size", [0.5, 2.0])
def test_truth_is_in_the_units_of_the_reconstruction(pixel_size):
    """With pixel_size in mm the truth is in 1/mm: ctuq's A(truth) matches the data."""
    scan = simulate_realistic("ellipses", 24, 30, center_offset=None, pixel_size=pixel_size,
                              seed=2, phantom_seed=2)
    assert scan.geometry.pixel_size == pixel_size
    ours = RayTransform(scan.geometry).A(torch.from_numpy(scan.truth)).double().numpy()
    assert np.linalg.norm(scan.clean - ours) < 0.05 * np.linalg.norm(ours)
    assert scan.clean.max() == pytest.approx(2.5)
    ref = simulate_realistic("ellipses", 24, 30, center_offset=None, seed=2, phantom_seed=2)
    np.testing.assert_allclose(scan.truth * pixel_size, ref.truth, rtol=1e-5, atol=1e-7)


def test_fine_rendering_is_the_same_object():
    """4× and 8× finer drawings, averaged down to 32², agree (the area average they
    converge to), far better than a drawing at 32² or another seed does."""
    for name in ("shepp", "ellipses", "rectangles", "shepp-variant", "digits", "natural"):
        norm = lambda x: x / x.max()  # noqa: E731
        fine4, how = phantoms.render_phantom(name, 128, 7)
        fine8, _ = phantoms.render_phantom(name, 256, 7)
        a, b = norm(downsample(fine4, 4)), norm(downsample(fine8, 8))
        err = np.abs(a - b).mean()
        assert err < 0.02, (name, err)
        if name != "shepp":
            other = norm(downsample(phantoms.render_phantom(name, 128, 8)[0], 4))
            assert np.abs(a - other).mean() > 5 * err
        assert how == ("raster" if name in ("digits", "natural") else "analytic")


def test_analytic_shepp_matches_scikit_image_raster():
    from skimage.data import shepp_logan_phantom

    ours, ref = phantoms.shepp_logan_analytic(400), shepp_logan_phantom()
    assert (np.abs(ours - ref) > 0.05).mean() < 0.01


# -- the hidden centre of rotation -----------------------------------------------------
def test_hidden_center_offset_follows_the_geometry_convention():
    """Least squares with the true offset fits the data best (and not with its negative)."""
    scan = simulate_realistic("shepp-variant", 24, 60, I0=1e5, center_offset=0.4, seed=2,
                              phantom_seed=3)
    assert scan.geometry.center_offset == 0 and scan.hidden["center_offset"] == 0.4
    y = scan.line_integrals.reshape(-1)
    misfit = {}
    for c in (-0.4, -0.2, 0.0, 0.2, 0.4, 0.6):
        A = system_matrix(dataclasses.replace(scan.geometry, center_offset=c)).toarray()
        x, *_ = np.linalg.lstsq(A.astype(np.float64), y, rcond=None)
        misfit[c] = float(np.linalg.norm(A @ x - y))
    assert min(misfit, key=misfit.get) == 0.4, misfit
    assert misfit[0.0] > 1.5 * misfit[0.4] and misfit[-0.4] > misfit[0.0]


def test_random_center_offset_is_seeded_and_within_half_a_pixel():
    offs = [simulate_realistic("ellipses", 16, 8, seed=s).hidden["center_offset"]
            for s in range(6)]
    assert all(-0.5 <= o <= 0.5 for o in offs) and len(set(offs)) == 6
    again = simulate_realistic("ellipses", 16, 8, seed=3)
    assert again.hidden["center_offset"] == offs[3]


# -- split / family / seed discipline --------------------------------------------------
def test_realistic_case_seeds_are_disjoint_across_splits():
    seen = {}
    for split in ("tuning", "validation", "test"):
        sino, truth, hidden = realistic_case(split, "ellipses", 3, 16, 10, I0=1e4)
        case = Case(split, "ellipses", 3, 16)
        assert hidden["noise_seed"] == case.noise_seed(0)
        assert NOISE_BASE[split] <= hidden["noise_seed"] < NOISE_BASE[split] + 10_000_000
        assert SEED_BASE[split] <= hidden["phantom_seed"] < SEED_BASE[split] + SEEDS_PER_SPLIT
        assert hidden["case"] == f"{split}/ellipses/3"
        # what ctuq is given: nominal geometry, no noise level
        assert sino.geometry.center_offset == 0
        assert "noise_std" not in sino.meta and "noise_level" not in sino.meta
        assert sino.noise_std is None
        np.testing.assert_array_equal(sino.ground_truth, truth)
        seen[split] = (truth, sino.data, hidden["center_offset"])
    for a, b in (("tuning", "validation"), ("validation", "test"), ("tuning", "test")):
        assert not np.array_equal(seen[a][0], seen[b][0])
        assert seen[a][2] != seen[b][2]
    # deterministic: the same case twice is the same scan
    sino, truth, hidden = realistic_case("validation", "ellipses", 3, 16, 10, I0=1e4)
    np.testing.assert_array_equal(sino.data, seen["validation"][1])
    # repeats of a case differ in their noise only
    s2, t2, h2 = realistic_case("validation", "ellipses", 3, 16, 10, I0=1e4, seed=1)
    np.testing.assert_array_equal(t2, truth)
    assert not np.array_equal(s2.data, sino.data)


def test_realistic_case_refuses_what_the_split_forbids():
    with pytest.raises(InputError, match="family"):
        realistic_case("tuning", "natural", 0, 16, 8)
    with pytest.raises(InputError, match="seed"):
        realistic_case("test", "ellipses", 0, 16, 8, phantom_seed=3)


@pytest.mark.parametrize("kwargs, field", [
    ({"I0": 0}, "I0"), ({"I0": float("nan")}, "I0"), ({"upsample": 0}, "upsample"),
    ({"center_offset": "left"}, "center_offset"), ({"projector": "fourier"}, "projector"),
    ({"max_line_integral": -1}, "max_line_integral"), ({"n_flats": 0}, "n_flats")])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(InputError) as err:
        simulate_realistic("ellipses", 16, 8, **kwargs)
    assert err.value.field == field


def test_low_dose_clamps_and_says_so():
    scan = simulate_realistic("ellipses", 16, 20, I0=30, dark_counts=20, read_noise=3,
                              max_line_integral=4, seed=1, phantom_seed=1)
    assert scan.hidden["n_clamped"] > 0
    assert np.all(np.isfinite(scan.line_integrals))


def test_fan_beam_strip_uses_detector_sub_pixels():
    scan = simulate_realistic("ellipses", 16, 24, beam="fan", center_offset=None, seed=1)
    assert "sub-pixels" in scan.hidden["astra_projector"]
    ours = RayTransform(scan.geometry).A(torch.from_numpy(scan.truth)).double().numpy()
    rel = np.linalg.norm(scan.clean - ours) / np.linalg.norm(ours)
    assert 1e-3 < rel < 0.1, rel


# -- the file ------------------------------------------------------------------------------
def test_nxtomo_round_trip_of_the_raw_frames(tmp_path):
    import h5py

    from ctuq.data.io import read_sinogram

    scan = simulate_realistic("rectangles", 16, 12, I0=1e4, seed=9, phantom_seed=9)
    path = scan.write(tmp_path / "scan.nxs")
    with h5py.File(path, "r") as f:
        det = f["entry/instrument/detector"]
        frames, key = det["data"][()].astype(np.float64), det["image_key"][()]
        assert det["data"].attrs["quantity"] == "intensity"
        hidden = json.loads(f["entry/sample/ground_truth"].attrs["simulation"])
    assert sorted(np.unique(key)) == [0, 1, 2]
    I, F, D = frames[key == 0], frames[key == 1].mean(0), frames[key == 2].mean(0)
    direct = -np.log((I - D) / (F - D))
    for raw in (True, None):
        sino = read_sinogram(path, raw=raw)
        np.testing.assert_allclose(sino.data, direct, rtol=1e-6, atol=1e-6)
        assert sino.geometry == scan.geometry          # angles, detector; no offset
        np.testing.assert_array_equal(sino.ground_truth, scan.truth)
        assert sino.noise_std is None and "noise_level" not in sino.meta
        assert sino.meta["n_flats"] == 20 and sino.meta["n_darks"] == 10
        assert sino.meta["center_offset"] == scan.sinogram().meta["center_offset"] == "auto"
    assert hidden == json.loads(json.dumps(scan.hidden))
    np.testing.assert_allclose(sino.data, scan.sinogram().data, rtol=1e-6, atol=1e-6)
    with pytest.raises(InputError) as err:       # counts are not line integrals
        read_sinogram(path, raw=False)
    assert err.value.field == "raw"


def test_writer_frames_of_a_stack_of_slices(tmp_path):
    """Raw frames of a two-slice stack, [frames, slices, detector], read back per slice."""
    from ctuq.data.io import Sinogram, read_sinogram, write_sinogram

    scans = [simulate_realistic("ellipses", 16, 8, seed=s, phantom_seed=s) for s in (1, 2)]
    stack = Sinogram(np.stack([s.line_integrals for s in scans]), scans[0].geometry,
                     ground_truth=np.stack([s.truth for s in scans]))
    frames = {k: np.stack([getattr(s, k) for s in scans], axis=1)
              for k in ("projections", "flats", "darks")}
    path = write_sinogram(tmp_path / "stack.nxs", stack, frames=frames)
    back = read_sinogram(path)
    assert back.shape == (2, 8, scans[0].geometry.n_detector)
    for i, s in enumerate(scans):
        np.testing.assert_allclose(back.data[i], s.line_integrals, rtol=1e-6, atol=1e-6)


def test_writer_refuses_frames_of_the_wrong_shape(tmp_path):
    from ctuq.data.io import write_sinogram

    scan = simulate_realistic("ellipses", 16, 8, seed=1)
    sino = scan.sinogram()
    bad = {"projections": scan.projections[:-1], "flats": scan.flats}
    with pytest.raises(InputError, match="projections"):
        write_sinogram(tmp_path / "a.nxs", sino, frames=bad)
    with pytest.raises(InputError, match="flats"):
        write_sinogram(tmp_path / "a.nxs", sino, frames={"projections": scan.projections})
    with pytest.raises(InputError, match="darks"):
        write_sinogram(tmp_path / "a.nxs", sino, frames={
            "projections": scan.projections, "flats": scan.flats, "darks": -scan.darks})
    assert not (tmp_path / "a.nxs").exists()
