import pytest
import torch

from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import shepp_logan
from ctuq.data.simulate import simulate_sinogram
from ctuq.errors import InputError


@pytest.fixture(scope="module")
def op():
    return RayTransform(Geometry.parallel(32, 60))


def test_gaussian_noise_level_and_seed(op):
    x = shepp_logan(32)
    y1, s1 = simulate_sinogram(x, op, 0.05, seed=7)
    y2, s2 = simulate_sinogram(x, op, 0.05, seed=7)
    y3, _ = simulate_sinogram(x, op, 0.05, seed=8)
    clean = op.A(torch.from_numpy(x))
    torch.testing.assert_close(y1, y2)
    assert not torch.equal(y1, y3)
    assert s1 == pytest.approx(0.05 * float(clean.abs().mean()))
    assert float((y1 - clean).std()) == pytest.approx(s1, rel=0.05)


def test_poisson_noise_grows_as_dose_falls(op):
    x = shepp_logan(32)
    clean = op.A(torch.from_numpy(x))
    errs = []
    for photons in (1e3, 1e5):
        y, sigma = simulate_sinogram(x, op, noise="poisson", photons=photons, seed=1)
        err = float((y - clean).pow(2).mean().sqrt())
        assert err == pytest.approx(sigma, rel=0.25)
        errs.append(err)
    assert errs[0] > 5 * errs[1]


def test_bad_noise_arguments(op):
    with pytest.raises(InputError, match="noise"):
        simulate_sinogram(shepp_logan(32), op, noise="laplace")
    with pytest.raises(InputError, match="noise_level"):
        simulate_sinogram(shepp_logan(32), op, noise_level=-1)
