"""Angle options on the command line: the README's own-data command (issue: it failed
with "angle_first and angle_last need n_angles") and the count checked against the data."""

from __future__ import annotations

import numpy as np
import pytest

from ctuq.app._cli_options import parse_settings
from ctuq.app.cli import main
from ctuq.data.io import read_sinogram
from ctuq.errors import InputError

README_FLAGS = ["--angle-first", "0", "--angle-last", "179", "--angle-unit", "deg",
                "--image-size", "256", "--pixel-size", "0.1", "--center-offset", "-1.5"]


def _flags_to_settings(flags):
    """The README flags as typer hands them to parse_settings."""
    names = {"--angle-first": float, "--angle-last": float, "--angle-unit": str,
             "--image-size": str, "--pixel-size": float, "--center-offset": float}
    pairs = dict(zip(flags[::2], flags[1::2]))
    return {f"geometry__{k[2:].replace('-', '_')}": names[k](v) for k, v in pairs.items()}


@pytest.fixture
def sino(tmp_path):
    path = tmp_path / "sino.npy"
    np.save(path, np.random.default_rng(0).random((180, 260)).astype(np.float32))
    return path


def test_readme_own_data_flags_take_the_count_from_the_data(sino, capsys):
    settings = parse_settings(_flags_to_settings(README_FLAGS))     # raised before
    s = read_sinogram(sino, **settings["geometry"])
    np.testing.assert_allclose(s.geometry.angles_deg, np.arange(180.0), atol=1e-9)
    assert s.geometry.image_shape == (256, 256) and s.geometry.center_offset == -1.5
    # the same flags on the command line (info reads exactly as reconstruct does)
    assert main(["info", str(sino), *README_FLAGS]) == 0, capsys.readouterr().err


def test_angle_ends_without_a_count_span_the_rows(tmp_path):
    np.save(tmp_path / "s.npy", np.ones((5, 9), np.float32))
    s = read_sinogram(tmp_path / "s.npy", angle_first=10, angle_last=50)
    np.testing.assert_allclose(s.geometry.angles_deg, [10, 20, 30, 40, 50], atol=1e-9)
    s = read_sinogram(tmp_path / "s.npy", angle_first=0, angle_last=1, angle_unit="rad")
    np.testing.assert_allclose(s.geometry.angles, np.linspace(0, 1, 5))
    with pytest.raises(InputError, match="every angle the same"):
        read_sinogram(tmp_path / "s.npy", angle_first=3, angle_last=3)


def test_angle_ends_that_contradict_the_files_angles_are_an_error(tmp_path):
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram, write_sinogram

    g = Geometry((8, 8), np.deg2rad(np.arange(5) * 30.0), 9)
    path = write_sinogram(tmp_path / "s.nxs", Sinogram(np.ones((5, 9), np.float32), g))
    assert np.allclose(read_sinogram(path, angle_first=0, angle_last=120).geometry.angles_deg,
                       np.arange(5) * 30.0)
    with pytest.raises(InputError, match="contradictory.*from 0 to 179"):
        read_sinogram(path, angle_first=0, angle_last=179)


@pytest.mark.parametrize("extra", [[], ["--angle-first", "0", "--angle-last", "179"]])
def test_a_count_that_differs_from_the_rows_names_both(sino, capsys, extra):
    assert main(["info", str(sino), "--n-angles", "179", *extra]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "n_angles=179" in err and "180 projection rows" in err, err
