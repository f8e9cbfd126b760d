"""The axis and angle convention (issue 22 item 1), checked against the tools themselves.

Sinograms made by ASTRA's own projectors (parallel ``linear``, fan-beam
``line_fanflat``) and by scikit-image's ``radon`` from an asymmetric
phantom are written as a user of those tools would write them (NXtomo,
DXchange, plain HDF5, .npy, TIFF), read back and reconstructed; the image
must come out in the orientation of the truth: correlation > 0.95 as it is,
and clearly higher than for any of the seven flipped or rotated truths.
"""

from __future__ import annotations

import astra
import h5py
import numpy as np
import pytest
import tifffile
import torch

from ctuq.data.geometry import Geometry
from ctuq.data.io import Sinogram, read_sinogram, write_sinogram
from ctuq.data.operators import RayTransform
from ctuq.recon.baselines import fbp_reconstruction

N = 32               # image side
N_ANGLES = 60
N_DET = 48
FAN = dict(source_origin=80.0, origin_detector=40.0, det_width=1.5, n_det=64)
FORMATS = ("nxtomo", "dxchange", "hdf5", "npy", "tiff")


def phantom(n: int = N) -> np.ndarray:
    """Smooth and asymmetric: no flip or rotation maps it onto itself."""
    r, c = np.mgrid[:n, :n] / n
    img = (1.0 * np.exp(-((r - 0.25) ** 2 + (c - 0.35) ** 2) / 0.004)      # top left blob
           + 0.6 * np.exp(-((r - 0.62) ** 2 + (c - 0.72) ** 2) / 0.012)    # lower right
           + 0.8 * np.exp(-((r - 0.70) ** 2) / 0.002 - ((c - 0.30) ** 2) / 0.02))  # bar
    disc = (r - 0.5 + 0.5 / n) ** 2 + (c - 0.5 + 0.5 / n) ** 2 < 0.45 ** 2
    return (img * disc).astype(np.float32)


def dihedral(img):
    """The image and its 7 flipped/rotated versions, the identity first."""
    out = []
    for flip in (False, True):
        base = img.T if flip else img
        for k in range(4):
            out.append(np.rot90(base, k))
    return out


def orientation_scores(rec, truth):
    return [float(np.corrcoef(rec.ravel(), t.ravel())[0, 1]) for t in dihedral(truth)]


def assert_upright(rec, truth, min_corr=0.95, margin=0.1):
    scores = orientation_scores(np.asarray(rec), truth)
    assert scores[0] > min_corr, scores
    assert scores[0] > max(scores[1:]) + margin, scores


THETA = np.linspace(0, np.pi, N_ANGLES, endpoint=False)
THETA_FAN = np.linspace(0, 2 * np.pi, N_ANGLES, endpoint=False)


def astra_parallel(x, theta=THETA, n_det=N_DET):
    vol = astra.create_vol_geom(*x.shape)
    proj = astra.create_proj_geom("parallel", 1.0, n_det, theta)
    pid = astra.create_projector("linear", proj, vol)
    sid, sino = astra.create_sino(x, pid)
    astra.data2d.delete(sid)
    return sino, (vol, proj, pid)


def astra_fan(x, theta=THETA_FAN):
    vol = astra.create_vol_geom(*x.shape)
    proj = astra.create_proj_geom("fanflat", FAN["det_width"], FAN["n_det"], theta,
                                  FAN["source_origin"], FAN["origin_detector"])
    pid = astra.create_projector("line_fanflat", proj, vol)
    sid, sino = astra.create_sino(x, pid)
    astra.data2d.delete(sid)
    return sino


def astra_fbp(sino, handles):
    vol, proj, pid = handles
    sid = astra.data2d.create("-sino", proj, sino)
    rid = astra.data2d.create("-vol", vol)
    cfg = astra.astra_dict("FBP")
    cfg.update(ReconstructionDataId=rid, ProjectionDataId=sid, ProjectorId=pid)
    alg = astra.algorithm.create(cfg)
    astra.algorithm.run(alg)
    rec = astra.data2d.get(rid)
    for i in (sid, rid):
        astra.data2d.delete(i)
    astra.algorithm.delete(alg)
    return rec


