"""The data scale (ctuq.recon.scaling): reconstructions of c·y are c times those of y.

Metamorphic tests on a 16² digit, few iterations, one thread, fixed seed:
``normalize = true`` makes the pipeline's outputs homogeneous of degree 1 in
the data (variances of degree 2); integer data give their float version's
result; data whose FBP is mostly negative are refused.
"""

import numpy as np
import pytest
import torch

import ctuq
from ctuq.data.geometry import Geometry
from ctuq.data.io import Sinogram, read_result, write_sinogram
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import digits
from ctuq.data.simulate import simulate_sinogram
from ctuq.errors import InputError
from ctuq.recon.scaling import check_representable, data_scale

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")

SIZE, ANGLES = 16, 12
TINY = {"dip": {"iterations": 30},
        "uncertainty": {"em_steps": 1, "n_samples": 2, "predictive_samples": 4,
                        "stored_samples": 2, "model_error": "none"}}


@pytest.fixture(scope="module")
def scan():
    torch.set_num_threads(1)
    g = Geometry.parallel(SIZE, ANGLES)
    truth = digits(1, SIZE, seed=0)[0]
    y, sigma = simulate_sinogram(truth, RayTransform(g, backend="matrix"), 0.05, seed=1)
    return g, np.asarray(y, np.float64), float(sigma), np.asarray(truth, np.float64)


def _config(normalize=True, **changes):
    return ctuq.ReconstructionConfig(device="cpu", backend="matrix", seed=0, threads=1,
                                     normalize=normalize, **{**TINY, **changes})


def _run(scan, c, known=True, **changes):
    g, y, sigma, truth = scan
    meta = {"noise_std": sigma * c} if known else {}
    sino = Sinogram((y * c).astype(np.float32), g, meta=meta,
                    ground_truth=(truth * c).astype(np.float32))
    return ctuq.reconstruct(sino, _config(**changes))


def _rel(a, b, c):
    """‖a − c·b‖ / ‖c·b‖, in float64 divided by c (no underflow at c = 1e-30)."""
    a, b = np.asarray(a, np.float64) / c, np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def base(scan):
    return _run(scan, 1.0)


def test_data_scale_is_homogeneous_of_degree_one(scan):
    g, y, _, _ = scan
    op = RayTransform(g, backend="matrix")
    s1 = data_scale(torch.as_tensor(y, dtype=torch.float32), op)
    assert s1 > 0
    for c in (1e-30, 1e-6, 1e-3, 7.0, 1e3, 1e6, 1e30):
        sc = data_scale(torch.as_tensor(y * c, dtype=torch.float32), op)
        assert sc / c == pytest.approx(s1, rel=1e-5), c


# Powers of two: c·y, its scale and c·y / s(c·y) are exact in floating point, so the
# whole run is the unscaled one's to the bit and every output must come back exactly
# c times (a wrong unit anywhere is off by a power of c). Any other c rounds the data
# (c·y in float32, 1 ulp), and the DIP fit amplifies a last-bit change of the data as
# it amplifies another thread count's: see test_other_factors_differ_as_a_last_bit_change.
POWERS_OF_TWO = [2.0**-20, 2.0**-10, 2.0**10, 2.0**20]      # 9.5e-7 … 1.05e6
EXACT = 1e-6


@pytest.mark.parametrize("c", POWERS_OF_TWO)
def test_reconstruction_of_scaled_data_is_scaled(scan, base, c):
    r = _run(scan, c)
    assert _rel(r.reconstruction, base.reconstruction, c) < EXACT
    assert _rel(r.std, base.std, c) < EXACT
    assert _rel(r.posterior_std, base.posterior_std, c) < EXACT
    assert _rel(r.variance, base.variance, c**2) < EXACT
    assert _rel(r.fbp, base.fbp, c) < EXACT and _rel(r.dip, base.dip, c) < EXACT
    assert _rel(r.samples, base.samples, c) < EXACT
    assert _rel(r.posterior.sample(3, seed=5), base.posterior.sample(3, seed=5), c) < EXACT
    region = (slice(4, 10), slice(4, 10))
    assert r.posterior.region_std(region, seed=3) / c == pytest.approx(
        base.posterior.region_std(region, seed=3), rel=EXACT)
    # reported in data units, the scale recorded
    assert r.config["data_scale"] / c == pytest.approx(base.config["data_scale"], rel=EXACT)
    assert r.config["noise_std"] / c == pytest.approx(base.config["noise_std"], rel=EXACT)
    assert r.hyperparameters["sigma2"] / c**2 == pytest.approx(
        base.hyperparameters["sigma2"], rel=EXACT)
    # the metrics compare with the truth in data units: PSNR does not see the unit
    assert r.metrics["psnr"] == pytest.approx(base.metrics["psnr"], abs=1e-4)
    assert r.metrics["coverage_2sigma"] == base.metrics["coverage_2sigma"]


