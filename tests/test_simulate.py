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


# -- ctuq simulate --counts: the realistic scan through the command line --------------
def _cli(*args, cwd):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "COLUMNS": "120",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "ctuq.app.cli", *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    return p.returncode, p.stdout, p.stderr


def test_cli_simulate_counts_then_info(tmp_path):
    import json

    import h5py
    import numpy as np

    from ctuq.data.io import read_sinogram

    out = tmp_path / "scan.nxs"
    rc, _, err = _cli("simulate", out, "--phantom", "ellipses", "--size", "16", "--angles", "12",
                      "--counts", "1e4", "--upsample", "2", "--center-error", "0.3",
                      "--seed", "4", cwd=tmp_path)
    assert rc == 0, err
    rc, stdout, err = _cli("info", out, cwd=tmp_path)
    assert rc == 0, err
    assert "n flats" in stdout and "noise" not in stdout.lower()
    sino = read_sinogram(out)
    assert sino.meta["flat_dark_corrected"] and sino.noise_std is None
    assert sino.geometry.center_offset == 0 and sino.ground_truth.shape == (16, 16)
    with h5py.File(out, "r") as f:
        hidden = json.loads(f["entry/sample/ground_truth"].attrs["simulation"])
        keys = f["entry/instrument/detector/image_key"][()]
    assert hidden["center_offset"] == 0.3 and hidden["I0"] == 1e4 and hidden["upsample"] == 2
    assert np.sum(keys == 0) == 12 and np.sum(keys == 1) == 20 and np.sum(keys == 2) == 10


@pytest.mark.parametrize("args, option", [
    (["x.npz", "--counts", "1e4"], "OUT"),
    (["x.nxs", "--upsample", "2"], "--upsample"),
    (["x.nxs", "--counts", "0"], "--counts"),
    (["x.nxs", "--counts", "1e4", "--center-error", "left"], "--center-error"),
])
def test_cli_simulate_counts_usage_errors(tmp_path, monkeypatch, capsys, args, option):
    from ctuq.app.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["simulate", *args, "--size", "16", "--angles", "8"]) == 2
    err = capsys.readouterr().err
    assert option in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())