def write_as_user(path, fmt, sino, angles_deg, *, fan=False, spacing=1.0, layout_radon=False):
    """Write a sinogram [angles, det] (or radon's [det, angles]) the way users do.

    Returns the read options the file needs (what is not in the file).
    """
    opts = {}
    if fan and fmt != "nxtomo":
        opts.update(beam="fan", source_origin=FAN["source_origin"],
                    origin_detector=FAN["origin_detector"], detector_spacing=spacing)
    if fmt == "nxtomo":
        with h5py.File(path, "w") as h:
            det = h.create_group("entry/instrument/detector")
            det["data"] = sino[:, None, :] if not layout_radon else sino  # [angles, rows, det]
            det["x_pixel_size"] = spacing
            det["x_pixel_size"].attrs["units"] = "mm"
            h["entry/sample/rotation_angle"] = angles_deg
            h["entry/sample/rotation_angle"].attrs["units"] = "degree"
            if fan:
                h["entry/instrument/source/distance"] = -FAN["source_origin"]
                h["entry/instrument/source/distance"].attrs["units"] = "mm"
                det["distance"] = FAN["origin_detector"]
                det["distance"].attrs["units"] = "mm"
    elif fmt == "dxchange":
        with h5py.File(path, "w") as h:
            h["exchange/data"] = sino[:, None, :]                           # [angles, rows, det]
            h["exchange/theta"] = angles_deg
            h["exchange/theta"].attrs["units"] = "degrees"
    else:
        if fmt == "hdf5":
            with h5py.File(path, "w") as h:
                h["sino"] = sino
        elif fmt == "npy":
            np.save(path, sino)
        else:
            tifffile.imwrite(path, sino)
        opts["angles"] = list(angles_deg)
    if fmt == "dxchange" and fan:
        pass  # DXchange has no fan-beam fields: the options above carry them
    return opts


pytestmark = pytest.mark.usefixtures("one_thread")

SUFFIX = {"nxtomo": ".nxs", "dxchange": ".h5", "hdf5": ".h5", "npy": ".npy", "tiff": ".tif"}


@pytest.fixture(scope="module")
def truth():
    return phantom()


def test_ctuq_forward_equals_astra_parallel_and_fan(truth):
    """ctuq's A of the truth reproduces ASTRA's own sinograms (no rotation, no flip)."""
    par, _ = astra_parallel(truth)
    g = Geometry((N, N), THETA, N_DET)
    ours = RayTransform(g, backend="matrix").A(torch.from_numpy(truth)).numpy()
    np.testing.assert_allclose(ours, par, rtol=0, atol=2e-5 * par.max())
    fan = astra_fan(truth)
    gf = Geometry((N, N), THETA_FAN, FAN["n_det"], detector_spacing=FAN["det_width"],
                  beam="fan", source_origin=FAN["source_origin"],
                  origin_detector=FAN["origin_detector"])
    for backend in ("matrix", "astra"):
        ours = RayTransform(gf, backend=backend).A(torch.from_numpy(truth)).numpy()
        np.testing.assert_allclose(ours, fan, rtol=0, atol=5e-5 * fan.max())


def test_center_offset_is_tomopys_center_minus_half_the_detector(truth):
    """A detector shifted as tomopy's ASTRA wrapper shifts it (``geom_postalignment``)."""
    from ctuq.data.conventions import center_offset_from_tomopy

    center = N_DET / 2 + 3.5          # tomopy's centre of rotation
    vol = astra.create_vol_geom(N, N)
    proj = astra.geom_postalignment(astra.create_proj_geom("parallel", 1.0, N_DET, THETA),
                                    -(center - N_DET / 2))
    pid = astra.create_projector("linear", proj, vol)
    _, sino = astra.create_sino(truth, pid)
    g = Geometry((N, N), THETA, N_DET, center_offset=center_offset_from_tomopy(center, N_DET))
    ours = RayTransform(g, backend="astra").A(torch.from_numpy(truth)).numpy()
    np.testing.assert_allclose(ours, sino, rtol=0, atol=2e-5 * sino.max())
    rec = fbp_reconstruction(torch.from_numpy(sino), RayTransform(g)).numpy()
    assert_upright(rec, truth)
    # ignoring the offset blurs the image: the offset is what makes it sharp
    plain = fbp_reconstruction(torch.from_numpy(sino),
                               RayTransform(Geometry((N, N), THETA, N_DET))).numpy()
    assert orientation_scores(plain, truth)[0] < orientation_scores(rec, truth)[0] - 0.05


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled"])
def test_any_angle_order(truth, order):
    """Descending and unordered angles give the same image (issue 25 item 7)."""
    perm = {"ascending": np.arange(N_ANGLES), "descending": np.arange(N_ANGLES)[::-1],
            "shuffled": np.random.default_rng(3).permutation(N_ANGLES)}[order]
    sino, _ = astra_parallel(truth, THETA[perm])
    op = RayTransform(Geometry((N, N), THETA[perm], N_DET))
    rec = fbp_reconstruction(torch.from_numpy(sino), op).numpy()
    ref = fbp_reconstruction(*(lambda s: (torch.from_numpy(s), RayTransform(
        Geometry((N, N), THETA, N_DET))))(astra_parallel(truth)[0])).numpy()
    np.testing.assert_allclose(rec, ref, atol=1e-4 * np.abs(ref).max())
    assert_upright(rec, truth)