def test_other_factors_differ_as_a_last_bit_change(scan, base):
    """c = 1e-3 rounds c·y: the result is c times that of data 1 ulp away from y.
    The 30-iteration fit keeps its image to 1 % either way; the posterior std moves
    by a few percent, as much as a relative change of 1e-6 in y moves it unscaled."""
    c = 1e-3
    g, y, sigma, truth = scan
    r = _run(scan, c)
    assert _rel(r.reconstruction, base.reconstruction, c) < 0.01
    assert r.config["data_scale"] / c == pytest.approx(base.config["data_scale"], rel=1e-5)
    nudged = _run((g, y * (1 + 1e-6 * np.random.default_rng(0).standard_normal(y.shape)),
                   sigma, truth), 1.0)
    control = _rel(nudged.std, base.std, 1.0)
    assert _rel(r.std, base.std, c) < max(0.01, 3 * control)


def test_tiny_data_are_scaled_not_flattened(scan, base):
    c = 2.0**-100                                        # 7.9e-31
    r = _run(scan, c)
    assert _rel(r.reconstruction, base.reconstruction, c) < EXACT
    assert _rel(r.std, base.std, c) < EXACT


def test_unknown_noise_and_a_fixed_tv_weight_scale_too(scan):
    c = 1024.0
    a = _run(scan, 1.0, known=False, dip={"iterations": 30, "tv_weight": 0.2})
    b = _run(scan, c, known=False, dip={"iterations": 30, "tv_weight": 0.2 * c})
    assert _rel(b.reconstruction, a.reconstruction, c) < EXACT
    assert _rel(b.std, a.std, c) < EXACT
    assert b.config["noise_std"] / c == pytest.approx(a.config["noise_std"], rel=1e-4)
    # the effective config shows the tv_weight as given, in data units
    assert b.config["dip"]["tv_weight"] == pytest.approx(0.2 * c)


def test_normalize_off_is_todays_pipeline(scan):
    """Off: the problem is the data as given (no scale anywhere in the record)."""
    r = _run(scan, 1.0, normalize=False)
    assert "data_scale" not in r.config and "data_scale" not in r.hyperparameters


def test_a_scaled_result_file_records_the_scale(scan, base, tmp_path):
    from ctuq.data.io import write_result

    write_result(tmp_path / "r.h5", base)
    back = read_result(tmp_path / "r.h5")
    assert back.config["data_scale"] == pytest.approx(base.config["data_scale"])


def test_integer_line_integrals_give_their_float_result(scan):
    g, y, sigma, _ = scan
    counts = np.round(y * 300).astype(np.int16)        # values in the hundreds
    cfg = _config()
    ri = ctuq.reconstruct(counts, cfg, geometry=g)
    rf = ctuq.reconstruct(counts.astype(np.float32), cfg, geometry=g)
    np.testing.assert_array_equal(ri.reconstruction, rf.reconstruction)
    np.testing.assert_array_equal(ri.std, rf.std)
    assert any("int16" in w for w in ri.diagnostics["warnings"])
    assert not any("int16" in w for w in rf.diagnostics["warnings"])
    assert ri.reconstruction.max() > 50                 # not a constant near 1
    for dtype in (np.int64, np.uint8):
        s = Sinogram(np.clip(np.round(y * 50), 0, 255).astype(dtype), g)
        assert s.meta["source_dtype"] == np.dtype(dtype).name and s.data.dtype == np.float32


