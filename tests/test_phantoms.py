import numpy as np
import pytest

from ctuq.data import phantoms
from ctuq.errors import InputError


@pytest.mark.parametrize("name", ["ellipses", "rectangles", "digits", "shepp-variant", "natural"])
def test_reproducible_from_seed_and_seed_matters(name):
    a = phantoms.make_phantom(name, 32, seed=3)
    b = phantoms.make_phantom(name, 32, seed=3)
    c = phantoms.make_phantom(name, 32, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("name", phantoms.PHANTOMS)
@pytest.mark.parametrize("size", [16, 33])
def test_shape_range_dtype(name, size):
    img = phantoms.make_phantom(name, size, seed=1)
    assert img.shape == (size, size) and img.dtype == np.float32
    assert img.min() >= 0 and img.max() <= 1 and img.max() > 0.1


def test_digits_have_a_margin_and_labels():
    imgs, labels = phantoms.digits(5, 28, seed=0, return_labels=True)
    assert imgs.shape == (5, 28, 28) and labels.shape == (5,)
    assert np.all(labels >= 0) and np.all(labels <= 9)
    assert imgs[:, :2].max() == 0 and imgs[:, :, -2:].max() == 0  # MNIST-like frame


def test_ellipses_stay_inside_the_disc():
    img = phantoms.ellipses(64, seed=2)
    c = (np.arange(64) + 0.5) / 64 * 2 - 1
    r2 = c[:, None] ** 2 + c[None, :] ** 2
    assert img[r2 > 1].max() == 0


def test_bad_name_and_size():
    with pytest.raises(InputError, match="phantom"):
        phantoms.make_phantom("cat", 32)
    with pytest.raises(InputError, match="size"):
        phantoms.shepp_logan(2)


def test_digit_is_the_indexed_digit_of_the_seed_0_order():
    np.testing.assert_array_equal(phantoms.digit(6, 28), phantoms.digits(7, 28, seed=0)[6])
    with pytest.raises(InputError, match="index"):
        phantoms.digit(1797)


def test_shepp_variant_keeps_the_head_inside_the_field_of_view():
    c = (np.arange(64) + 0.5) / 64 * 2 - 1
    r2 = c[:, None] ** 2 + c[None, :] ** 2
    for seed in range(5):
        img = phantoms.shepp_variant(64, seed)
        assert img[r2 > 1.1].max() == 0 and (img > 0).mean() > 0.15
