"""``ctuq info`` in words: the geometry described, nothing printed as None or as a repr."""

from __future__ import annotations

import numpy as np
import pytest

from ctuq.app.cli import main
from ctuq.data.geometry import Geometry
from ctuq.data.io import Result, Sinogram, write_result, write_sinogram


def _info(path, capsys) -> str:
    capsys.readouterr()
    assert main(["info", str(path)]) == 0
    return capsys.readouterr().out


def _unwrapped(text: str) -> str:
    """The table's cells joined into one line per row (wrapping undone)."""
    return " ".join(text.replace("│", " ").split())


@pytest.fixture
def geometry():
    return Geometry((12, 12), np.deg2rad(np.arange(20) * 9.0), 18, pixel_size=0.5,
                    detector_spacing=0.5, center_offset=-1.5)


def test_sinogram_info_describes_the_geometry(tmp_path, capsys, geometry):
    path = write_sinogram(tmp_path / "s.nxs", Sinogram(np.ones((20, 18), np.float32), geometry))
    text = _unwrapped(_info(path, capsys))
    assert "Geometry(" not in text and "None" not in text
    assert "parallel beam" in text
    assert "20 angles from 0° to 171°, every 9° (covering 180°)" in text
    assert "12 × 12 pixels of 0.5 mm (6 × 6 mm)" in text
    assert "18 pixels of 0.5 mm" in text
    assert "1.5 detector pixels left of the detector centre" in text


def test_raw_frames_without_a_centre_say_it_will_be_estimated(tmp_path, capsys):
    from ctuq.data.realistic import simulate_realistic

    path = simulate_realistic("ellipses", 16, 12, seed=1, phantom_seed=1).write(
        tmp_path / "raw.nxs")
    text = _unwrapped(_info(path, capsys))
    assert "centre of rotation not given: estimated from the data when reconstructed" in text
    assert "detector centre (offset 0)" not in text and "center offset" not in text


def test_irregular_angles_say_so():
    from ctuq.app._cli_output import describe_angles

    assert describe_angles([0, 1, 5, 6]).startswith("4 angles from 0° to 6°, ascending, "
                                                    "irregular: steps 1° to 4°")
    assert describe_angles([30.0]) == "1 angle, 30°"


def test_single_layer_export_shows_no_none(tmp_path, capsys, geometry):
    """What napari's export of one layer writes: one image, no input, device or seed."""
    std = np.full((12, 12), 0.1, np.float32)
    path = write_result(tmp_path / "std.h5", Result(std=std, geometry=geometry))
    text = _unwrapped(_info(path, capsys))
    assert "None" not in text and "on None" not in text and "input" not in text
    assert "total std: 12 × 12 pixels" in text and "20 angles from 0° to 171°" in text


def test_result_info_names_an_image_that_is_not_the_dip_output(tmp_path, capsys, geometry):
    img = np.ones((12, 12), np.float32)
    config = {"uncertainty": {"method": "laplace", "model_error": "heldout",
                              "laplace": {"mean": "linear-heldout"}},
              "model_error": {"t0": 1.0, "s1": 0.5, "info": {"step_length": 0.4321}}}
    r = Result(reconstruction=img, std=img, geometry=geometry, config=config)
    text = _unwrapped(_info(write_result(tmp_path / "r.h5", r), capsys))
    assert "DIP output + the linear model's step (linear-heldout, length 0.43)" in text
    config["uncertainty"]["laplace"]["mean"] = "dip"
    r = Result(reconstruction=img, std=img, geometry=geometry, config=config)
    assert "linear model's step" not in _unwrapped(
        _info(write_result(tmp_path / "d.h5", r), capsys))


def test_result_info_explains_the_fit(tmp_path, capsys, geometry):
    img = np.ones((12, 12), np.float32)
    r = Result(reconstruction=img, std=img * 0.5, posterior_std=img * 0.3,
               model_error_std=img * 0.4, geometry=geometry, units="1/mm", seed=3,
               device="cpu", input_path="/data/scan.nxs", input_sha256="ab" * 32,
               hyperparameters={"a_b": [0.5], "sigma2": 0.01, "noise_learned": True,
                                "em_steps": 4, "converged": False, "gamma_total": 123.0},
               metrics={"psnr": 30.0, "coverage_1sigma": 0.7, "coverage_2sigma": 0.95,
                        "coverage_3sigma": 0.99})
    text = _unwrapped(_info(write_result(tmp_path / "r.h5", r), capsys))
    assert "converged False" not in text and "None" not in text
    assert "4 EM steps (the em_steps limit" in text
    assert "0.5 1/mm total (posterior 0.3, model error 0.4)" in text
    assert "on cpu" in text and "seed 3" in text and "/data/scan.nxs (sha256 abab" in text
    assert "70.0 / 95.0 / 99.0 %" in text and "PSNR 30 dB" in text
    rows = [ln for ln in _info(tmp_path / "r.h5", capsys).splitlines() if ln.startswith("│ ")
            and not ln.startswith("│  ")]
    assert len(rows) <= 25, rows