def test_integer_file_is_noted(scan, tmp_path):
    from ctuq.data.io import read_sinogram

    g, y, _, _ = scan
    path = tmp_path / "counts.npy"
    np.save(path, np.round(y * 300).astype(np.int16))
    sino = read_sinogram(path, angles=np.degrees(g.angles), image_size=SIZE)
    assert sino.meta["source_dtype"] == "int16" and sino.data.dtype == np.float32
    r = ctuq.reconstruct(sino, _config())
    assert any("int16" in w and "float" in w for w in r.diagnostics["warnings"])


def test_negated_line_integrals_are_refused(scan, tmp_path):
    g, y, sigma, _ = scan
    with pytest.raises(InputError) as err:
        ctuq.reconstruct(Sinogram((-y).astype(np.float32), g), _config())
    assert err.value.field == "sinogram" and "negative" in str(err.value)
    assert "-log" in str(err.value)
    # also with normalize off: no sigmoid output fits them at any scale
    with pytest.raises(InputError):
        ctuq.reconstruct(Sinogram((-y).astype(np.float32), g), _config(normalize=False))
    # through a file: the file is named
    path = tmp_path / "negated.h5"
    write_sinogram(path, Sinogram((-y).astype(np.float32), g))
    with pytest.raises(InputError) as err:
        ctuq.reconstruct_file(path, tmp_path / "out.h5", _config())
    assert err.value.field == "sinogram" and "negated.h5" in str(err.value)
    assert not (tmp_path / "out.h5").exists()


def test_a_few_negative_rays_only_warn(scan):
    g, y, sigma, _ = scan
    op = RayTransform(g, backend="matrix")
    noisy = y + np.random.default_rng(0).normal(0, 3 * sigma, y.shape)
    assert (noisy < 0).any()
    check_representable(torch.as_tensor(noisy, dtype=torch.float32), op)   # no error
    with pytest.raises(InputError):
        check_representable(torch.as_tensor(-noisy, dtype=torch.float32), op)


def test_cli_reconstructs_scaled_data_scaled(scan, base, tmp_path):
    from ctuq.app.cli import main

    g, y, sigma, truth = scan
    c = 2.0**-10
    write_sinogram(tmp_path / "scan.h5", Sinogram((y * c).astype(np.float32), g,
                                                  meta={"noise_std": sigma * c},
                                                  ground_truth=(truth * c).astype(np.float32)))
    (tmp_path / "c.toml").write_text(
        'device = "cpu"\nbackend = "matrix"\nthreads = 1\nnormalize = true\n'
        "[dip]\niterations = 30\n[uncertainty]\nem_steps = 1\nn_samples = 2\n"
        'predictive_samples = 4\nstored_samples = 2\nmodel_error = "none"\n')
    assert main(["reconstruct", str(tmp_path / "scan.h5"), "--out", str(tmp_path / "o"),
                 "--config", str(tmp_path / "c.toml")]) == 0
    r = read_result(next((tmp_path / "o").glob("*.h5")))
    assert _rel(r.reconstruction, base.reconstruction, c) < EXACT
    assert _rel(r.std, base.std, c) < EXACT
    assert r.config["data_scale"] / c == pytest.approx(base.config["data_scale"], rel=1e-5)


def test_count_noise_model_scales_with_the_data(scan, base):
    """Per-ray variances (the count noise model) are in data units squared: c·y with
    c²·v gives c·x̂ and c·std, and the weighting is that of the unscaled data."""
    g, y, sigma, truth = scan
    rng = np.random.default_rng(0)
    var = (sigma ** 2 * rng.uniform(0.5, 2.0, y.shape)).astype(np.float32)

    def run(c):
        sino = Sinogram((y * c).astype(np.float32), g, ground_truth=(truth * c).astype(
            np.float32), variance=(var * c ** 2).astype(np.float32))
        return ctuq.reconstruct(sino, _config(noise_model="counts"))

    c = 1024.0
    one, big = run(1.0), run(c)
    assert one.config["noise_model"] == "counts"
    assert _rel(big.reconstruction, one.reconstruction, c) < EXACT
    assert _rel(big.std, one.std, c) < EXACT
    assert big.config["noise_std"] == pytest.approx(c * one.config["noise_std"], rel=EXACT)
    # the per-ray weights change the fit: not the scalar model's result
    assert _rel(one.reconstruction, base.reconstruction, 1.0) > 1e-4
