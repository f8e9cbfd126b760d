import math

import numpy as np
import pytest

from ctuq.data.geometry import Geometry
from ctuq.errors import InputError


def test_parallel_defaults_cover_the_diagonal():
    g = Geometry.parallel(64, 30)
    assert g.range_shape == (30, math.ceil(64 * math.sqrt(2)))
    assert g.detector_width >= 64 * math.sqrt(2)
    # cell-midpoint angles over [0, pi)
    np.testing.assert_allclose(g.angles, (np.arange(30) + 0.5) * np.pi / 30)


def test_fan_defaults_see_the_whole_image():
    g = Geometry.fan(32, 40, pixel_size=0.5)
    assert g.beam == "fan" and g.magnification == pytest.approx(2.0)
    assert g.detector_width >= g._detector_width_for_radius(g.image_radius) - 1e-9


@pytest.mark.parametrize("g", [Geometry.parallel((24, 32), 7, pixel_size=0.3),
                               Geometry.fan(20, 13, source_origin=100.0, origin_detector=50.0)])
@pytest.mark.parametrize("n_angles", [7, 60, 360])
def test_dict_round_trip(g, n_angles):
    g = Geometry.parallel(g.image_shape, n_angles) if g.beam == "parallel" else Geometry.fan(
        g.image_shape, n_angles, source_origin=g.source_origin, origin_detector=g.origin_detector)
    back = Geometry.from_dict(g.to_dict())
    assert back == g and hash(back) == hash(g) and back.fingerprint == g.fingerprint


def test_distinct_geometries_differ():
    a, b = Geometry.parallel(32, 20), Geometry.parallel(32, 21)
    assert a != b and a.fingerprint != b.fingerprint
    assert Geometry.parallel(32, 20, pixel_size=2) != a


@pytest.mark.parametrize("kwargs, field", [
    (dict(image_shape=(32, 32), angles=[], n_detector=50), "angles"),
    (dict(image_shape=(32, 32), angles=[0.1, np.nan], n_detector=50), "angles"),
    (dict(image_shape=(32, 32), angles=[0.1, 0.1], n_detector=50), "angles"),
    (dict(image_shape=(32, 32), angles=[0.1, np.inf], n_detector=50), "angles"),
    (dict(image_shape=(32,), angles=[0.1], n_detector=50), "image_shape"),
    (dict(image_shape=(0, 32), angles=[0.1], n_detector=50), "image_shape"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=0), "n_detector"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=2.5), "n_detector"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=10), "n_detector"),  # too small
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=50, pixel_size=-1), "pixel_size"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=50, pixel_size=np.nan), "pixel_size"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=50, detector_spacing=0), "detector_spacing"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=50, beam="cone"), "beam"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=50, beam="fan"), "source_origin"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=200, beam="fan", source_origin=10.0,
          origin_detector=10.0), "source_origin"),  # source inside the image
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=200, beam="fan", source_origin=100.0,
          origin_detector=-1.0), "origin_detector"),
    (dict(image_shape=(32, 32), angles=[0.1], n_detector=50, source_origin=100.0), "source_origin"),
])
def test_invalid_geometry_raises_input_error_naming_the_field(kwargs, field):
    with pytest.raises(InputError) as info:
        Geometry(**kwargs)
    assert info.value.field == field
    assert field in str(info.value)


def test_from_dict_errors_name_the_field():
    with pytest.raises(InputError, match="angles_deg"):
        Geometry.from_dict({"image_shape": [8, 8], "n_detector": 12})
    with pytest.raises(InputError, match="colour"):
        Geometry.from_dict({**Geometry.parallel(8, 3).to_dict(), "colour": 1})