def test_fbp_agrees_with_astras_own_fbp(truth):
    sino, handles = astra_parallel(truth)
    theirs = astra_fbp(sino, handles)
    ours = fbp_reconstruction(torch.from_numpy(sino),
                              RayTransform(Geometry((N, N), THETA, N_DET))).numpy()
    assert orientation_scores(ours, theirs)[0] > 0.99
    assert_upright(theirs, truth)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("beam", ["parallel", "fan"])
def test_astra_sinogram_through_every_reader_reconstructs_upright(tmp_path, truth, fmt, beam):
    if beam == "parallel":
        sino, _ = astra_parallel(truth)
        angles, spacing = np.rad2deg(THETA), 1.0
    else:
        sino = astra_fan(truth)
        angles, spacing = np.rad2deg(THETA_FAN), FAN["det_width"]
    path = tmp_path / f"sino{SUFFIX[fmt]}"
    opts = write_as_user(path, fmt, sino.astype(np.float32), angles, fan=beam == "fan",
                         spacing=spacing)
    s = read_sinogram(path, image_size=N, pixel_size=1.0, **opts)
    if s.is_stack:  # NXtomo and DXchange hold projections [angles, rows, det]: one row
        assert s.n_slices == 1
        s = s.slice(0)
    assert s.geometry.beam == beam and s.data.shape == sino.shape
    rec = fbp_reconstruction(torch.from_numpy(s.data), RayTransform(s.geometry)).numpy()
    assert_upright(rec, truth)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("circle", [True, False])
def test_skimage_radon_through_every_reader_reconstructs_upright(tmp_path, truth, fmt, circle):
    from skimage.transform import radon

    theta = np.linspace(0.0, 180.0, N_ANGLES, endpoint=False)
    rad = radon(truth.astype(np.float64), theta, circle=circle).astype(np.float32)
    path = tmp_path / f"sk{SUFFIX[fmt]}"
    if fmt in ("nxtomo", "dxchange"):   # these fix [angle, detector]: the user transposes
        opts = write_as_user(path, fmt, np.ascontiguousarray(rad.T), theta)
    else:
        opts = write_as_user(path, fmt, rad, theta)
    s = read_sinogram(path, convention="skimage", image_size=N, **opts)
    s = s.slice(0) if s.is_stack else s
    assert s.data.shape == (N_ANGLES, rad.shape[0])
    assert s.geometry.image_offset == (-0.5, -0.5)
    ours = RayTransform(s.geometry).A(torch.from_numpy(truth)).numpy()
    assert np.corrcoef(ours.ravel(), s.data.ravel())[0, 1] > 0.999  # same physics
    rec = fbp_reconstruction(torch.from_numpy(s.data), RayTransform(s.geometry)).numpy()
    assert_upright(rec, truth)
    # the adapter in the API gives the same sinogram
    api = Sinogram.from_skimage(rad, theta, circle=circle)
    assert api.geometry == s.geometry and np.array_equal(api.data, s.data)


def test_skimage_centre_matters(truth):
    """Without scikit-image's half-pixel centre the projections disagree."""
    from skimage.transform import radon

    theta = np.linspace(0.0, 180.0, N_ANGLES, endpoint=False)
    rad = radon(truth.astype(np.float64), theta, circle=False)
    s = Sinogram.from_skimage(rad, theta, circle=False)
    ours = RayTransform(s.geometry).A(torch.from_numpy(truth)).numpy()
    naive = RayTransform(Geometry((N, N), np.deg2rad(theta), rad.shape[0])).A(
        torch.from_numpy(truth)).numpy()
    err = np.abs(ours - s.data).max()
    assert err < 0.3 * np.abs(naive - s.data).max()
    back, th = s.to_skimage()
    np.testing.assert_array_equal(back, rad.astype(np.float32))
    np.testing.assert_allclose(th, theta)


def test_simulated_file_stores_an_upright_truth(tmp_path):
    """ctuq's own files: the truth is stored as given, the sinogram is ASTRA's of it."""
    from ctuq.data.simulate import simulate_sinogram

    truth = phantom()
    g = Geometry.parallel(N, N_ANGLES)
    y, _ = simulate_sinogram(truth, RayTransform(g), noise_level=0.0)
    path = write_sinogram(tmp_path / "sim.nxs", Sinogram(y.numpy(), g, ground_truth=truth))
    s = read_sinogram(path)
    np.testing.assert_array_equal(s.ground_truth, truth)
    theirs, _ = astra_parallel(truth, g.angles, g.n_detector)
    np.testing.assert_allclose(s.data, theirs, rtol=0, atol=2e-5 * theirs.max())
    rec = fbp_reconstruction(torch.from_numpy(s.data), RayTransform(s.geometry)).numpy()
    assert_upright(rec, s.ground_truth)


TINY = {"preset": "reference-28",
        "dip": {"iterations": 150},
        "uncertainty": {"em_steps": 1, "n_samples": 2, "predictive_samples": 4,
                        "stored_samples": 0, "predcp": False, "preconditioner_rank": 8,
                        "cg_max_iter": 30}}


def _pipeline_case(tmp_path, truth, fmt, beam):
    import ctuq

    if beam == "parallel":
        sino, _ = astra_parallel(truth)
        angles, spacing = np.rad2deg(THETA), 1.0
    elif beam == "fan":
        sino = astra_fan(truth)
        angles, spacing = np.rad2deg(THETA_FAN), FAN["det_width"]
    path = tmp_path / f"p{SUFFIX[fmt]}"
    opts = write_as_user(path, fmt, sino.astype(np.float32), angles, fan=beam == "fan",
                         spacing=spacing)
    s = read_sinogram(path, image_size=N, pixel_size=1.0, **opts)
    s = s.slice(0) if s.is_stack else s
    s.meta["noise_std"] = 0.01 * float(np.abs(s.data).mean())
    result = ctuq.reconstruct(s, ctuq.ReconstructionConfig.from_dict(TINY))
    assert_upright(result.reconstruction, truth)
    assert_upright(result.fbp, truth)


@pytest.mark.parametrize("fmt, beam", [("nxtomo", "parallel"), ("nxtomo", "fan"),
                                       ("npy", "parallel")])
def test_full_pipeline_reconstructs_upright(tmp_path, truth, fmt, beam):
    _pipeline_case(tmp_path, truth, fmt, beam)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("beam", ["parallel", "fan"])
def test_full_pipeline_every_reader(tmp_path, truth, fmt, beam):
    _pipeline_case(tmp_path, truth, fmt, beam)


def test_n_angles_alone_are_skimages_angles_from_zero(tmp_path, truth):
    """``--convention skimage --n-angles N`` on a bare ``radon`` output (the README's
    recipe): the angles are scikit-image's ``linspace(0, 180, N, endpoint=False)``, so
    the FBP is upright and fits better than with the cell-midpoint angles
    (``(i + 0.5) * 180 / N``), which rotate it by half a step."""
    from skimage.transform import radon

    from ctuq.app._cli_options import parse_settings

    n = 30                                # few angles: half a step is 3 degrees
    theta = np.linspace(0.0, 180.0, n, endpoint=False)
    rad = radon(truth.astype(np.float64), theta, circle=True).astype(np.float32)
    np.save(tmp_path / "radon.npy", rad)
    opts = parse_settings({"geometry__n_angles": n, "read__convention": "skimage"})
    s = read_sinogram(tmp_path / "radon.npy", **opts["read"], **opts["geometry"])
    np.testing.assert_allclose(s.geometry.angles_deg, theta, atol=1e-9)

    def fit(geometry):
        rec = fbp_reconstruction(torch.from_numpy(s.data), RayTransform(geometry)).numpy()
        return float(np.corrcoef(rec.ravel(), truth.ravel())[0, 1])

    mid = Geometry(s.geometry.image_shape, (np.arange(n) + 0.5) * np.pi / n,
                   s.geometry.n_detector, center_offset=s.geometry.center_offset,
                   image_offset=s.geometry.image_offset)
    new, old = fit(s.geometry), fit(mid)
    assert new > 0.95 and new > old + 0.005, (new, old)
    assert_upright(fbp_reconstruction(torch.from_numpy(s.data),
                                      RayTransform(s.geometry)).numpy(), truth)


def test_n_angles_alone_fan_beam_starts_at_zero(tmp_path):
    np.save(tmp_path / "fan.npy", np.ones((8, 20), np.float32))
    s = read_sinogram(tmp_path / "fan.npy", n_angles=8, beam="fan", source_origin=50.0,
                      origin_detector=20.0)
    np.testing.assert_allclose(s.geometry.angles_deg, np.arange(8) * 45.0, atol=1e-9)
